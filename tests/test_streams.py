"""Streams: stamping from the LTS, the per-shard stream index, iterators (issue 14, items 1-3)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import seglog
from seglog import Iterator, Record, Stream
from seglog.engines import streams as engine_streams
from seglog.errors import (
    ForeignIterator,
    InvalidArgument,
    InvalidIterator,
    InvalidTopicFilter,
    QuotaExceeded,
    StreamFilterMismatch,
    UnknownStream,
)
from seglog.topics import LTS, topic_matches

ENGINES = ["segment", "memory", "lmdb"]


async def read_streams(
    db: seglog.Database, topic_filter: str, start: int = 0, n: int = 1000
) -> list[list[Record]]:
    """Every stream's records for a filter, each stream read to its end with ``next``."""
    out = []
    for stream in db.get_streams(topic_filter, start):
        it = db.make_iterator(stream, topic_filter, start)
        got: list[Record] = []
        while True:
            it, batch = await db.next(it, n)
            if not batch:
                break
            got.extend(batch)
        out.append(got)
    return out


async def all_records(db: seglog.Database) -> list[Record]:
    out: list[Record] = []
    for shard in range(db.shards):
        offset = db.start_offset(shard)
        while offset < db.end_offset(shard):
            batch = await db.read(shard, offset, 10_000)
            out.extend(batch)
            offset += len(batch)
    return out


def brute_force(records: list[Record], topic_filter: str, start: int = 0) -> Counter[tuple[int, int]]:
    return Counter(
        (r.shard, r.offset)
        for r in records
        if topic_matches(topic_filter, r.topic) and r.ts is not None and r.ts >= start
    )


def check_against_scan(
    records: list[Record], per_stream: list[list[Record]], topic_filter: str, start: int
) -> None:
    got = Counter((r.shard, r.offset) for recs in per_stream for r in recs)
    assert got == brute_force(records, topic_filter, start), topic_filter
    by_position = {(r.shard, r.offset): r for r in records}
    for recs in per_stream:
        offsets = [r.offset for r in recs]
        assert offsets == sorted(offsets), "a stream reads in append order"
        assert len({r.shard for r in recs}) <= 1
        for r in recs:
            assert r == by_position[(r.shard, r.offset)]


# --- the property ---------------------------------------------------------------------------

LEVELS = ["a", "b", "c", "", "$x", "dev1", "dev2", "dev3", "x$"]
FIRST = ["a", "b", "$SYS", "$x", "", "c"]
topics_st = st.builds(
    lambda first, rest: "/".join([first, *rest]),
    st.sampled_from(FIRST),
    st.lists(st.sampled_from(LEVELS), min_size=0, max_size=4),
).filter(bool)
filter_level = st.sampled_from([*LEVELS, "+"])
filters_st = st.one_of(
    st.builds(
        lambda first, rest, hash_: "/".join([first, *rest] + (["#"] if hash_ else [])),
        st.sampled_from([*FIRST, "+"]),
        st.lists(filter_level, min_size=0, max_size=4),
        st.booleans(),
    ).filter(bool),
    st.just("#"),
    st.just("+"),
    st.just("$SYS/#"),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    engine=st.sampled_from(ENGINES),
    thresholds=st.lists(st.integers(0, 4), min_size=1, max_size=3),
    shards=st.integers(1, 3),
    topics=st.lists(topics_st, min_size=1, max_size=40),
    picks=st.lists(st.integers(0, 39), min_size=1, max_size=200),
    batch=st.integers(1, 40),
    filters=st.lists(filters_st, min_size=1, max_size=6),
    start_pick=st.integers(0, 120),
    page=st.integers(1, 50),
)
def test_streams_return_exactly_what_a_filtered_scan_returns(
    tmp_path_factory: pytest.TempPathFactory,
    engine: str,
    thresholds: list[int],
    shards: int,
    topics: list[str],
    picks: list[int],
    batch: int,
    filters: list[str],
    start_pick: int,
    page: int,
) -> None:
    data = tmp_path_factory.mktemp("prop")
    records = [
        Record(topics[i % len(topics)], b"v%d" % k, ts=seglog.now_us() + k) for k, i in enumerate(picks)
    ]

    async def go() -> None:
        async with seglog.open(data, fsync="never") as store:
            db = await store.create_db("p", shards=shards, engine=engine, lts_thresholds=thresholds)
            for i in range(0, len(records), batch):
                await db.append(records[i : i + batch])
            stored = await all_records(db)
            start = sorted(r.ts for r in stored)[min(start_pick, len(stored) - 1)]
            for f in filters:
                check_against_scan(stored, await read_streams(db, f, n=page), f, 0)
                check_against_scan(stored, await read_streams(db, f, start, n=page), f, start)

    asyncio.run(go())


