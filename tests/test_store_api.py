from __future__ import annotations

import asyncio
from pathlib import Path

import pyarrow as pa
import pytest

import seglog
from seglog import errors
from tests.helpers import T0, make_records, read_all, segment_files


def test_append_read_reopen_same_data_config_offsets(run, data_dir: Path) -> None:
    recs = make_records(3000)

    async def write() -> list[seglog.RecordMeta]:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("telemetry", shards=4, segment_bytes=8 * 1024)
            metas = []
            for i in range(0, len(recs), 500):
                metas.extend(await db.append(recs[i : i + 500]))
            return metas

    metas = run(write())
    # Offsets are dense per shard and follow input order within a shard.
    per_shard: dict[int, list[int]] = {}
    for m in metas:
        per_shard.setdefault(m.shard, []).append(m.offset)
    for offs in per_shard.values():
        assert offs == list(range(len(offs)))

    async def check() -> None:
        async with seglog.open(data_dir) as store:
            assert store.list_dbs() == ["telemetry"]
            db = await store.create_db("telemetry", exist_ok=True)
            assert db.shards == 4 and db.config.segment_bytes == 8 * 1024
            for shard, offs in per_shard.items():
                assert db.end_offset(shard) == len(offs)
                got = await read_all(db, shard)
                want = [r for r, m in zip(recs, metas, strict=True) if m.shard == shard]
                assert [(g.topic, g.value, g.ts, g.key) for g in got] == [
                    (w.topic, w.value, w.ts, w.key) for w in want
                ]
            assert len(segment_files(data_dir, "telemetry", 0)) > 1  # it rolled
            # Appends continue densely after reopen.
            m = await db.append([seglog.Record(topic="x/y", value=b"z")], shard=2)
            assert m[0].offset == len(per_shard[2])

    run(check())


def test_reads_by_offset_time_and_key(run, data_dir: Path) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", shards=1, segment_bytes=16 * 1024, index_interval_bytes=512)
            recs = make_records(2000)
            for i in range(0, 2000, 100):
                await db.append(recs[i : i + 100])
            # By offset, across segment boundaries.
            for off in (0, 1, 99, 100, 777, 1999):
                got = await db.read(0, off, max_records=3)
                assert got[0].offset == off and got[0].value == recs[off].value
            assert await db.read(0, 2000) == []
            with pytest.raises(errors.OffsetOutOfRange) as ei:
                await db.read(0, 2001)
            assert ei.value.end == 2000
            # By time: first offset with ts >= given.
            assert await db.offset_for_time(0, 0) == 0
            assert await db.offset_for_time(0, recs[500].ts) == 500  # type: ignore[arg-type]
            assert await db.offset_for_time(0, recs[500].ts + 1) == 501  # type: ignore[operator]
            assert await db.offset_for_time(0, 1 << 62) == 2000
            # By key: every record with that key, in order.
            got = await db.read_key(0, b"dev7")
            assert [g.offset for g in got] == [i for i in range(2000) if i % 50 == 7]
            assert all(g.key == b"dev7" for g in got)
            assert await db.read_key(0, b"nope") == []
            table = await db.read_arrow(0, 10, max_records=5)
            assert table.column("offset").to_pylist() == [10, 11, 12, 13, 14]
            assert table.schema.names == ["offset", "ts", "topic", "key", "value", "headers", "stream"]

    run(main())


def test_offset_for_time_with_out_of_order_timestamps(run, data_dir: Path) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", index_interval_bytes=64)
            ts = [T0 + t for t in (50, 10, 70, 20, 90, 30, 100, 5)]
            for t in ts:
                await db.append([seglog.Record(topic="a", value=b"x" * 100, ts=t)])
            for target in (T0 + t for t in (0, 10, 15, 50, 60, 71, 95, 100, 101)):
                want = next((i for i, t in enumerate(ts) if t >= target), len(ts))
                assert await db.offset_for_time(0, target) == want, target

    run(main())


def test_long_keys_and_headers(run, data_dir: Path) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t")
            k1, k2 = b"k" * 1000, b"k" * 999 + b"j"
            await db.append(
                [
                    seglog.Record(topic="a", value=b"1", key=k1, headers={"content-type": b"json"}),
                    seglog.Record(topic="a", value=b"2", key=k2),
                    seglog.Record(topic="a", value=b"3", key=k1),
                ]
            )
            got = await db.read_key(0, k1)
            assert [g.value for g in got] == [b"1", b"3"]
            assert got[0].headers == {"content-type": b"json"}

    run(main())


def test_append_arrow_routes_and_returns_positions(run, data_dir: Path) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", shards=3, compression="zstd")
            n = 1000
            table = pa.table(
                {
                    "ts": pa.array(range(T0, T0 + n), pa.int64()),
                    "topic": [f"s/{i % 13}" for i in range(n)],
                    "key": pa.array([None if i % 2 else f"k{i % 5}".encode() for i in range(n)], pa.binary()),
                    "value": [f"v{i}".encode() for i in range(n)],
                }
            )
            pos = await db.append_arrow(table)
            assert pos.num_rows == n
            for row in (0, 1, 500, 999):
                s, o = pos.column("shard")[row].as_py(), pos.column("offset")[row].as_py()
                rec = (await db.read(s, o, 1))[0]
                assert rec.value == f"v{row}".encode() and rec.ts == T0 + row
            assert sum(db.end_offset(s) for s in range(3)) == n
            # The same key always lands on the same shard.
            shards_of_k0 = {pos.column("shard")[i].as_py() for i in range(0, n, 10)}
            assert len(shards_of_k0) == 1
            pos1 = await db.append_arrow(table.select(["topic", "value"]).slice(0, 10), shard=1)
            assert set(pos1.column("shard").to_pylist()) == {1}

    run(main())


