"""Indexes are derived data: lost or stale LMDB files are rebuilt from the segments."""

from __future__ import annotations

import shutil
from pathlib import Path

import seglog
from tests.helpers import make_records


async def _answers(db: seglog.Database) -> tuple[list[int], list[int], list[int]]:
    times = [await db.offset_for_time(s, t) for s in range(db.shards) for t in (0, 1_000_000 + 5000, 1_000_000 + 19990, 10**15)]
    keys = [r.offset for s in range(db.shards) for r in await db.read_key(s, b"dev3")]  # type: ignore[misc]
    reads = [(await db.read(s, o, 1))[0].ts for s in range(db.shards) for o in (0, 333, 600) if o < db.end_offset(s)]  # type: ignore[misc]
    return times, keys, reads  # type: ignore[return-value]


def test_deleted_lmdb_is_rebuilt(run, data_dir: Path) -> None:
    async def write() -> tuple[list[int], list[int], list[int]]:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", shards=2, segment_bytes=16 * 1024, index_interval_bytes=1024)
            for i in range(0, 2000, 100):
                await db.append(make_records(100, start=i))
            return await _answers(db)

    before = run(write())
    index_dirs = list((data_dir / "dbs" / "t").glob("shard-*/index"))
    assert len(index_dirs) == 2
    for d in index_dirs:
        shutil.rmtree(d)

    async def reopen() -> tuple[list[int], list[int], list[int]]:
        async with seglog.open(data_dir) as store:
            return await _answers(await store.open_db("t"))

    assert run(reopen()) == before
    assert all((d / "data.mdb").exists() for d in index_dirs)


def test_index_behind_the_log_is_caught_up(run, data_dir: Path) -> None:
    snapshot = data_dir.parent / "index-snapshot"

    async def write() -> tuple[list[int], list[int], list[int]]:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", segment_bytes=16 * 1024, index_interval_bytes=512)
            for i in range(0, 1000, 100):
                await db.append(make_records(100, start=i))
            await store.close()
        shutil.copytree(data_dir / "dbs" / "t" / "shard-0000" / "index", snapshot)
        async with seglog.open(data_dir) as store:
            db = await store.open_db("t")
            for i in range(1000, 2000, 100):
                await db.append(make_records(100, start=i))
            return await _answers(db)

    before = run(write())
    live = data_dir / "dbs" / "t" / "shard-0000" / "index"
    shutil.rmtree(live)
    shutil.copytree(snapshot, live)  # the index as it was 1000 records ago

    async def reopen() -> tuple[list[int], list[int], list[int]]:
        async with seglog.open(data_dir) as store:
            return await _answers(await store.open_db("t"))

    assert run(reopen()) == before


def test_machine_restart_marker_forces_rebuild(run, data_dir: Path, caplog) -> None:
    async def write() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t")
            await db.append(make_records(500))

    run(write())
    # What a power loss leaves behind: the RUNNING marker of a different boot.
    (data_dir / "RUNNING").write_text("another-boot-id")

    async def reopen() -> list[int]:
        async with seglog.open(data_dir) as store:
            db = await store.open_db("t")
            return [r.offset for r in await db.read_key(0, b"dev3")]  # type: ignore[misc]

    assert run(reopen()) == [i for i in range(500) if i % 50 == 3]
    assert any("rebuilding indexes" in r.getMessage() for r in caplog.records)
