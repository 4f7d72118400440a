"""The stamper's ``(shard, topic) -> stream`` cache gives exactly what the tries give.

A reference learns every row with a plain :class:`~seglog.topics.LTS` per shard, one topic at a
time in offset order (EMQX's rules); the stamper must return the same stream ids for random
topic sets with repeats, new topics mid-batch, many shards, cuts, and hash collisions forced
by cache keys of a few bits. Both caches are checked: the compiled one
(``seglog.topics._topic_cache``, which the test environment must have built) and the NumPy
fallback, and against each other.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seglog.errors import InvalidArgument
from seglog.topics import LTS
from seglog.topics.streams import StreamStamper, topic_hashes

CACHES = pytest.mark.parametrize("native", [True, False], ids=["native", "numpy"])

LONG = "x" * 70  # over 64 bytes: read by length class
LEVELS = ["a", "b", "dev1", "dev22", "sensor", "é", "", LONG, "t" * 9, "0123456"]


def routed_offsets(rng: random.Random, n: int, shards: int, ends: list[int]) -> tuple[list[int], list[int]]:
    """``n`` random shards and each row's offset in its shard (``ends`` moves on)."""
    routes = [rng.randrange(shards) for _ in range(n)]
    offsets = []
    for r in routes:
        offsets.append(ends[r])
        ends[r] += 1
    return routes, offsets


def _topic(rng: random.Random) -> str:
    levels = [rng.choice(LEVELS) for _ in range(rng.randint(1, 5))]
    topic = "/".join(levels) or "z"
    return ("$SYS/" + topic) if rng.random() < 0.1 else topic


class _Reference:
    """Per-shard tries fed row by row, with the history a cut replays."""

    def __init__(self, shards: int, thresholds: list[int]) -> None:
        self.thresholds = thresholds
        self.history: list[list[str]] = [[] for _ in range(shards)]
        self.tries = [LTS(thresholds, cache_size=0) for _ in range(shards)]

    def stamp(self, topics: list[str], shards: list[int]) -> list[int]:
        out = []
        for topic, shard in zip(topics, shards, strict=True):
            self.history[shard].append(topic)
            out.append(self.tries[shard].learn_stream(topic))
        return out

    def cut(self, shard: int, offset: int) -> None:
        kept = self.history[shard][:offset]
        self.history[shard] = []
        self.tries[shard] = LTS(self.thresholds, cache_size=0)
        self.stamp(kept, [shard] * len(kept))


@CACHES
@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    shards=st.sampled_from([1, 3, 16]),
    key_bits=st.sampled_from([64, 3, 1]),
    thresholds=st.sampled_from([[100, 10], [2, 1], [3]]),
    pool_size=st.integers(1, 60),
    batches=st.integers(1, 12),
)
def test_cache_gives_the_tries_streams(
    native: bool, seed: int, shards: int, key_bits: int, thresholds: list[int], pool_size: int, batches: int
) -> None:
    rng = random.Random(seed)
    pool = list({_topic(rng) for _ in range(pool_size)})
    stamper = StreamStamper(shards, thresholds, key_bits=key_bits, native=native)
    assert stamper.native is native
    ref = _Reference(shards, thresholds)
    ends = [0] * shards
    for _ in range(batches):
        if rng.random() < 0.3:  # new topics join mid-run, some mid-batch
            pool += [_topic(rng) for _ in range(rng.randint(1, 10))]
        n = rng.randint(1, 80)
        topics = [rng.choice(pool) for _ in range(n)]
        if shards == 1 or rng.random() < 0.3:
            shard = rng.randrange(shards)
            got = stamper.stamp(pa.array(topics, pa.string()), shard, ends[shard])
            ends[shard] += n
            want = ref.stamp(topics, [shard] * n)
        else:
            routes, offsets = routed_offsets(rng, n, shards, ends)
            array = pa.array(["pad", *topics], pa.string()).slice(1)  # a sliced column too
            got = stamper.stamp(array, np.array(routes, np.int32), np.array(offsets, np.int64))
            want = ref.stamp(topics, routes)
        assert got.dtype == np.uint32
        assert got.tolist() == want
        if rng.random() < 0.2:  # a failed write's offsets handed out again
            shard = rng.randrange(shards)
            offset = rng.randint(0, ends[shard])
            stamper.cut(shard, offset)
            ref.cut(shard, offset)
            ends[shard] = offset
    for shard in range(shards):
        assert stamper.lts_bytes(shard) == ref.tries[shard].to_bytes()


