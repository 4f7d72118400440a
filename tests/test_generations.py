"""Generations (issue 14, item 4): add_generation, list_slabs, drop_slab, end_of_stream.

Real stores in temporary directories; a restart is a close and a reopen; the crash test
SIGKILLs a child process (tests/generations_child.py).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest

import seglog
from seglog import Iterator, Record, Slab, Stream
from seglog.engines.generations import GENERATIONS_FILE
from seglog.engines.segment import shard_dir_name
from seglog.errors import (
    CurrentGeneration,
    GenerationDropped,
    InvalidArgument,
    OffsetOutOfRange,
    UnknownGeneration,
)
from seglog.topics import topic_matches

THRESHOLDS = [100, 2]  # under the first level: two static tokens, then '+'


async def make_db(store: seglog.Store, name: str = "g", shards: int = 1) -> seglog.Database:
    return await store.create_db(name, shards=shards, lts_thresholds=THRESHOLDS, exist_ok=True)


async def put(db: seglog.Database, topics: list[str], tag: str) -> list[int]:
    """Append one record per topic to shard 0; return their offsets."""
    metas = await db.append([Record(t, f"{tag}:{t}".encode()) for t in topics], shard=0)
    return [m.offset for m in metas]


async def drain(db: seglog.Database, it: Iterator, n: int = 1000) -> tuple[Iterator, list[Record]]:
    """Read until an empty batch; return the last iterator and everything read."""
    got: list[Record] = []
    while True:
        it, batch = await db.next(it, n)
        if not batch:
            return it, got
        got.extend(batch)


async def stamped(db: seglog.Database, offset: int) -> int:
    """The stream id stamped on the record at ``offset`` of shard 0."""
    table = await db.read_arrow(0, offset, 1)
    return int(table.column("stream")[0].as_py())


def only(streams: list[Stream], generation: int, pattern: str) -> Stream:
    found = [s for s in streams if s.generation == generation and s.pattern == pattern]
    assert len(found) == 1, (generation, pattern, streams)
    return found[0]


def test_new_generation_inherits_only_wildcards(run: Any, data_dir: Path) -> None:
    async def go() -> None:
        async with seglog.open(data_dir) as store:
            db = await make_db(store)
            g1 = await put(db, ["s/d0/t", "s/d1/t", "s/d2/t", "static/a"], "g1")
            before = {s.pattern: s for s in db.get_streams("#")}
            assert set(before) == {"s/d0/t", "s/d1/t", "s/+/t", "static/a"}
            assert all(s.generation == 1 for s in before.values())
            assert [await stamped(db, o) for o in g1] == [0, 1, 2, 3]

            slab = await db.add_generation()
            assert slab.generation == 2 and slab.current and slab.since == (4,)
            g2 = await put(db, ["s/d9/t", "s/d0/t", "static/a", "new/x"], "g2")
            after = db.get_streams("#")
            assert [s.generation for s in after] == sorted(s.generation for s in after)
            gen2 = {s.pattern: s for s in after if s.generation == 2}
            # The wildcard path is inherited: s/d9/t (never seen) and s/d0/t (static in
            # generation 1: static paths are not inherited) go through '+' at once, into the
            # inherited stream 0; static topics are learned afresh with new ids.
            assert set(gen2) == {"s/+/t", "static/a", "new/x"}
            assert gen2["s/+/t"].id == 0
            ids = [await stamped(db, o) for o in g2]
            assert ids == [0, 0, gen2["static/a"].id, gen2["new/x"].id]
            assert gen2["static/a"].id != before["static/a"].id  # 3 in generation 1, 1 now
            # Generation 1's streams are still listed, with their own ids and structures.
            assert {s.pattern: s.id for s in after if s.generation == 1} == {
                p: s.id for p, s in before.items()
            }

    run(go())


def test_iterator_ends_before_next_generation(run: Any, data_dir: Path) -> None:
    async def go() -> None:
        async with seglog.open(data_dir) as store:
            db = await make_db(store, shards=2)
            await put(db, ["s/d0/t", "s/d1/t", "s/d2/t", "s/d3/t"], "g1")
            wild = only(db.get_streams("s/+/t"), 1, "s/+/t")
            it = db.make_iterator(wild, "s/+/t")
            it, got = await drain(db, it)
            assert [r.topic for r in got] == ["s/d2/t", "s/d3/t"]
            assert not it.end_of_stream  # the generation is open: it may grow
            await put(db, ["s/d4/t"], "g1")
            await db.add_generation()
            await put(db, ["s/d5/t", "s/d6/t"], "g2")
            # Generation 1's iterator gets its last record, then end_of_stream; the records
            # of generation 2 (same stream id 2? no: id 0 there) are never returned by it.
            it, batch = await db.next(it)
            assert [r.value for r in batch] == [b"g1:s/d4/t"] and not it.end_of_stream
            it, batch = await db.next(it)
            assert batch == [] and it.end_of_stream
            again, batch = await db.next(it)
            assert batch == [] and again.end_of_stream
            streams = db.get_streams("s/+/t")
            assert [(s.generation, s.pattern) for s in streams] == [
                (1, "s/d0/t"),
                (1, "s/d1/t"),
                (1, "s/+/t"),
                (2, "s/+/t"),
            ]
            it2, got2 = await drain(db, db.make_iterator(streams[-1], "s/+/t"))
            assert [r.value for r in got2] == [b"g2:s/d5/t", b"g2:s/d6/t"]
            assert not it2.end_of_stream
            # A stream id that means another stream in the next generation: the read of
            # generation 1's stream 0 stops at the boundary, though generation 2's stream 0
            # (s/+/t) has records after it.
            it0, got0 = await drain(db, db.make_iterator(streams[0], "#"))
            assert [r.topic for r in got0] == ["s/d0/t"]
            assert (await db.next(it0))[0].end_of_stream
            # A start time after generation 1 was closed leaves it out (EMQX's get_streams).
            late = db.list_slabs()[1].created_us + 1
            assert [s.generation for s in db.get_streams("s/+/t", late)] == [2]

    run(go())


def _v1_bytes(it: Iterator) -> bytes:
    """An iterator as version 1 (before generations) wrote it."""
    head = struct.pack(
        "<2sBBQIIIQq", b"SI", 1, 0, it.db_id, it.shard, it.stream, it.check, it.position, it.start_time_us
    )
    body = head + bytes([len(it.varying_filter)]) + b"\x00" * len(it.varying_filter)
    return body + struct.pack("<I", zlib.crc32(body))


def test_iterators_round_trip_across_restart(run: Any, data_dir: Path) -> None:
    async def first() -> tuple[bytes, bytes, bytes, list[Slab], int]:
        async with seglog.open(data_dir) as store:
            db = await make_db(store)
            await put(db, [f"s/d{i}/t" for i in range(6)], "g1")
            it1 = db.make_iterator(only(db.get_streams("s/+/t"), 1, "s/+/t"), "s/+/t")
            it1, batch = await db.next(it1, 2)
            assert [r.topic for r in batch] == ["s/d2/t", "s/d3/t"]
            legacy = _v1_bytes(it1)
            await db.add_generation()
            await put(db, ["s/d7/t", "static/b", "s/d8/t"], "g2")
            it2 = db.make_iterator(only(db.get_streams("#"), 2, "s/+/t"), "s/+/t")
            it2, batch = await db.next(it2, 1)
            assert [r.topic for r in batch] == ["s/d7/t"]
            static_id = only(db.get_streams("static/b"), 2, "static/b").id
            return it1.to_bytes(), it2.to_bytes(), legacy, db.list_slabs(), static_id

    async def second(b1: bytes, b2: bytes, legacy: bytes, slabs: list[Slab], static_id: int) -> None:
        async with seglog.open(data_dir) as store:
            db = await store.open_db("g")
            assert db.list_slabs() == slabs
            # The trie of generation 2 is recovered (inherited wildcards + its log), so a
            # topic learned before the restart keeps its id and the wildcard its stream.
            offsets = await put(db, ["static/b", "s/d9/t"], "g2b")
            assert [await stamped(db, o) for o in offsets] == [static_id, 0]
            it1 = Iterator.from_bytes(b1)
            assert it1.generation == 1 and len(b1) < 64
            it1, got = await drain(db, it1)
            assert [r.topic for r in got] == ["s/d4/t", "s/d5/t"] and it1.end_of_stream
            old = Iterator.from_bytes(legacy)  # version 1 bytes: generation 1
            assert old.generation == 1
            old, got = await drain(db, old)
            assert [r.topic for r in got] == ["s/d4/t", "s/d5/t"] and old.end_of_stream
            it2 = Iterator.from_bytes(b2)
            assert it2.generation == 2
            it2, got = await drain(db, it2)
            assert [r.value for r in got] == [b"g2:s/d8/t", b"g2b:s/d9/t"] and not it2.end_of_stream

    run(second(*run(first())))


def test_drop_slab_under_live_iterator_and_subscription(run: Any, data_dir: Path) -> None:
    async def go() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("g", shards=1, lts_thresholds=THRESHOLDS, segment_bytes=4096)
            await put(db, [f"s/d{i}/t" for i in range(300)], "g1")
            stream = only(db.get_streams("s/+/t"), 1, "s/+/t")
            it = db.make_iterator(stream, "s/+/t")
            it, batch = await db.next(it, 10)
            assert len(batch) == 10
            sub = db.subscribe(it, max_unacked=5)
            sub_batch = await anext(aiter(sub))
            assert sub_batch.records and sub_batch.records[0].offset == it.position
            slabs = await db.add_generation()
            await put(db, ["s/x/t"], "g2")
            with pytest.raises(CurrentGeneration):
                await db.drop_slab(slabs)
            segments = data_dir / "dbs" / "g" / shard_dir_name(0)
            assert f"{slabs.since[0]:020d}.log" in {
                p.name for p in segments.glob("*.log")
            }  # sealed at the boundary
            freed = await db.drop_slab(db.list_slabs()[0])
            assert freed > 0
            assert db.start_offset(0) == slabs.since[0]
            # Generation 1's segments are gone: the first one left starts at generation 2.
            assert min(p.name for p in segments.glob("*.log")) == f"{slabs.since[0]:020d}.log"
            with pytest.raises(GenerationDropped) as info:
                await db.next(it)
            assert isinstance(info.value, OffsetOutOfRange) and info.value.generation == 1
            with pytest.raises(GenerationDropped):
                db.make_iterator(stream, "s/+/t")
            with pytest.raises(GenerationDropped):
                db.subscribe(it, max_unacked=5)
            # The live subscription's next read fails with the same error.
            sub.suback(sub_batch.seqno)
            with pytest.raises(GenerationDropped):
                async with asyncio.timeout(30):
                    async for _ in sub:
                        sub.suback(_.seqno)
            assert [s.generation for s in db.get_streams("#")] == [2]
            assert db.list_slabs()[0].dropped
            await db.drop_slab(1)  # twice: nothing more

    run(go())


def test_drop_slab_errors(run: Any, data_dir: Path) -> None:
    async def go() -> None:
        async with seglog.open(data_dir) as store:
            db = await make_db(store)
            with pytest.raises(CurrentGeneration):
                await db.drop_slab(1)
            with pytest.raises(UnknownGeneration):
                await db.drop_slab(7)
            plain = await store.create_db("plain")
            with pytest.raises(InvalidArgument):
                await plain.add_generation()
            with pytest.raises(InvalidArgument):
                plain.list_slabs()
            mem = await store.create_db("mem", engine="memory", lts_thresholds=THRESHOLDS)
            with pytest.raises(InvalidArgument):
                await mem.add_generation()
            assert db.list_slabs()[0].current

    run(go())


def test_list_slabs_across_restart(run: Any, data_dir: Path) -> None:
    async def first() -> list[Slab]:
        async with seglog.open(data_dir) as store:
            db = await make_db(store, shards=3)
            assert [s.generation for s in db.list_slabs()] == [1]
            for g in range(3):
                await db.append([Record(f"a/{g}/{i}", b"x") for i in range(10)], shard=g % 3)
                await db.add_generation()
            await db.drop_slab(2)  # a middle one: marked, its space freed with generation 1's
            slabs = db.list_slabs()
            assert [(s.generation, s.dropped, s.current) for s in slabs] == [
                (1, False, False),
                (2, True, False),
                (3, False, False),
                (4, False, True),
            ]
            assert slabs[0].since == (0, 0, 0) and slabs[0].until == (10, 0, 0)
            assert slabs[1].until == (10, 10, 0) and slabs[2].until == (10, 10, 10)
            assert slabs[-1].until is None and slabs[-1].until_us is None
            assert all(a.until_us == b.created_us for a, b in itertools.pairwise(slabs))
            return slabs

    async def second(slabs: list[Slab]) -> None:
        async with seglog.open(data_dir) as store:
            db = await store.open_db("g")
            assert db.list_slabs() == slabs
            await db.drop_slab(1)
            assert [db.start_offset(s) for s in range(3)] == [10, 10, 0]  # through generation 2
        manifest = json.loads((data_dir / "dbs" / "g" / GENERATIONS_FILE).read_text())
        assert [g["dropped"] for g in manifest["generations"]] == [True, True, False, False]

    run(second(run(first())))


def test_crash_during_add_generation(run: Any, data_dir: Path) -> None:
    """SIGKILL while generations are added under appends: the open finds a whole state."""
    from tests.generations_child import run_and_kill, topic_for

    total_gens = 0
    for round_, (kill_after, lines_after) in enumerate([(5, 0), (9, 1), (14, 2), (18, 6)]):
        lines = run_and_kill(data_dir, kill_after, lines_after)
        acked = [tuple(map(int, ln.split()[1:])) for ln in lines if ln.startswith("R ") and ln.endswith("\n")]
        done = [int(ln.split()[1]) for ln in lines if ln.startswith("G ") and ln.endswith("\n")]
        assert acked and done, round_

        async def verify(acked: list[tuple[int, ...]] = acked, done: list[int] = done) -> int:
            async with seglog.open(data_dir) as store:
                db = await store.open_db("crash")
                slabs = db.list_slabs()
                ids = [s.generation for s in slabs]
                assert ids == list(range(1, len(ids) + 1))
                assert ids[-1] >= done[-1]  # every acknowledged generation is there
                found: dict[tuple[int, int], tuple[int, str]] = {}
                for f in ("#", "$SYS/#"):
                    for stream in db.get_streams(f):
                        it = db.make_iterator(stream, f)
                        while True:
                            it, recs = await db.next(it, 500)
                            if not recs:
                                break
                            for r in recs:
                                assert (r.shard, r.offset) not in found
                                assert topic_matches(stream.pattern, r.topic) or stream.special
                                found[(r.shard, r.offset)] = (stream.generation, r.topic)
                        assert it.end_of_stream == (stream.generation != ids[-1])
                stored = sum(db.end_offset(s) - db.start_offset(s) for s in range(db.shards))
                assert len(found) == stored, "every stored record is in exactly one stream"
                for shard, offset, topic_id in acked:
                    generation, topic = found[(shard, offset)]
                    assert topic == topic_for(topic_id)
                    slab = slabs[generation - 1]
                    assert slab.since[shard] <= offset
                    assert slab.until is None or offset < slab.until[shard]
                return len(ids)

        total_gens = run(verify())
    assert total_gens > 3


def test_subscription_ends_at_generation_end(run: Any, data_dir: Path) -> None:
    async def go() -> None:
        async with seglog.open(data_dir) as store:
            db = await make_db(store)
            await put(db, ["s/d0/t", "s/d1/t", "s/d2/t", "s/d3/t"], "g1")
            it = db.make_iterator(only(db.get_streams("s/+/t"), 1, "s/+/t"), "s/+/t")
            sub = db.subscribe(it, max_unacked=100)
            got: list[bytes] = []

            async def consume() -> None:
                async for batch in sub:
                    got.extend(r.value for r in batch.records)
                    sub.suback(batch.seqno)
                    if len(got) == 2:
                        await db.add_generation()  # caught up: the subscription ends now
                        await put(db, ["s/d9/t"], "g2")  # generation 2: not delivered

            async with asyncio.timeout(30):
                await consume()
            assert got == [b"g1:s/d2/t", b"g1:s/d3/t"]
            assert sub.iterator.end_of_stream

    run(go())


def test_tier_objects_name_their_generations_structures(run: Any, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from seglog.tiering.parquet import STREAMS_METADATA_KEY, decode_stream_structures

    tier = tmp_path / "tier"

    async def go() -> None:
        async with seglog.open(tmp_path / "data", tier=tier.as_uri(), retention_interval_ms=None) as store:
            db = await make_db(store)
            await put(db, ["s/d0/t", "s/d1/t", "s/d2/t", "static/a"], "g1")
            g1 = {s.id: (s.structure, s.special) for s in db.get_streams("#") if s.generation == 1}
            await db.add_generation()  # seals generation 1's segment
            await put(db, ["static/a", "s/d7/t"], "g2")
            await db.seal()
            entries = await db.tier_now()
            assert len(entries) == 2
            g2 = {s.id: (s.structure, s.special) for s in db.get_streams("#") if s.generation == 2}
            objects = sorted(tier.rglob("*.parquet"))
            assert len(objects) == 2
            metas = [
                decode_stream_structures(pq.read_schema(p).metadata[STREAMS_METADATA_KEY.encode()])
                for p in objects
            ]
            assert metas[0] == g1
            assert metas[1] == g2 and metas[1] != {k: g1[k] for k in metas[1]}

    run(go())


def test_damaged_tries_file_is_not_fatal(run: Any, data_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def first() -> None:
        async with seglog.open(data_dir) as store:
            db = await make_db(store)
            await put(db, ["s/d0/t", "s/d1/t", "s/d2/t"], "g1")
            await db.add_generation()
            await put(db, ["s/d3/t"], "g2")

    async def second() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.open_db("g")
            assert db.list_slabs()[-1].generation == 2
            offsets = await put(db, ["s/d4/t"], "g2b")
            assert db.end_offset(0) == offsets[0] + 1
            # Generation 2's records are still read through a stream of generation 2.
            streams = [s for s in db.get_streams("s/#") if s.generation == 2]
            assert streams
            got = [r.value for s in streams for r in (await drain(db, db.make_iterator(s, "s/#")))[1]]
            assert b"g2b:s/d4/t" in got

    run(first())
    path = data_dir / "dbs" / "g" / "generations" / "gen-000001.lts"
    path.write_bytes(path.read_bytes()[:-3] + b"xyz")
    run(second())
    assert "starting trie is unavailable" in caplog.text
    assert "its streams are left out of stream reads" in caplog.text
