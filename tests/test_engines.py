"""The store API against every engine: ``segment``, ``memory`` and ``lmdb``."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

import seglog
from seglog import errors
from tests.crash_child import value_for
from tests.helpers import T0, make_records, read_all

ENGINES = ["segment", "memory", "lmdb"]


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_append_read_and_reopen(run, data_dir: Path, engine: str) -> None:
    recs = make_records(1500)

    async def write() -> list[seglog.RecordMeta]:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", shards=3, engine=engine, segment_bytes=8 * 1024)
            assert db.config.engine == engine
            metas = []
            for i in range(0, len(recs), 250):
                metas.extend(await db.append(recs[i : i + 250]))
            for s in range(3):
                got = await read_all(db, s)
                want = [r for r, m in zip(recs, metas, strict=True) if m.shard == s]
                assert [(g.topic, g.value, g.ts, g.key) for g in got] == [
                    (w.topic, w.value, w.ts, w.key) for w in want
                ]
                assert [g.offset for g in got] == list(range(len(want)))
            return metas

    metas = run(write())
    ends = {s: sum(1 for m in metas if m.shard == s) for s in range(3)}

    async def reopen() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.open_db("t")
            assert db.config.engine == engine
            with pytest.raises(errors.ConfigMismatch):
                await store.create_db("t", engine="segment" if engine != "segment" else "lmdb", exist_ok=True)
            if engine == "memory":  # documented: nothing survives a close
                for s in range(3):
                    assert db.start_offset(s) == db.end_offset(s) == 0
                    assert await read_all(db, s) == []
                return
            for s in range(3):
                assert db.end_offset(s) == ends[s]
                got = await read_all(db, s)
                want = [r for r, m in zip(recs, metas, strict=True) if m.shard == s]
                assert [(g.value, g.ts, g.key) for g in got] == [(w.value, w.ts, w.key) for w in want]
            m = await db.append([seglog.Record(topic="x", value=b"z")], shard=1)
            assert m[0].offset == ends[1]

    run(reopen())


def test_reads_by_offset_time_and_key(run, data_dir: Path, engine: str) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", engine=engine, segment_bytes=16 * 1024, index_interval_bytes=512)
            recs = make_records(2000)
            for i in range(0, 2000, 100):
                await db.append(recs[i : i + 100])
            for off in (0, 1, 99, 100, 777, 1999):
                got = await db.read(0, off, max_records=3)
                assert got[0].offset == off and got[0].value == recs[off].value
            assert await db.read(0, 2000) == []
            with pytest.raises(errors.OffsetOutOfRange):
                await db.read(0, 2001)
            assert await db.offset_for_time(0, 0) == 0
            assert await db.offset_for_time(0, recs[500].ts) == 500  # type: ignore[arg-type]
            assert await db.offset_for_time(0, recs[500].ts + 1) == 501  # type: ignore[operator]
            assert await db.offset_for_time(0, 1 << 62) == 2000
            got = await db.read_key(0, b"dev7")
            assert [g.offset for g in got] == [i for i in range(2000) if i % 50 == 7]
            assert await db.read_key(0, b"nope") == []
            k1, k2 = b"k" * 1000, b"k" * 999 + b"j"  # long keys are hashed by lmdb: filtered
            await db.append(
                [
                    seglog.Record(topic="a", value=b"1", key=k1, headers={"h": b"v"}),
                    seglog.Record(topic="a", value=b"2", key=k2),
                ]
            )
            got = await db.read_key(0, k1)
            assert [g.value for g in got] == [b"1"] and got[0].headers == {"h": b"v"}
            table = await db.read_arrow(0, 10, max_records=5)
            assert table.column("offset").to_pylist() == [10, 11, 12, 13, 14]
            assert table.schema.names == ["offset", "ts", "topic", "key", "value", "headers", "stream"]

    run(main())


def test_offset_for_time_out_of_order(run, data_dir: Path, engine: str) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", engine=engine, index_interval_bytes=64)
            ts = [T0 + t for t in (50, 10, 70, 20, 90, 30, 100, 5)]
            for t in ts:
                await db.append([seglog.Record(topic="a", value=b"x" * 100, ts=t)])
            await db.append([seglog.Record(topic="a", value=b"y", ts=T0 + t) for t in (3, 200, 1)])
            ts += [T0 + 3, T0 + 200, T0 + 1]
            for target in (T0 + t for t in (0, 10, 15, 50, 60, 71, 95, 100, 101, 150, 201)):
                want = next((i for i, t in enumerate(ts) if t >= target), len(ts))
                assert await db.offset_for_time(0, target) == want, target

    run(main())


def test_append_arrow_routes(run, data_dir: Path, engine: str) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", shards=3, engine=engine, compression="zstd")
            n = 600
            table = pa.table(
                {
                    "ts": pa.array(range(T0, T0 + n), pa.int64()),
                    "topic": [f"s/{i % 13}" for i in range(n)],
                    "key": pa.array([None if i % 2 else f"k{i % 5}".encode() for i in range(n)], pa.binary()),
                    "value": [f"v{i}".encode() for i in range(n)],
                }
            )
            pos = await db.append_arrow(table)
            for row in (0, 1, 300, 599):
                s, o = pos.column("shard")[row].as_py(), pos.column("offset")[row].as_py()
                rec = (await db.read(s, o, 1))[0]
                assert rec.value == f"v{row}".encode() and rec.ts == T0 + row
            assert sum(db.end_offset(s) for s in range(3)) == n
            assert len({pos.column("shard")[i].as_py() for i in range(0, n, 10)}) == 1
            pos1 = await db.append_arrow(table.select(["topic", "value"]).slice(0, 10), shard=1)
            assert set(pos1.column("shard").to_pylist()) == {1}

    run(main())


def test_concurrent_producers_density(run, data_dir: Path, engine: str) -> None:
    producers, per_producer, shards = 8, 200, 3

    async def produce(db: seglog.Database, p: int) -> None:
        for i in range(0, per_producer, 20):
            await db.append(
                [
                    seglog.Record(topic=f"p/{p}", value=f"{p}:{j}".encode(), key=f"{p}".encode())
                    for j in range(i, i + 20)
                ]
            )

    async def main() -> None:
        async with seglog.open(data_dir, io_workers=2) as store:
            db = await store.create_db("t", shards=shards, engine=engine)
            await asyncio.gather(*(produce(db, p) for p in range(producers)))
            for s in range(shards):
                recs = await read_all(db, s)
                assert [r.offset for r in recs] == list(range(len(recs)))
                seen: dict[str, int] = {}
                for r in recs:
                    p, j = r.value.decode().split(":")
                    assert int(j) > seen.get(p, -1)
                    seen[p] = int(j)
            assert sum(db.end_offset(s) for s in range(shards)) == producers * per_producer

    run(main())


def test_validation_writes_nothing(run, data_dir: Path, engine: str) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", shards=2, engine=engine)
            good = seglog.Record(topic="a/b", value=b"ok")
            with pytest.raises(errors.InvalidRecord):
                await db.append([good, seglog.Record(topic="a/+", value=b"bad")])
            with pytest.raises(errors.InvalidRecord):
                await db.append([good, seglog.Record(topic="a", value=b"x" * (2 << 20))])
            assert [db.end_offset(s) for s in range(2)] == [0, 0]
            assert [st.bytes for st in db.stats()] == [0, 0]

    run(main())


def test_unknown_engine_rejected(run, data_dir: Path) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            with pytest.raises(errors.InvalidArgument):
                await store.create_db("t", engine="rocksdb")
            assert store.list_dbs() == []

    run(main())


def test_groups_commit(run, data_dir: Path, engine: str) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", shards=2, engine=engine)
            await db.append(make_records(10), shard=1)
            await db.commit("g", 1, 7)
            assert await db.committed("g", 1) == 7
            assert await db.committed("g", 0) is None
        async with seglog.open(data_dir) as store:
            db = await store.open_db("t")
            assert await db.committed("g", 1) == 7  # group commits are durable for every engine

    run(main())


def test_tail_wakes_up_on_append(run, data_dir: Path, engine: str) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", engine=engine)
            await db.append(make_records(3))
            got: list[int] = []
            caught_up = asyncio.Event()

            async def consume() -> None:
                async for rec in db.tail(0, 0):
                    got.append(rec.offset)  # type: ignore[arg-type]
                    if len(got) == 3:
                        caught_up.set()
                    if len(got) == 8:
                        return

            task = asyncio.create_task(consume())
            await asyncio.wait_for(caught_up.wait(), 10)
            assert got == [0, 1, 2]
            await db.append(make_records(5))
            await asyncio.wait_for(task, 10)
            assert got == list(range(8))

    run(main())


def test_truncate_before(run, data_dir: Path, engine: str) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", engine=engine, segment_bytes=4096)
            for i in range(0, 400, 20):
                await db.append(make_records(20, start=i))
            before = db.stats()[0].bytes
            assert await db.truncate_before(0, 0) == 0
            freed = await db.truncate_before(0, 250)
            assert freed > 0 and db.start_offset(0) == 250
            assert db.stats()[0].bytes == before - freed
            with pytest.raises(errors.OffsetOutOfRange):
                await db.read(0, 249)
            got = await read_all(db, 0)
            assert got[0].offset == 250 and got[-1].offset == 399
            assert [g.offset for g in await db.read_key(0, b"dev7")] == [
                i for i in range(250, 400) if i % 50 == 7
            ]
            assert await db.offset_for_time(0, 0) == 250
            with pytest.raises(errors.OffsetOutOfRange):
                await db.truncate_before(0, 401)
            assert await db.truncate_before(0, 100) == 0 and db.start_offset(0) == 250
            await db.append(make_records(5))
            assert db.end_offset(0) == 405
        if engine == "memory":
            return
        async with seglog.open(data_dir) as store:
            db = await store.open_db("t")
            assert db.start_offset(0) == 250 and db.end_offset(0) == 405
            assert [g.offset for g in await db.read_key(0, b"dev7")] == [
                i for i in range(250, 405) if i % 50 == 7
            ]

    run(main())


def test_retention_by_bytes_and_time(run, data_dir: Path, clock, engine: str) -> None:
    async def main() -> None:
        async with seglog.open(data_dir, clock_us=clock, retention_interval_ms=None) as store:
            db = await store.create_db("t", engine=engine, segment_bytes=4096)
            for _ in range(30):
                await db.append(
                    [seglog.Record(topic="a", value=b"v" * 100, ts=clock(), key=b"k") for _ in range(20)]
                )
            total = db.stats()[0].bytes
            await db.configure(retention_bytes=total // 2)
            freed = await db.enforce_retention()
            assert freed > 0
            left = db.stats()[0].bytes
            assert total // 2 <= left < total
            assert db.start_offset(0) > 0 and db.end_offset(0) == 600
            start = db.start_offset(0)
            assert (await db.read(0, start, 1))[0].offset == start
            # Time: everything older than retention_ms on the injected clock goes.
            await db.configure(retention_bytes=None, retention_ms=60_000)
            assert await db.enforce_retention() == 0
            clock.advance_ms(60_001)
            if engine == "segment":
                await db.seal()  # the old records' last segment too (an active one is never dropped)
            await db.append([seglog.Record(topic="a", value=b"new", ts=clock())])
            assert await db.enforce_retention() > 0
            assert db.start_offset(0) >= 600
            assert [r.value for r in await read_all(db, 0)] == [b"new"]
            assert [r.value for r in await db.read_key(0, b"k")] == []

    run(main())


def test_retention_respects_group_floor(run, data_dir: Path, engine: str) -> None:
    async def main() -> None:
        async with seglog.open(data_dir, retention_interval_ms=None) as store:
            db = await store.create_db("t", engine=engine, segment_bytes=4096, retention_bytes=0)
            for i in range(0, 300, 20):
                await db.append(make_records(20, start=i))
            await db.commit("g", 0, 100)
            await db.enforce_retention()
            assert 0 < db.start_offset(0) <= 100
            assert (await db.read(0, 100, 1))[0].offset == 100

    run(main())


def test_lmdb_acknowledged_records_survive_sigkill(run, data_dir: Path) -> None:
    root = Path(__file__).resolve().parent.parent
    for round_ in range(2):  # kill, reopen, append more, kill again
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.crash_child", str(data_dir), "records", "lmdb"],
            cwd=root,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        lines: list[str] = []
        try:
            for line in proc.stdout:  # waits on acknowledgements, not a timer
                lines.append(line)
                if len(lines) >= 2000 + round_ * 500:
                    break
            os.kill(proc.pid, signal.SIGKILL)
            lines.extend(proc.stdout.read().splitlines(keepends=True))
        finally:
            proc.kill()
            proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL
        acked = [tuple(map(int, ln.split())) for ln in lines if ln[0].isdigit() and ln.endswith("\n")]
        assert len(acked) >= 2000

        async def verify(acked: list[tuple[int, ...]] = acked) -> None:
            async with seglog.open(data_dir) as store:
                db = await store.open_db("crash")
                assert db.config.engine == "lmdb"
                by_shard = {s: await read_all(db, s) for s in range(db.shards)}
                for s, recs in by_shard.items():
                    assert [r.offset for r in recs] == list(range(len(recs)))
                    assert db.end_offset(s) == len(recs)
                for shard, offset, p, seq in acked:
                    rec = by_shard[shard][offset]
                    assert rec.value == value_for(p, seq) and rec.topic == f"crash/{p}"
                key_hits = await db.read_key(acked[0][0], f"p{acked[0][2]}".encode())
                assert key_hits and all(r.key == f"p{acked[0][2]}".encode() for r in key_hits)
                before = db.end_offset(0)
                m = await db.append([seglog.Record(topic="after", value=b"x")], shard=0)
                assert m[0].offset == before

        run(verify())


def test_drop_and_recreate(run, data_dir: Path, engine: str) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", engine=engine)
            await db.append(make_records(50))
            assert db.stats()[0].bytes > 0
            await store.drop_db("t")
            assert store.list_dbs() == []
            db = await store.create_db("t", engine=engine)
            assert db.end_offset(0) == 0 and await read_all(db, 0) == []
            await db.append(make_records(5))
            assert db.end_offset(0) == 5

    run(main())
