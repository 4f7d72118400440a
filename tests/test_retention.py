from __future__ import annotations

from pathlib import Path

import pytest

import seglog
from seglog import errors
from tests.helpers import make_records, read_all, segment_files


def _total(data_dir: Path, db: str, shard: int) -> int:
    return sum(p.stat().st_size for p in segment_files(data_dir, db, shard))


def test_retention_by_bytes_moves_start_and_persists(run, data_dir: Path, clock) -> None:
    async def main() -> int:
        async with seglog.open(data_dir, clock_us=clock) as store:
            db = await store.create_db("r", segment_bytes=4096, retention_bytes=20_000)
            recs = make_records(3000, ts0=clock.now_us)
            for i in range(0, 3000, 50):
                await db.append(recs[i : i + 50])
            files_before = len(segment_files(data_dir, "r", 0))
            table = await db.read_arrow(0, 0, max_records=10)  # zero-copy view into segment 0
            freed = await db.enforce_retention()
            assert freed > 0
            start = db.start_offset(0)
            assert start > 0
            assert len(segment_files(data_dir, "r", 0)) < files_before
            assert _total(data_dir, "r", 0) >= 20_000
            # A reader still holding data of a removed segment is unharmed.
            assert table.column("value").to_pylist()[0] == recs[0].value
            with pytest.raises(errors.OffsetOutOfRange) as ei:
                await db.read(0, start - 1)
            assert ei.value.start == start
            got = await read_all(db, 0)
            assert [g.offset for g in got] == list(range(start, 3000))
            assert got[0].value == recs[start].value
            # Lookups below the start do not break.
            assert await db.offset_for_time(0, 0) == start
            keyed = await db.read_key(0, b"dev7")
            assert keyed and all(k.offset >= start for k in keyed)  # type: ignore[operator]
            assert await db.enforce_retention() == 0  # idempotent
            return start

    start = run(main())

    async def reopen() -> None:
        async with seglog.open(data_dir, clock_us=clock) as store:
            db = await store.open_db("r")
            assert db.start_offset(0) == start
            with pytest.raises(errors.OffsetOutOfRange):
                await db.read(0, start - 1)
            assert (await db.read(0, start, 1))[0].offset == start
            m = await db.append([seglog.Record(topic="a/b", value=b"x")])
            assert m[0].offset == 3000

    run(reopen())


def test_retention_by_time_uses_largest_record_ts(run, data_dir: Path, clock) -> None:
    async def main() -> None:
        async with seglog.open(data_dir, clock_us=clock) as store:
            db = await store.create_db("t", segment_bytes=4096, retention_ms=60_000)
            old = make_records(500, ts0=clock.now_us - 3_600_000_000)  # an hour old
            new = make_records(500, start=500, ts0=clock.now_us)
            for i in range(0, 500, 50):
                await db.append(old[i : i + 50])
            for i in range(0, 500, 50):
                await db.append(new[i : i + 50])
            await db.enforce_retention()
            start = db.start_offset(0)
            assert 0 < start <= 500
            assert (await db.read(0, start, 1))[0].offset == start
            clock.advance_ms(30_000)
            assert await db.enforce_retention() == 0  # new records are 30 s old: kept
            clock.advance_ms(3_600_000)
            await db.enforce_retention()
            assert db.start_offset(0) > 500
            assert db.start_offset(0) == segment_base(data_dir, "t")  # only the active one left

    run(main())


def segment_base(data_dir: Path, db: str) -> int:
    files = segment_files(data_dir, db, 0)
    assert len(files) == 1
    return int(files[0].name.split(".")[0])


def test_retention_respects_group_commits_unless_overridden(run, data_dir: Path, clock) -> None:
    async def main() -> None:
        async with seglog.open(data_dir, clock_us=clock) as store:
            db = await store.create_db("g", segment_bytes=4096, retention_bytes=0)
            for i in range(0, 2000, 50):
                await db.append(make_records(50, start=i))
            await db.commit("slow", 0, 300)
            await db.commit("fast", 0, 1900)
            await db.enforce_retention()
            start = db.start_offset(0)
            assert 0 < start <= 300
            assert (await db.read(0, 300, 1))[0].offset == 300
            await db.configure(retention_overrides_groups=True)
            await db.enforce_retention()
            assert db.start_offset(0) > 300

    run(main())


def test_a_replicas_retention_stops_at_its_high_watermark(run, data_dir: Path, clock) -> None:
    """A replica (set_replicated) keeps every segment holding offsets at or above the high
    watermark, even with retention_overrides_groups; an unreplicated database does not."""

    async def main() -> None:
        async with seglog.open(data_dir, clock_us=clock) as store:
            for name, replicated in (("plain", False), ("replica", True)):
                db = await store.create_db(
                    name, segment_bytes=4096, retention_bytes=0, retention_overrides_groups=True
                )
                if replicated:
                    db.set_replicated()
                for i in range(0, 2000, 50):
                    await db.append(make_records(50, start=i))
                db.update_high_watermark(0, 300)
                await db.enforce_retention()
                start = db.start_offset(0)
                if not replicated:
                    assert start > 300
                    continue
                assert 0 < start <= 300
                assert (await db.read(0, 300, 1))[0].offset == 300
                db.update_high_watermark(0, 2000)
                await db.enforce_retention()
                assert db.start_offset(0) > 300

    run(main())


def test_truncate_before(run, data_dir: Path) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("x", shards=2, segment_bytes=4096)
            for i in range(0, 1000, 50):
                await db.append(make_records(50, start=i), shard=1)
            n_files = len(segment_files(data_dir, "x", 1))
            assert await db.truncate_before(1, 777) > 0
            assert db.start_offset(1) == 777
            assert len(segment_files(data_dir, "x", 1)) < n_files
            with pytest.raises(errors.OffsetOutOfRange) as ei:
                await db.read(1, 776)
            assert ei.value.start == 777
            assert (await db.read(1, 777, 1))[0].offset == 777
            await db.truncate_before(1, 10)  # never moves back
            assert db.start_offset(1) == 777
            with pytest.raises(errors.OffsetOutOfRange):
                await db.truncate_before(1, 1001)
            with pytest.raises(errors.InvalidArgument):
                await db.truncate_before(2, 0)
            assert db.start_offset(1) == 777
            await db.truncate_before(1, 1000)  # everything: the log is empty but continues
            assert await db.read(1, 1000) == []
            m = await db.append([seglog.Record(topic="a", value=b"v")], shard=1)
            assert m[0].offset == 1000
        async with seglog.open(data_dir) as store:
            db = await store.open_db("x")
            assert db.start_offset(1) == 1000
            assert [r.offset for r in await read_all(db, 1)] == [1000]

    run(main())