@CACHES
def test_known_topics_skip_the_tries(native: bool) -> None:
    """A fleet re-sending its topics is served by the cache alone; forced collisions are still exact."""
    topics = [f"fleet/site{i % 7}/dev{i:05d}/temp" for i in range(2000)] + ["a", LONG + "/b", "é"]
    column = pa.array(topics, pa.string())
    routes = np.arange(len(topics), dtype=np.int32) % 4
    stamper = StreamStamper(4, [100, 10], native=native)
    first = stamper.stamp(column, routes, np.arange(len(topics), dtype=np.int64))
    assert stamper.trie_rows == len(topics)
    assert stamper.cached_topics == len(topics)
    order = np.random.default_rng(1).permutation(len(topics))
    again = stamper.stamp(
        column.take(pa.array(order)), routes[order], np.arange(len(topics), 2 * len(topics))
    )
    assert again.tolist() == first[order].tolist()
    assert stamper.trie_rows == len(topics)  # no row walked a trie

    tiny = StreamStamper(4, [100, 10], key_bits=2, native=native)  # 3 keys: nearly every topic collides
    first_tiny = tiny.stamp(column, routes, np.arange(len(topics), dtype=np.int64))
    again_tiny = tiny.stamp(
        column.take(pa.array(order)), routes[order], np.arange(len(topics), 2 * len(topics))
    )
    assert first_tiny.tolist() == first.tolist() and again_tiny.tolist() == again.tolist()
    assert tiny.cached_topics <= 3
    assert tiny.trie_rows > 2 * len(topics) - 10


def test_topic_hashes_depend_on_the_bytes_only() -> None:
    rng = random.Random(7)
    values = [
        "".join(rng.choice("ab/é+") for _ in range(rng.choice([0, 1, 7, 8, 9, 16, 17, 64, 65, 300])))
        for _ in range(500)
    ]
    h = topic_hashes(pa.array(values, pa.string()))
    by_value: dict[str, int] = {}
    for value, x in zip(values, h.tolist(), strict=True):
        assert by_value.setdefault(value, x) == x
    assert len(set(by_value.values())) == len(by_value)  # no collision among these
    for i in range(0, 500, 37):
        assert topic_hashes(pa.array(values, pa.string()).slice(i, 40)).tolist() == h[i : i + 40].tolist()
        assert (
            topic_hashes(pa.array(values[i : i + 40], pa.large_string())).tolist() == h[i : i + 40].tolist()
        )
        assert topic_hashes(pa.array(values[i : i + 1], pa.string())).tolist() == h[i : i + 1].tolist()
    assert topic_hashes(pa.array([], pa.string())).tolist() == []


def test_key_bits_are_checked() -> None:
    with pytest.raises(InvalidArgument):
        StreamStamper(1, [100, 10], key_bits=0)


def test_the_compiled_cache_is_built_and_used_by_default() -> None:
    """`pip install -e .` (make venv) builds the extension; a stamper uses it unless told not to.

    The build is optional (no compiler: the NumPy cache answers), so this is what notices a
    build that silently failed.
    """
    from seglog.topics import _topic_cache

    assert StreamStamper(2, [100, 10]).native
    assert not StreamStamper(2, [100, 10], native=False).native
    assert isinstance(StreamStamper(2, [100, 10], native=True)._native, _topic_cache.TopicCache)


UNICODE = ["é", "温度", "🛰", "ß/ü", "\u0301"]


def _any_topic(rng: random.Random) -> str:
    """Topics of 0 to ~600 bytes: short, over 64 bytes, unicode, empty levels, '$' roots."""
    pick = rng.random()
    if pick < 0.1:
        return "/".join(rng.choice([LONG, "y" * 300, "é" * 40]) for _ in range(rng.randint(1, 2)))
    levels = [rng.choice(LEVELS + UNICODE) for _ in range(rng.randint(1, 6))]
    topic = "/".join(levels) or "z"
    return ("$SYS/" + topic) if pick > 0.93 else topic


