"""Learned topic structure trie: EMQX emqx_ds_lts eunit examples, MQTT matching, persistence."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seglog.errors import (
    CorruptFrame,
    CorruptLTS,
    InvalidArgument,
    InvalidTopic,
    InvalidTopicFilter,
    StorageError,
)
from seglog.topics import LTS, topic_matches, varying_matches

# EMQX's eunit tests use `fun(0) -> 1000; (_) -> T end`.
T2 = [1000, 2]
T3 = [1000, 3]
T4 = [1000, 4]


def key(lts: LTS, *levels: object) -> tuple[int, list[str]]:
    """Learns a topic given as EMQX-style levels (ints become decimal tokens).

    Mirrors EMQX's test_key: learning is idempotent and lookup agrees afterwards.
    """
    topic = "/".join(str(level) for level in levels)
    first = lts.learn(topic)
    assert lts.learn(topic) == first
    assert lts.lookup(topic) == first
    return first


def matched(lts: LTS, *levels: object) -> set[tuple[int, tuple[str | None, ...]]]:
    return {(s, tuple(vf)) for s, vf in lts.match("/".join(str(level) for level in levels))}


# --- EMQX eunit worked examples (emqx_ds_lts.erl) ----------------------------------------


def test_wildcard_lookup() -> None:
    # EMQX: wildcard_lookup_test (trie built by hand there: foo -> '+' -> foo -> EOT).
    lts = LTS([1000, 0, 1000])
    s, varying = lts.learn("foo/x/foo")
    assert varying == ["x"]
    assert lts.structure(s) == ("foo", "+", "foo")
    assert lts.lookup("foo/bar/foo") == (s, ["bar"])
    assert lts.lookup("foo/quux/foo") == (s, ["quux"])
    assert lts.lookup("foo") is None
    assert lts.lookup("foo/bar") is None
    assert lts.lookup("foo/bar/bar") is None
    assert lts.lookup("bar/foo/foo") is None
    s10, _ = lts.learn("foo")
    assert lts.lookup("foo") == (s10, [])


def test_topic_key() -> None:
    # EMQX: topic_key_test, Threshold = 4.
    lts = LTS(T4)
    threshold = 4
    for i in range(1, 11):
        assert key(lts, i, 99999, 999999, 99999)[1] == []
    for i in range(1, 101):
        _, varying = key(lts, 1, i, 1)
        if i < threshold:
            assert varying == []
        else:
            assert varying == [str(i)]
    # Doesn't affect the 2nd level under a different prefix:
    assert key(lts, 2, 1, 1)[1] == []
    assert key(lts, 2, 10, 1)[1] == []
    # Nothing was rewritten retroactively:
    assert key(lts, 1, 1, 1)[1] == []
    assert key(lts, 1, 2, 1)[1] == []
    # Another level of '+' (EMQX's "TODO: off by 1" case: 1/+/1 had no children yet, so
    # tokens 1..4 become static and the 4th also inserts '+'):
    for i in range(1, 101):
        _, varying = key(lts, 1, 42, 1, i, 42)
        if i <= threshold:
            assert varying == ["42"]
        else:
            assert varying == ["42", str(i)]


def _topic_match_trie() -> tuple[LTS, dict[str, int]]:
    lts = LTS(T2)
    s: dict[str, int] = {}
    for name, levels, varying in [
        ("S1", (1,), []),
        ("S11", (1, 1), []),
        ("S12", (1, 2), []),
        ("S111", (1, 1, 1), []),
        ("S11e", (1, 1, ""), []),
        ("S21", (2, 1), []),
        ("S22", (2, 2), []),
        ("S2_", (2, 3), ["3"]),
        ("S2_11", (2, 3, 1, 1), ["3"]),
        ("S2_12", (2, 4, 1, 2), ["4"]),
        ("S2_1_", (2, 3, 1, 3), ["3", "3"]),
    ]:
        stream, got = key(lts, *levels)
        assert got == varying, name
        s[name] = stream
    return lts, s


def test_topic_match() -> None:
    # EMQX: topic_match_test, Threshold = 2.
    lts, s = _topic_match_trie()
    assert len(set(s.values())) == len(s)
    # Concrete topics:
    assert matched(lts, 1) == {(s["S1"], ())}
    assert matched(lts, 1, 1) == {(s["S11"], ())}
    assert matched(lts, 1, 1, 1) == {(s["S111"], ())}
    # '+':
    assert matched(lts, 1, "+") == {(s["S11"], ()), (s["S12"], ())}
    assert matched(lts, 1, "+", 1) == {(s["S111"], ())}
    assert matched(lts, 1, "+", "") == {(s["S11e"], ())}
    # '#':
    assert matched(lts, 1, "#") == {(s[n], ()) for n in ("S1", "S11", "S12", "S111", "S11e")}
    assert matched(lts, 1, 1, "#") == {(s[n], ()) for n in ("S11", "S111", "S11e")}
    # Learned wildcards:
    assert matched(lts, 2, 2) == {(s["S22"], ()), (s["S2_"], ("2",))}
    assert matched(lts, 2, "+") == {(s["S22"], ()), (s["S21"], ()), (s["S2_"], (None,))}
    assert matched(lts, 2, "#") == {
        (s["S21"], ()),
        (s["S22"], ()),
        (s["S2_"], (None,)),
        (s["S2_11"], (None,)),
        (s["S2_12"], (None,)),
        (s["S2_1_"], (None, None)),
    }


def test_rlookup() -> None:
    # EMQX: rlookup_test, including "survives dump and restore".
    lts, s = _topic_match_trie()
    expected = {
        "S1": ("1",),
        "S11": ("1", "1"),
        "S12": ("1", "2"),
        "S111": ("1", "1", "1"),
        "S11e": ("1", "1", ""),
        "S21": ("2", "1"),
        "S22": ("2", "2"),
        "S2_": ("2", "+"),
        "S2_11": ("2", "+", "1", "1"),
        "S2_12": ("2", "+", "1", "2"),
        "S2_1_": ("2", "+", "1", "+"),
    }
    for name, structure in expected.items():
        assert lts.structure(s[name]) == structure, name
    restored = LTS.from_bytes(lts.to_bytes())
    for name, structure in expected.items():
        assert restored.structure(s[name]) == structure, name


def test_updated_topics() -> None:
    # EMQX: updated_topics_test, Threshold = 2: a new stream appears exactly when EMQX
    # emits a new rlookup entry.
    lts = LTS(T2)
    key(lts, 1)
    assert [lts.structure(i) for i in range(lts.stream_count)] == [("1",)]
    key(lts, 1)
    assert lts.stream_count == 1
    key(lts, 1, 1)
    assert lts.structure(lts.stream_count - 1) == ("1", "1")
    key(lts, 1, 2)
    assert lts.structure(lts.stream_count - 1) == ("1", "2")
    key(lts, 1, 3)  # upgrade to wildcard
    assert lts.structure(lts.stream_count - 1) == ("1", "+")
    before = lts.stream_count
    key(lts, 1, 4)
    assert lts.stream_count == before


def test_n_topics() -> None:
    # EMQX: n_topics_test, Threshold = 3.
    lts = LTS(T3)
    assert lts.stream_count == 0
    s11, _ = key(lts, 1, 1)
    assert key(lts, 1, 1) == (s11, [])
    assert lts.stream_count == 1
    s12, _ = key(lts, 1, 2)
    assert key(lts, 1, 2) == (s12, [])
    assert lts.stream_count == 2
    key(lts, 1, 3)
    assert lts.stream_count == 3
    s1_, varying = key(lts, 1, 4)
    assert varying == ["4"]
    assert lts.stream_count == 4
    for i in (5, 6, 7):
        assert key(lts, 1, i) == (s1_, [str(i)])
    assert lts.stream_count == 4
    assert len(lts) == 4


def test_insert_wildcard_then_learn() -> None:
    # EMQX: insert_wildcard(T, ['+', pub, '+']) then [foo, pub, bar, quux] -> [foo, bar].
    # Here the wildcard structure is learned with thresholds that force '+' at depths 0, 2.
    lts = LTS([0, 1000, 0, 1000])
    s, _ = lts.learn("x/pub/y")
    assert lts.structure(s) == ("+", "pub", "+")
    s2, varying = lts.learn("foo/pub/bar/quux")
    assert varying == ["foo", "bar"]
    assert lts.structure(s2) == ("+", "pub", "+", "quux")


def test_threshold_zero_subscription() -> None:
    # EMQX: emqx_ds_backends_SUITE t_21_subscription, thresholds {infinity, 0}:
    # [<<>>, <<1>>] and [<<>>, <<2>>] share a stream, [<<>>] has its own.
    lts = LTS([2**32 - 1, 0])
    a, va = lts.learn("/1")
    b, vb = lts.learn("/2")
    c, vc = lts.learn("/")
    assert a == b
    assert (va, vb) == (["1"], ["2"])
    assert c == a and vc == [""]  # "/" is ['', ''] in MQTT, so it also varies
    # EMQX's [<<>>] is the one-level topic "" which MQTT forbids; the nearest is "x".
    d, _ = lts.learn("x")
    assert d != a


def test_paths_wildcard_dump() -> None:
    # EMQX: paths_test (Threshold = 4): the wildcard paths are [4,+,4] and ['',+,''].
    # trie_dump(_, wildcard) is what a new generation inherits.
    lts = LTS(T4)
    topics = ["1", "2/2", "3/3/3", "2/3/4"]
    topics += [f"4/{i}/4" for i in range(1, 7)]
    topics += [f"/{i}/" for i in range(1, 7)]
    for topic in topics:
        lts.learn(topic)
    structures = {lts.structure(i) for i in range(lts.stream_count)}
    assert structures >= {("1",), ("2", "2"), ("3", "3", "3"), ("4", "+", "4"), ("", "+", "")}
    assert {("4", str(i), "4") for i in range(1, 5)} <= structures
    child = lts.inherit_wildcards()
    assert {child.structure(i) for i in range(child.stream_count)} == {("4", "+", "4"), ("", "+", "")}
    # The inherited '+' keeps new topics varying; statics are learned afresh.
    s, varying = child.learn("4/1/4")
    assert child.structure(s) == ("4", "+", "4") and varying == ["1"]
    assert child.learn("2/2")[1] == []


# --- threshold behaviour -------------------------------------------------------------------


def test_threshold_function() -> None:
    # EMQX threshold_fun({simple, Tuple}) = element(min(Depth + 1, size), Tuple).
    lts = LTS()
    assert lts.thresholds == (100, 10)
    assert [lts.threshold(d) for d in range(4)] == [100, 10, 10, 10]
    doc = LTS([100, 0, 100, 0, 100])  # EMQX's sensor/<clientid>/temperature/<room> example
    assert [doc.threshold(d) for d in range(7)] == [100, 0, 100, 0, 100, 100, 100]
    s, varying = doc.learn("sensor/c1/temperature/kitchen")
    assert varying == ["c1", "kitchen"]
    assert doc.structure(s) == ("sensor", "+", "temperature", "+")
    assert doc.learn("sensor/c2/temperature/hall") == (s, ["c2", "hall"])


@pytest.mark.parametrize("thr", [1, 2, 3, 10])
def test_plus_appears_exactly_at_threshold(thr: int) -> None:
    lts = LTS([1000, thr])
    for i in range(thr):
        assert lts.wildcard_edges() == []
        assert lts.learn(f"a/{i}")[1] == []
    # The thr-th static child inserted '+' eagerly (EMQX), before any topic needs it.
    assert lts.wildcard_edges() == [("a",)]
    n_streams = lts.stream_count
    s, varying = lts.learn("a/new")
    assert varying == ["new"] and lts.stream_count == n_streams + 1
    # The exact edge is still preferred: learned topics keep their stream.
    for i in range(thr):
        stream, varying = lts.learn(f"a/{i}")
        assert stream == i and varying == []
    assert lts.learn("a/other") == (s, ["other"])


def test_dollar_root_is_separate() -> None:
    lts = LTS([1, 10])
    s_sys, _ = lts.learn("$SYS/x")
    s_a, _ = lts.learn("a/x")
    # Threshold 1 at depth 0: each root grew '+' after its first token, separately.
    s_b, varying = lts.learn("b/x")
    assert varying == ["b"]
    s_other, varying = lts.learn("$other/x")
    assert varying == ["$other"]
    assert len({s_sys, s_a, s_b, s_other}) == 4
    # [MQTT-4.7.2-1]: wildcard first levels never reach '$' topics.
    assert lts.match("#") == [(s_a, []), (s_b, [None])]
    assert lts.match("+/x") == [(s_a, []), (s_b, [None])]
    assert lts.match("$SYS/+") == [(s_sys, []), (s_other, ["$SYS"])]
    assert lts.match("$other/#") == [(s_other, ["$other"])]
    assert lts.match("$nothing/x") == [(s_other, ["$nothing"])]


def test_dense_stream_ids_and_cache() -> None:
    lts = LTS([1000, 2], cache_size=3)
    topics = ["a", "b", "a/1", "a/2", "a/3", "a/4", "b", "a"]
    ids = lts.learn_many(topics)
    assert ids == [0, 1, 2, 3, 4, 4, 1, 0]
    assert lts.learn_many([]) == []
    assert sorted(set(ids)) == list(range(lts.stream_count))
    assert lts.varying_positions(4) == (1,)
    # learn_many agrees with learn even after the small cache was flushed.
    assert [lts.learn(t)[0] for t in topics] == ids


def test_invalid_topics_and_filters() -> None:
    lts = LTS()
    for bad in ["", "a/+", "a/#", "a\x00b", "\ud800"]:
        with pytest.raises(InvalidTopic):
            lts.learn(bad)
        with pytest.raises(InvalidTopic):
            lts.lookup(bad)
    with pytest.raises(InvalidTopic) as info:
        lts.learn_many(["ok", "a/+"])
    assert info.value.index == 1
    with pytest.raises(InvalidTopicFilter):
        lts.match("a/#/b")
    for thresholds in ([], [-1], [2**32], [True]):
        with pytest.raises(InvalidArgument):
            LTS(thresholds)
    with pytest.raises(InvalidArgument):
        lts.structure(99)
    with pytest.raises(InvalidArgument):
        lts.varying_positions(-1)


# --- persistence ---------------------------------------------------------------------------


def _sample() -> LTS:
    lts = LTS([3, 2, 5])
    for t in ["a/1", "a/2", "a/3", "a/x/y", "b", "c/d", "$SYS/1", "$SYS/2", "d", "é/ü", "/", "e//f"]:
        lts.learn(t)
    return lts


def test_round_trip_exact() -> None:
    lts = _sample()
    data = lts.to_bytes()
    back = LTS.from_bytes(data)
    assert back.thresholds == lts.thresholds
    assert back.stream_count == lts.stream_count and back.node_count == lts.node_count
    assert back.to_bytes() == data
    for i in range(lts.stream_count):
        assert back.structure(i) == lts.structure(i)
    for t in ["a/1", "a/9", "a/x/y", "$SYS/1", "$SYS/zz", "é/ü", "/", "e//f", "zz", "q/r"]:
        assert back.lookup(t) == lts.lookup(t)
        assert back.learn(t) == lts.learn(t)  # learning continues identically
    for f in ["#", "+/+", "a/#", "$SYS/#", "+//+"]:
        assert back.match(f) == lts.match(f)
    assert LTS.from_bytes(LTS().to_bytes()).stream_count == 0


def _reseal(body: bytes) -> bytes:
    head = b"SLTS" + bytes([1])
    return head + struct.pack("<I", zlib.crc32(body, zlib.crc32(head))) + body


def test_corrupt_bytes() -> None:
    data = _sample().to_bytes()
    bad = [
        b"",
        data[:8],
        b"XLTS" + data[4:],
        data[:4] + bytes([9]) + data[5:],
        data[:-1],
        data + b"\0",
        data[:20] + bytes([data[20] ^ 0xFF]) + data[21:],
        _reseal(data[9:] + b"\0"),  # CRC ok, trailing byte
        _reseal(struct.pack("<I", 0)),  # no thresholds
        _reseal(struct.pack("<III", 1, 5, 1)),  # one node: fewer than the two roots
        _reseal(struct.pack("<IIIIB", 1, 5, 3, 7, 1)),  # parent after the node
        _reseal(struct.pack("<IIIIBIIB", 1, 5, 4, 0, 1, 0, 1, 0)),  # two '+' edges
        _reseal(struct.pack("<IIIIBI", 1, 5, 3, 0, 9, 0)),  # unknown edge kind
        _reseal(struct.pack("<IIIIBIsI", 1, 5, 3, 0, 0, 1, b"\xff", 0)),  # bad UTF-8
        _reseal(struct.pack("<IIIII", 1, 5, 2, 1, 1)),  # stream at a root
        _reseal(struct.pack("<IIIIBIII", 1, 5, 3, 0, 1, 2, 2, 2)),  # repeated stream
    ]
    for blob in bad:
        with pytest.raises(CorruptLTS):
            LTS.from_bytes(blob)
    assert issubclass(CorruptLTS, StorageError) and not issubclass(CorruptLTS, CorruptFrame)


# --- generations -------------------------------------------------------------------------


def test_inherit_wildcards() -> None:
    lts = LTS([1, 2])
    for t in ["a/1", "a/2", "a/3/z", "b/1", "$SYS/1", "$SYS/2", "$SYS/3"]:
        lts.learn(t)
    # The normal root reached threshold 1 at 'a'; the '$' root at '$SYS'.
    child = lts.inherit_wildcards(thresholds=[1000, 1000])
    structures = [child.structure(i) for i in range(child.stream_count)]
    assert structures == [("a", "+", "z"), ("+", "1"), ("$SYS", "+")]
    assert child.thresholds == (1000, 1000)
    assert child.learn("a/9/z")[1] == ["9"]
    assert child.learn("c/1") == (1, ["c"])  # the inherited depth-0 '+' still applies
    # Static-only streams were dropped, so "a/1" now goes through the inherited '+'.
    s, varying = child.learn("a/1")
    assert varying == ["1"] and child.structure(s) == ("a", "+")
    assert s == child.stream_count - 1


# --- MQTT semantics: match never misses and never over-selects -------------------------------

_TOKENS = st.sampled_from(["a", "b", "c", "", "$x", "$SYS", "d$"])
_TOPICS = st.lists(_TOKENS, min_size=1, max_size=4).map("/".join).filter(bool)
_FILTER_LEVEL = st.one_of(_TOKENS, st.just("+"))


@st.composite
def _filters(draw: st.DrawFn) -> str:
    levels = draw(st.lists(_FILTER_LEVEL, min_size=0, max_size=4))
    if not levels or draw(st.booleans()):
        levels.append("#")
    return "/".join(levels) or "#"  # [""] would be the empty, invalid filter


@settings(max_examples=300, deadline=None)
@given(
    thresholds=st.lists(st.integers(0, 4), min_size=1, max_size=3),
    topics=st.lists(_TOPICS, min_size=1, max_size=40),
    filters=st.lists(_filters(), min_size=1, max_size=8),
)
def test_match_is_exact(thresholds: list[int], topics: list[str], filters: list[str]) -> None:
    lts = LTS(thresholds)
    keys = dict(zip(topics, (lts.learn(t) for t in topics), strict=True))
    for topic, learned in keys.items():
        assert lts.lookup(topic) == learned
    restored = LTS.from_bytes(lts.to_bytes())
    for topic_filter in filters:
        result = lts.match(topic_filter)
        assert restored.match(topic_filter) == result
        streams = [s for s, _ in result]
        assert len(streams) == len(set(streams))
        by_stream = dict(result)
        selected = {
            t
            for t, (stream, varying) in keys.items()
            if stream in by_stream and varying_matches(by_stream[stream], varying)
        }
        expected = {t for t in keys if topic_matches(topic_filter, t)}
        assert selected == expected, topic_filter


@settings(max_examples=200, deadline=None)
@given(
    thresholds=st.lists(st.integers(0, 3), min_size=1, max_size=3),
    topics=st.lists(_TOPICS, min_size=1, max_size=30),
    probes=st.lists(_TOPICS, min_size=1, max_size=10),
)
def test_lookup_learn_and_inherit_consistency(
    thresholds: list[int], topics: list[str], probes: list[str]
) -> None:
    lts = LTS(thresholds, cache_size=4)
    streams = lts.learn_many(topics)
    assert streams == [lts.learn(t)[0] for t in topics]
    assert sorted(set(streams)) == list(range(lts.stream_count))
    for probe in probes:
        nodes, found = lts.node_count, lts.lookup(probe)
        assert lts.node_count == nodes  # lookup never learns
        learned = lts.learn(probe)
        if found is not None:
            assert learned == found and lts.node_count == nodes
    # A new generation places every topic of an inherited (wildcard) stream the same way.
    child = lts.inherit_wildcards()
    for topic in set(topics):
        stream, varying = lts.lookup(topic) or (-1, [])
        if "+" in lts.structure(stream):
            new_stream, new_varying = child.learn(topic)
            assert child.structure(new_stream) == lts.structure(stream)
            assert new_varying == varying