def test_dollar_topics_only_by_explicit_filters(run, data_dir: Path) -> None:
    async def go() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("d", lts_thresholds=[0])  # every level varies
            await db.append([Record("$SYS/broker", b"1"), Record("sys/broker", b"2"), Record("a", b"3")])
            assert {s.special for s in db.get_streams("$SYS/#")} == {True}
            for f in ("#", "+/broker", "+/+"):
                got = [r.topic for recs in await read_streams(db, f) for r in recs]
                assert "$SYS/broker" not in got, f
            got = [r.topic for recs in await read_streams(db, "$SYS/+") for r in recs]
            assert got == ["$SYS/broker"]
            # '#' matches the parent level too.
            assert [r.topic for recs in await read_streams(db, "a/#") for r in recs] == ["a"]

    run(go())


def test_upper_caps_what_an_iterator_returns(run, data_dir: Path) -> None:
    """``next_arrow(upper=)`` (a server's high watermark) returns only offsets below it and
    stops the iterator there; a later call with a higher bound returns the rest."""

    async def go() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("d", lts_thresholds=[100])
            await db.append([Record(f"t/{i % 2}", b"%d" % i) for i in range(40)], shard=0)
            (stream,) = db.get_streams("t/1")
            it = db.make_iterator(stream, "t/1")
            it, first = await db.next_arrow(it, 100, upper=15)
            assert first.column("offset").to_pylist() == list(range(1, 15, 2))
            assert it.position == 15
            it, none = await db.next_arrow(it, 100, upper=15)
            assert none.num_rows == 0 and it.position == 15
            it, few = await db.next_arrow(it, 3, upper=39)  # full before the bound
            assert few.column("offset").to_pylist() == [15, 17, 19] and it.position == 20
            it, rest = await db.next_arrow(it, 100)
            assert rest.column("offset").to_pylist() == list(range(21, 40, 2))
            with pytest.raises(InvalidArgument):
                await db.next_arrow(it, 1, upper=1.5)  # type: ignore[arg-type]

    run(go())


# --- persistence ----------------------------------------------------------------------------


def _topics(n: int) -> list[str]:
    return [f"site{i % 7}/dev{i % 53}/t{i % 3}" for i in range(n)]


@pytest.mark.parametrize("engine", ["segment", "lmdb"])
@pytest.mark.parametrize("snapshots", [False, True])
def test_lts_and_iterators_survive_restart(
    run, data_dir: Path, monkeypatch: pytest.MonkeyPatch, engine: str, snapshots: bool
) -> None:
    if snapshots:  # snapshots during appends, and at close; else the log is learned again at open
        monkeypatch.setattr(engine_streams, "SNAPSHOT_EVERY_RECORDS", 300)
    else:
        monkeypatch.setattr(engine_streams, "SNAPSHOT_EVERY_RECORDS", 1 << 40)
        monkeypatch.setattr(engine_streams, "CLOSE_SNAPSHOT_RECORDS", 1 << 40)
    topics = _topics(2000)
    saved: dict[str, Any] = {}

    async def first() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("r", shards=2, engine=engine, lts_thresholds=[5, 3])
            for i in range(0, len(topics), 100):
                await db.append([Record(t, b"x") for t in topics[i : i + 100]])
            saved["streams"] = db.get_streams("#")
            for stream in db.get_streams("site3/+/t1"):  # one with a varying level and records
                it = db.make_iterator(stream, "site3/+/t1")
                it, part = await db.next(it, 7)
                if len(part) == 7 and "+" in stream.structure:
                    break
            else:
                raise AssertionError("no stream to read")
            saved["it"] = it.to_bytes()
            rest: list[Record] = []
            while True:
                it, more = await db.next(it, 50)
                if not more:
                    break
                rest.extend(more)
            saved["rest"] = [(r.shard, r.offset) for r in rest]
            assert rest

    async def second() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.open_db("r")
            assert db.get_streams("#") == saved["streams"]
            it = Iterator.from_bytes(saved["it"])
            rest: list[Record] = []
            while True:
                it, more = await db.next(it, 13)
                if not more:
                    break
                rest.extend(more)
            assert [(r.shard, r.offset) for r in rest] == saved["rest"]
            # New records of a known topic keep its stream; the iterator sees them.
            topic = next(r.topic for r in rest)
            await db.append([Record(topic, b"late")])
            it, more = await db.next(it, 13)
            assert [r.value for r in more] == [b"late"]

    run(first())
    lts_dir = data_dir / "dbs" / "r" / engine_streams.LTS_DIR
    assert lts_dir.is_dir() == snapshots
    run(second())