def _column(rng: random.Random, topics: list[str]) -> pa.Array:
    kind = rng.choice([pa.string(), pa.large_string()])
    if rng.random() < 0.5:
        return pa.array(["pad", *topics, "tail"], kind).slice(1, len(topics))
    return pa.array(topics, kind)


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    shards=st.sampled_from([1, 2, 5, 16]),
    key_bits=st.sampled_from([64, 64, 4, 1]),
    thresholds=st.sampled_from([[100, 10], [2, 1], [3], [100, 0, 100]]),
    steps=st.integers(1, 25),
)
def test_compiled_and_numpy_caches_agree(
    seed: int, shards: int, key_bits: int, thresholds: list[int], steps: int
) -> None:
    """Both caches, fed the same batches, cuts, resets and restores, give the same ids as the tries."""
    rng = random.Random(seed)
    pool = list({_any_topic(rng) for _ in range(rng.randint(1, 80))})
    native = StreamStamper(shards, thresholds, key_bits=key_bits, native=True)
    numpy = StreamStamper(shards, thresholds, key_bits=key_bits, native=False)
    ref = _Reference(shards, thresholds)
    ends = [0] * shards
    for _ in range(steps):
        action = rng.random()
        if action < 0.1:  # a cut (a failed write), or a reset (an emptied log)
            shard = rng.randrange(shards)
            offset = rng.choice([0, rng.randint(0, ends[shard])])
            if offset == 0 and rng.random() < 0.5:
                native.reset(shard)
                numpy.reset(shard)
            else:
                assert native.cut(shard, offset) == numpy.cut(shard, offset)
            ref.cut(shard, offset)
            ends[shard] = offset
            continue
        if action < 0.15:  # recovery from a snapshot of the whole shard drops its cached topics
            shard = rng.randrange(shards)
            for stamper in (native, numpy):
                stamper.restore(shard, stamper.snapshot(shard, ends[shard]), ends[shard])
            continue
        if rng.random() < 0.3:
            pool += [_any_topic(rng) for _ in range(rng.randint(1, 20))]
        n = rng.choice([0, 1, rng.randint(1, 300)])
        topics = [rng.choice(pool) for _ in range(n)]
        column = _column(rng, topics)
        if shards == 1 or rng.random() < 0.4:
            shard = rng.randrange(shards)
            one: int | np.integer[Any] = rng.choice([shard, np.int64(shard)])
            got = [s.stamp(column, one, ends[shard]) for s in (native, numpy)]
            want = ref.stamp(topics, [shard] * n)
            ends[shard] += n
        else:
            routes, offsets = routed_offsets(rng, n, shards, ends)
            dtype = rng.choice([np.int32, np.int64, np.int16])
            shard_array = np.array(routes, dtype)
            if rng.random() < 0.3:  # a strided view
                shard_array = np.repeat(shard_array, 2)[::2]
            got = [s.stamp(column, shard_array, np.array(offsets, np.int64)) for s in (native, numpy)]
            want = ref.stamp(topics, routes)
        assert got[0].dtype == got[1].dtype == np.uint32
        assert got[0].tolist() == got[1].tolist() == want
        if key_bits == 64:  # no collision: both caches hold and miss the same rows
            assert native.trie_rows == numpy.trie_rows
            assert native.cached_topics == numpy.cached_topics
    for shard in range(shards):
        assert native.lts_bytes(shard) == numpy.lts_bytes(shard) == ref.tries[shard].to_bytes()