def test_segment_ms_rolls_with_injected_clock(run, data_dir: Path, clock) -> None:
    async def main() -> None:
        async with seglog.open(data_dir, clock_us=clock) as store:
            db = await store.create_db("t", segment_ms=60_000)
            await db.append(make_records(10))
            clock.advance_ms(59_999)
            await db.append(make_records(10))
            assert len(segment_files(data_dir, "t", 0)) == 1
            clock.advance_ms(1)
            await db.append(make_records(10))
            files = segment_files(data_dir, "t", 0)
            assert [f.name for f in files] == [f"{0:020d}.log", f"{20:020d}.log"]
            assert len(await read_all(db, 0)) == 30

    run(main())


def test_concurrent_producers_keep_order_and_density(run, data_dir: Path) -> None:
    producers, per_producer, shards = 16, 300, 4

    async def produce(db: seglog.Database, p: int) -> list[seglog.RecordMeta]:
        metas = []
        for i in range(0, per_producer, 20):
            recs = [
                seglog.Record(topic=f"p/{p}", value=f"{p}:{j}".encode(), key=f"{p}".encode())
                for j in range(i, i + 20)
            ]
            metas.extend(await db.append(recs))
        return metas

    async def main() -> None:
        async with seglog.open(data_dir, io_workers=2) as store:
            db = await store.create_db("t", shards=shards, segment_bytes=32 * 1024)
            results = await asyncio.gather(*(produce(db, p) for p in range(producers)))
            for s in range(shards):
                recs = await read_all(db, s)
                assert [r.offset for r in recs] == list(range(len(recs)))  # dense
                seen: dict[str, int] = {}
                for r in recs:
                    p, j = r.value.decode().split(":")
                    assert int(j) > seen.get(p, -1)  # per-producer order within the shard
                    seen[p] = int(j)
            assert sum(db.end_offset(s) for s in range(shards)) == producers * per_producer
            for metas in results:
                offs = [m.offset for m in metas]
                assert offs == sorted(offs)

    run(main())


def test_store_lifecycle_errors(run, data_dir: Path) -> None:
    async def main() -> None:
        store = await seglog.open(data_dir)
        db = await store.create_db("t", shards=2)
        with pytest.raises(errors.DatabaseExists):
            await store.create_db("t")
        with pytest.raises(errors.ConfigMismatch):
            await store.create_db("t", shards=8, exist_ok=True)
        with pytest.raises(errors.DatabaseNotFound):
            await store.open_db("missing")
        for bad in ("", "../x", "a/b", ".hidden", "x" * 200, "a..b", "nul\x00"):
            with pytest.raises(errors.InvalidName):
                await store.create_db(bad)
        with pytest.raises(errors.InvalidArgument):
            await store.create_db("u", segment_bytes=-1)
        with pytest.raises(errors.InvalidArgument):
            await db.read(5, 0)
        await store.close()
        with pytest.raises(errors.ClosedResourceError):
            await db.append([seglog.Record(topic="a", value=b"x")])
        with pytest.raises(errors.ClosedResourceError):
            store.list_dbs()

    run(main())


def test_second_opener_gets_store_locked(run, data_dir: Path) -> None:
    import subprocess
    import sys

    async def main() -> None:
        async with seglog.open(data_dir):
            code = (
                "import asyncio, seglog\n"
                "async def m():\n"
                f"    async with seglog.open({str(data_dir)!r}): pass\n"
                "try:\n    asyncio.run(m())\nexcept seglog.StoreLocked:\n    raise SystemExit(42)\n"
            )
            proc = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", code], timeout=60)
            assert proc.returncode == 42

    run(main())


def test_append_result_is_a_read_only_list_of_record_meta(run, data_dir: Path) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("r", 2)
            recs = [seglog.Record(topic=f"t/{i}", value=b"v", ts=T0 + i) for i in range(5)]
            metas = await db.append(recs, shard=1)
            assert isinstance(metas, seglog.AppendResult) and len(metas) == 5
            assert metas[0] == seglog.RecordMeta(1, 0, T0) and metas[-1] == seglog.RecordMeta(1, 4, T0 + 4)
            assert metas[1:3] == [seglog.RecordMeta(1, 1, T0 + 1), seglog.RecordMeta(1, 2, T0 + 2)]
            assert list(metas) == [seglog.RecordMeta(1, i, T0 + i) for i in range(5)]
            assert metas == [seglog.RecordMeta(1, i, T0 + i) for i in range(5)]
            assert metas != [seglog.RecordMeta(1, i, T0 + i) for i in range(4)]
            assert all(type(x) is int for m in metas for x in m)
            assert metas.offsets.tolist() == [0, 1, 2, 3, 4]
            with pytest.raises(IndexError):
                metas[5]
            assert f"RecordMeta(shard=1, offset=0, ts={T0})" in repr(metas) and "2 more" in repr(metas)
            assert await db.append([]) == []

    run(main())