def test_lts_matches_a_fresh_trie_after_reopen(run, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stamped ids are EMQX's LTS applied to the shard's topics in offset order."""
    monkeypatch.setattr(engine_streams, "SNAPSHOT_EVERY_RECORDS", 250)
    topics = _topics(1500)

    async def go() -> None:
        for round_ in range(3):
            async with seglog.open(data_dir) as store:
                db = await store.create_db("f", lts_thresholds=[4, 2], exist_ok=True)
                await db.append([Record(t, b"x") for t in topics[round_ * 500 : (round_ + 1) * 500]])
                stored = await all_records(db)
                lts = LTS([4, 2])
                expected = [lts.learn(r.topic)[0] for r in stored]
                table = await db.read_arrow(0, 0, 100_000)
                assert table.column("stream").to_pylist() == expected

    run(go())


# --- crash ----------------------------------------------------------------------------------


def test_acknowledged_records_are_found_through_streams_after_sigkill(run, data_dir: Path) -> None:
    from tests.streams_child import run_and_kill, topic_for

    for round_, mode in enumerate(["frames", "keyed", "frames"]):
        lines = run_and_kill(data_dir, mode, 1500 + 500 * round_)
        acked = [tuple(map(int, ln.split())) for ln in lines if ln[:1].isdigit() and ln.endswith("\n")]
        assert acked
        # The child renews snapshots every 60 records: the open restores one and relearns the rest.
        assert list((data_dir / "dbs" / "crash" / engine_streams.LTS_DIR).glob("*.lts"))

        async def verify(acked: list[tuple[int, ...]] = acked) -> None:
            async with seglog.open(data_dir) as store:
                db = await store.open_db("crash")
                found: dict[tuple[int, int], Record] = {}
                for f in ("#", "$SYS/#"):  # '#' leaves '$' topics out
                    for recs in await read_streams(db, f):
                        for r in recs:
                            assert (r.shard, r.offset) not in found
                            found[(r.shard, r.offset)] = r
                stored = await all_records(db)
                assert len(found) == len(stored), "every stored record is in exactly one stream"
                for shard, offset, topic_id, seq in acked:
                    rec = found[(shard, offset)]
                    assert rec.topic == topic_for(topic_id) and rec.value == b"%d" % seq
                # A selective filter finds each acknowledged record of its topics.
                some = topic_for(acked[-1][2])
                got = {(r.shard, r.offset) for recs in await read_streams(db, some) for r in recs}
                want = {(s, o) for s, o, t, _ in acked if topic_for(t) == some}
                assert want <= got

        run(verify())


# --- frame skipping -------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["segment", "memory"])
def test_a_stream_read_skips_frames_of_other_streams(run, data_dir: Path, engine: str) -> None:
    async def go() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("skip", engine=engine, lts_thresholds=[100, 0])
            for b in range(200):  # each append is one site's devices: frames hold one stream
                site = b % 20
                await db.append([Record(f"site{site}/dev{d}/temp", b"x" * 20) for d in range(50)])
            eng: Any = db._engine
            # The index is written after the appends are acknowledged: a read while it lags
            # scans the frames past it (correct, but not what this test counts).
            await eng.drain()
            frames = 200
            before = eng.stream_frames_read
            recs = [r for rs in await read_streams(db, "site7/#", n=100_000) for r in rs]
            assert len(recs) == 10 * 50
            stream_frames = eng.stream_frames_read - before
            assert stream_frames <= 10, stream_frames
            # A scan with the filter reads every frame.
            table = await db.read_arrow(0, 0, 1_000_000)
            assert table.num_rows == frames * 50
            assert stream_frames * 10 < frames

    run(go())


def test_stream_reads_cover_pending_rows_and_a_lagging_index(run, data_dir: Path) -> None:
    async def go() -> None:
        # Many shards per append: rows wait in memory (the journal path) before their segments.
        async with seglog.open(data_dir, buffer_ms=3_600_000) as store:
            db = await store.create_db("pend", shards=8, lts_thresholds=[100, 2])
            recs = [Record(f"k/{i % 40}", b"%d" % i, key=b"%d" % i) for i in range(400)]
            await db.append(recs)
            stored = await all_records(db)
            check_against_scan(stored, await read_streams(db, "k/+", n=7), "k/+", 0)
            eng: Any = db._engine
            for s in eng._shards:  # the index lags: frames past it are scanned
                s.index_lagging = True
            await db.seal()
            check_against_scan(stored, await read_streams(db, "k/#"), "k/#", 0)

    run(go())


# --- failures roll the trie back ------------------------------------------------------------


def test_a_refused_append_teaches_the_trie_nothing(run, data_dir: Path) -> None:
    async def go() -> None:
        async with seglog.open(data_dir, quota_bytes=20_000) as store:
            db = await store.create_db("q", lts_thresholds=[1])
            await db.append([Record("a/1", b"x")])
            with pytest.raises(QuotaExceeded):
                await db.append([Record(f"new{i}/z", b"x" * 100) for i in range(300)])
            assert [s.structure for s in db.get_streams("#")] == [("a", "1")]
            await db.append([Record("b/1", b"x")])
            lts = LTS([1])
            lts.learn_many(["a/1", "b/1"])
            expected = [lts.structure(i) for i in range(lts.stream_count)]
            assert [s.structure for s in db.get_streams("#")] == expected
        async with seglog.open(data_dir) as store:
            db = await store.open_db("q")
            assert [s.structure for s in db.get_streams("#")] == expected

    run(go())


@pytest.mark.parametrize("engine", ENGINES)
def test_truncate_to_cuts_the_trie_back(run, data_dir: Path, engine: str) -> None:
    async def go() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", engine=engine, lts_thresholds=[100, 1])
            await db.append([Record("a/x", b"1"), Record("b/x", b"2")])
            await db.append([Record("c/x", b"3"), Record("a/y", b"4")])
            assert len(db.get_streams("#")) == 4
            it = db.make_iterator(db.get_streams("a/x")[0], "a/x")
            it, got = await db.next(it)
            assert [r.value for r in got] == [b"1"] and it.position == 4
            await db.truncate_to(0, 2, force=True)
            it, got = await db.next(it)  # its position was past the cut: it moves back to the end
            assert got == [] and it.position == 2
            assert [s.pattern for s in db.get_streams("#")] == ["a/x", "b/x"]
            await db.append([Record("d/x", b"5"), Record("a/x", b"6")])
            assert [s.pattern for s in db.get_streams("#")] == ["a/x", "b/x", "d/x"]
            it, got = await db.next(it)
            assert [r.value for r in got] == [b"6"]
            assert [r.topic for rs in await read_streams(db, "d/#") for r in rs] == ["d/x"]
        if engine == "memory":
            return
        async with seglog.open(data_dir) as store:
            db = await store.open_db("t")
            assert [s.pattern for s in db.get_streams("#")] == ["a/x", "b/x", "d/x"]

    run(go())


def test_retention_keeps_the_trie(run, data_dir: Path) -> None:
    async def go() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("ret", segment_bytes=4096, lts_thresholds=[3, 2])
            for i in range(60):
                await db.append([Record(f"r{i % 9}/d{j}", b"x" * 50) for j in range(5)])
            streams = db.get_streams("#")
            freed = await db.truncate_before(0, db.end_offset(0) - 10)
            assert freed > 0
            assert (data_dir / "dbs" / "ret" / engine_streams.LTS_DIR).is_dir()
        async with seglog.open(data_dir) as store:
            db = await store.open_db("ret")
            assert db.get_streams("#") == streams
            stored = await all_records(db)
            check_against_scan(stored, await read_streams(db, "r1/#"), "r1/#", 0)

    run(go())


def test_replicated_frames_teach_the_follower_the_same_streams(run, data_dir: Path) -> None:
    async def go() -> None:
        async with seglog.open(data_dir) as store:
            leader = await store.create_db("lead", lts_thresholds=[2, 1])
            follower = await store.create_db("follow", lts_thresholds=[2, 1])
            await leader.append([Record(t, b"x") for t in _topics(300)])
            frames = await leader.read_frames(0, 0, 1 << 30)
            await follower.append_frames(0, frames, expected_base=0)
            ids = lambda db: [(s.id, s.structure) for s in db.get_streams("#")]  # noqa: E731
            assert ids(follower) == ids(leader)

    run(go())


def test_append_arrow_stream_column_is_stamped(run, data_dir: Path) -> None:
    async def go() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("arrow", lts_thresholds=[100])
            table = pa.table(
                {
                    "topic": ["a", "b", "a"],
                    "value": [b"1", b"2", b"3"],
                    "stream": pa.array([9, 9, 9], pa.uint32()),
                }
            )
            await db.append_arrow(table)
            read = await db.read_arrow(0, 0, 10)
            assert read.column("stream").to_pylist() == [0, 1, 0]

    run(go())


# --- bad input ------------------------------------------------------------------------------


def test_bad_input_raises_specific_errors(run, data_dir: Path) -> None:
    async def go() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("bad", shards=2, lts_thresholds=[100, 1])
            other = await store.create_db("other", shards=2, lts_thresholds=[100, 1])
            recs = [Record("a/1", b"x"), Record("a/2", b"y"), Record("b", b"z")]
            await db.append(recs)
            await other.append(recs)
            for bad in ("a/#/b", "", "a+/b", "a/b#", "\x00"):
                with pytest.raises(InvalidTopicFilter):
                    db.get_streams(bad)
            stream = db.get_streams("a/1")[0]
            with pytest.raises(InvalidTopicFilter):
                db.make_iterator(stream, "#/a")
            with pytest.raises(StreamFilterMismatch):
                db.make_iterator(stream, "b")
            with pytest.raises(StreamFilterMismatch):
                db.make_iterator(stream, "$SYS/#")
            with pytest.raises(InvalidArgument):
                db.make_iterator("a/1", "a/1")  # type: ignore[arg-type]
            it = db.make_iterator(stream, "a/+")
            with pytest.raises(InvalidArgument):
                await db.next(it, 0)
            data = it.to_bytes()
            assert len(data) < 64
            # Malformed bytes.
            for raw in (b"", data[:10], b"XX" + data[2:], data + b"\x00", data[:-1] + bytes([data[-1] ^ 1])):
                with pytest.raises(InvalidIterator):
                    Iterator.from_bytes(raw)
            flipped = bytearray(data)
            flipped[30] ^= 0xFF
            with pytest.raises(InvalidIterator):
                Iterator.from_bytes(bytes(flipped))
            with pytest.raises(InvalidIterator):
                Iterator.from_bytes("not bytes")  # type: ignore[arg-type]
            # Another database's iterator or stream.
            with pytest.raises(ForeignIterator):
                await other.next(it)
            with pytest.raises(ForeignIterator):
                other.make_iterator(stream, "a/1")
            # Another shard, or a stream id that names another structure.
            moved = dataclasses.replace(it, shard=1 - it.shard)
            with pytest.raises(UnknownStream):
                await db.next(Iterator.from_bytes(moved.to_bytes()))
            with pytest.raises(UnknownStream):
                await db.next(dataclasses.replace(it, shard=7))
            with pytest.raises(UnknownStream):
                await db.next(dataclasses.replace(it, stream=99))
            with pytest.raises(UnknownStream):
                db.make_iterator(dataclasses.replace(stream, structure=("zz",)), "#")
            with pytest.raises(InvalidIterator):
                await db.next(dataclasses.replace(it, varying_filter=("x", "y", "z")))
            # Streams disabled.
            plain = await store.create_db("plain", lts_thresholds=None)
            with pytest.raises(InvalidArgument):
                plain.get_streams("#")
            assert not plain.streams_enabled and db.streams_enabled

    run(go())


def test_iterator_bytes_round_trip() -> None:
    it = Iterator(2**64 - 1, 16383, 2**32 - 1, 123, 2**62, -5, ("a", None, "", "é" * 300))
    back = Iterator.from_bytes(it.to_bytes())
    assert back == it
    small = Iterator(1, 0, 3, 4, 5, 6, (None,))
    assert len(small.to_bytes()) == 54  # version 3: 4 bytes of generation, 4 of epoch
    later = Iterator(1, 0, 3, 4, 5, 6, (None,), generation=7, epoch=2**31 - 1)
    assert Iterator.from_bytes(later.to_bytes()) == later


def test_lts_thresholds_config(run, data_dir: Path) -> None:
    async def go() -> None:
        async with seglog.open(data_dir) as store:
            with pytest.raises(InvalidArgument):
                await store.create_db("x", lts_thresholds=[])
            with pytest.raises(InvalidArgument):
                await store.create_db("x", lts_thresholds=[-1])
            db = await store.create_db("y", lts_thresholds=[100, 0, 100])
            assert db.config.lts_thresholds == (100, 0, 100)
            default = await store.create_db("z")
            assert default.config.lts_thresholds is None  # opt-in: stamping costs appends
            assert not default.streams_enabled
            emqx = await store.create_db("w", lts_thresholds=seglog.topics.DEFAULT_LTS_THRESHOLDS)
            assert emqx.config.lts_thresholds == (100, 10) and emqx.streams_enabled
            with pytest.raises(seglog.ConfigMismatch):
                await db.configure(lts_thresholds=[1])
        config = json.loads((data_dir / "dbs" / "y" / "config.json").read_text())
        assert config["lts_thresholds"] == [100, 0, 100]
        # A config written before streams existed: its records were never stamped.
        path = data_dir / "dbs" / "w" / "config.json"
        old = json.loads(path.read_text())
        del old["lts_thresholds"]
        path.write_text(json.dumps(old))
        async with seglog.open(data_dir) as store:
            assert (await store.open_db("y")).config.lts_thresholds == (100, 0, 100)
            assert not (await store.open_db("w")).streams_enabled

    run(go())


def test_public_types() -> None:
    assert {"Iterator", "Stream"} <= set(seglog.__all__)
    s = Stream(0, 1, ("a", "+"))
    assert s.pattern == "a/+"


def test_frames_of_many_streams_are_read_through_the_mixed_tag(run, data_dir: Path) -> None:
    from seglog.engines.segment import MAX_FRAME_TAGS, MIXED_TAG

    topics = [f"m/{i}" for i in range(MAX_FRAME_TAGS * 3)]

    async def go(reopen: bool) -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("mix", lts_thresholds=[1000], exist_ok=True)
            if not reopen:
                for _ in range(5):  # every frame holds every stream: tagged mixed
                    await db.append([Record(t, b"x") for t in topics])
                await db.append([Record("m/0", b"alone")])  # a frame of one stream
                await db._engine.drain()  # index entries wait in the worker's backlog: write them
            shard: Any = db._engine._shards[0]
            assert len(shard.index.tag_frames(MIXED_TAG)) == 5
            stored = await all_records(db)
            for f in ("m/7", "m/0", "m/+", "#"):
                check_against_scan(stored, await read_streams(db, f, n=3), f, 0)

    run(go(False))
    run(go(True))