def test_compiled_cache_is_exact_on_collisions_and_checks_its_input() -> None:
    """One key for every topic: only the first is cached, the others always miss (never a
    wrong stream); offsets outside the data raise rather than read past it."""
    from seglog.topics._topic_cache import TopicCache

    cache = TopicCache(key_bits=1)  # every key is 1
    column = pa.array(["a/b", "a/c", "a/b" + "x" * 100, "温度"], pa.string())
    _, offsets, data = column.buffers()
    rows = np.arange(4, dtype=np.int64)
    assert cache.insert(offsets, data, 0, 4, 4, rows, np.zeros(4, np.int64), np.array([7, 8, 9, 10])) == 1
    assert len(cache) == 1
    out = np.empty(4, np.uint32)
    miss_rows = np.empty(4, np.int64)
    miss_keys = np.empty(4, np.int64)
    assert cache.lookup(offsets, data, 0, 4, 4, 0, out, miss_rows, miss_keys) == 3
    assert out.tolist() == [7, 0, 0, 0]
    assert miss_rows[:3].tolist() == [1, 2, 3]
    assert cache.lookup(offsets, data, 0, 4, 4, 1, out, miss_rows, miss_keys) == 4  # another shard
    assert cache.drop(0, 8) == 0 and cache.drop(0, 7) == 1 and len(cache) == 0

    bad = np.array([0, 3, 1000], np.int32)  # row 1 ends past the data
    with pytest.raises(ValueError, match="outside the data"):
        cache.lookup(bad, data, 0, 2, 4, 0, out, miss_rows, miss_keys)
    with pytest.raises(ValueError, match="shorter"):
        cache.lookup(offsets, data, 2, 4, 4, 0, out, miss_rows, miss_keys)
    with pytest.raises(ValueError):
        cache.lookup(offsets, data, 0, 4, 4, 0, np.empty(4, np.int64), miss_rows, miss_keys)
    with pytest.raises(ValueError):
        cache.lookup(offsets, data, 0, 4, 4, np.zeros(2, np.int32), out, miss_rows, miss_keys)
    with pytest.raises(ValueError):
        TopicCache(key_bits=0)
    with pytest.raises(RuntimeError):
        TopicCache.__new__(TopicCache).drop(0, 0)


def test_native_without_the_extension_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from seglog.topics import streams

    monkeypatch.setattr(streams, "_topic_cache", None)
    with pytest.raises(InvalidArgument, match="not built"):
        StreamStamper(1, [100], native=True)
    assert not StreamStamper(1, [100]).native


def test_compiled_cache_tells_apart_topics_one_byte_apart() -> None:
    """Every length to 40 bytes, every byte position: with one key for all topics, a topic
    differing from the cached one in a single byte misses; the cached one hits."""
    from seglog.topics._topic_cache import TopicCache

    for length in range(1, 41):
        base = bytes(range(65, 65 + length))
        variants = [base[:j] + b"~" + base[j + 1 :] for j in range(length)]
        column = pa.array([x.decode() for x in [base, *variants]], pa.string())
        _, offsets, data = column.buffers()
        n = len(column)
        cache = TopicCache(key_bits=1)
        zero = np.zeros(1, np.int64)
        assert cache.insert(offsets, data, 0, n, 4, zero, zero, np.array([5])) == 1
        out = np.empty(n, np.uint32)
        miss_rows = np.empty(n, np.int64)
        assert cache.lookup(offsets, data, 0, n, 4, 0, out, miss_rows, np.empty(n, np.int64)) == length
        assert out[0] == 5 and miss_rows[:length].tolist() == list(range(1, n))


def test_compiled_cache_keeps_other_entries_whole_through_a_drop() -> None:
    """A drop rebuilds the arena (each entry's shard and length, then its bytes): the entries
    kept still hit with their streams, the dropped ones miss, and a shard number that only
    agrees in its low 32 bits is another shard."""
    from seglog.topics._topic_cache import TopicCache

    topics = [f"site/{i}/{'x' * (i % 37)}" for i in range(200)]
    column = pa.array(topics, pa.string())
    _, offsets, data = column.buffers()
    n = len(column)
    shards = np.arange(n, dtype=np.int64) % 3
    streams = np.arange(n, dtype=np.int64) + 1
    cache = TopicCache()
    assert cache.insert(offsets, data, 0, n, 4, np.arange(n, dtype=np.int64), shards, streams) == n
    assert cache.drop(1, 50) == int(((shards == 1) & (streams >= 50)).sum())
    out = np.empty(n, np.uint32)
    miss_rows = np.empty(n, np.int64)
    misses = cache.lookup(offsets, data, 0, n, 4, shards, out, miss_rows, np.empty(n, np.int64))
    dropped = (shards == 1) & (streams >= 50)
    assert miss_rows[:misses].tolist() == np.flatnonzero(dropped).tolist()
    assert out[~dropped].tolist() == streams[~dropped].tolist()
    assert cache.lookup(offsets, data, 0, n, 4, 2**32, out, miss_rows, np.empty(n, np.int64)) == n
