"""Indexes are derived data: lost or stale LMDB files are rebuilt from the segments."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import lmdb
import pytest

import seglog
import seglog._fs
from tests.helpers import T0, make_records


async def _answers(db: seglog.Database) -> tuple[list[int], list[int], list[int]]:
    times = [
        await db.offset_for_time(s, t) for s in range(db.shards) for t in (0, T0 + 5000, T0 + 19990, 10**17)
    ]
    keys = [r.offset for s in range(db.shards) for r in await db.read_key(s, b"dev3")]  # type: ignore[misc]
    reads = [
        (await db.read(s, o, 1))[0].ts
        for s in range(db.shards)
        for o in (0, 333, 600)
        if o < db.end_offset(s)
    ]  # type: ignore[misc]
    return times, keys, reads  # type: ignore[return-value]


def test_deleted_lmdb_is_rebuilt(run, data_dir: Path) -> None:
    async def write() -> tuple[list[int], list[int], list[int]]:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", shards=2, segment_bytes=16 * 1024, index_interval_bytes=1024)
            for i in range(0, 2000, 100):
                await db.append(make_records(100, start=i))
            return await _answers(db)

    before = run(write())
    index_dir = data_dir / "dbs" / "t" / "index"
    shutil.rmtree(index_dir)

    async def reopen() -> tuple[list[int], list[int], list[int]]:
        async with seglog.open(data_dir) as store:
            return await _answers(await store.open_db("t"))

    assert run(reopen()) == before
    assert (index_dir / "data.mdb").exists()


def test_index_behind_the_log_is_caught_up(run, data_dir: Path) -> None:
    snapshot = data_dir.parent / "index-snapshot"

    async def write() -> tuple[list[int], list[int], list[int]]:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", segment_bytes=16 * 1024, index_interval_bytes=512)
            for i in range(0, 1000, 100):
                await db.append(make_records(100, start=i))
            await store.close()
        shutil.copytree(data_dir / "dbs" / "t" / "index", snapshot)
        async with seglog.open(data_dir) as store:
            db = await store.open_db("t")
            for i in range(1000, 2000, 100):
                await db.append(make_records(100, start=i))
            return await _answers(db)

    before = run(write())
    live = data_dir / "dbs" / "t" / "index"
    shutil.rmtree(live)
    shutil.copytree(snapshot, live)  # the index as it was 1000 records ago

    async def reopen() -> tuple[list[int], list[int], list[int]]:
        async with seglog.open(data_dir) as store:
            return await _answers(await store.open_db("t"))

    assert run(reopen()) == before


async def _write_2000(data_dir: Path) -> tuple[list[int], list[int], list[int]]:
    """2,000 keyed records in 100-record appends over several segments; the answers they give."""
    async with seglog.open(data_dir) as store:
        db = await store.create_db("t", segment_bytes=16 * 1024, index_interval_bytes=512)
        for i in range(0, 2000, 100):
            await db.append(make_records(100, start=i))
        return await _answers(db)


def _tear(index_dir: Path, *, boot: str = "another-boot-id") -> None:
    """What a power loss can leave: the index still marked open by the old boot, entries lost.

    LMDB without fsync may lose any committed transaction; losing every key entry (postings
    and per-frame summaries) while the meta page still claims the log is indexed is a torn
    state LMDB itself cannot notice.
    """
    env = lmdb.open(str(index_dir), max_dbs=8)
    with env.begin(write=True) as txn:
        txn.drop(env.open_db(b"key", txn=txn), delete=False)
        txn.drop(env.open_db(b"keyframe", txn=txn), delete=False)
    env.close()
    (index_dir / "OPEN").write_text(boot)


def test_machine_restart_rebuilds_every_torn_index_including_later_opened_dbs(
    run, data_dir: Path, caplog
) -> None:
    async def write() -> None:
        async with seglog.open(data_dir) as store:
            for name in ("a", "b"):
                db = await store.create_db(name)
                await db.append(make_records(500))

    run(write())
    index_dirs = list((data_dir / "dbs").glob("*/index"))
    assert len(index_dirs) == 2
    for index_dir in index_dirs:
        _tear(index_dir)
    (data_dir / "RUNNING").write_text("another-boot-id")  # the store too was open at the power loss
    want = [i for i in range(500) if i % 50 == 3]

    async def read_keys(name: str) -> list[int]:
        async with seglog.open(data_dir) as store:
            db = await store.open_db(name)
            return [r.offset for r in await db.read_key(0, b"dev3")]  # type: ignore[misc]

    assert run(read_keys("a")) == want
    # A second open of the store after the restart: "b" was never opened since the power loss.
    assert run(read_keys("b")) == want
    assert sum("may be torn" in r.getMessage() for r in caplog.records) == 2


def test_index_of_this_boot_is_not_rebuilt(run, data_dir: Path, caplog) -> None:
    """A process crash keeps LMDB's page cache: no rebuild (the boot check is not a blanket one)."""

    async def write() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t")
            await db.append(make_records(500))

    run(write())
    index_dir = data_dir / "dbs" / "t" / "index"
    (index_dir / "OPEN").write_text(seglog._fs.boot_id())  # left open by a crashed process of this boot

    async def reopen() -> list[int]:
        async with seglog.open(data_dir) as store:
            db = await store.open_db("t")
            return [r.offset for r in await db.read_key(0, b"dev3")]  # type: ignore[misc]

    assert run(reopen()) == [i for i in range(500) if i % 50 == 3]
    assert not any("may be torn" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("damage", ["garbled-meta", "truncated", "zeroed"])
def test_unusable_lmdb_file_is_rebuilt_from_the_segments(run, data_dir: Path, caplog, damage: str) -> None:
    before = run(_write_2000(data_dir))
    mdb = data_dir / "dbs" / "t" / "index" / "data.mdb"
    raw = bytearray(mdb.read_bytes())
    if damage == "garbled-meta":
        for pos in range(0, 8192, 7):
            raw[pos] ^= 0x5A
        mdb.write_bytes(bytes(raw))
    elif damage == "truncated":
        mdb.write_bytes(bytes(raw[:100]))
    else:
        mdb.write_bytes(b"\0" * len(raw))

    async def reopen() -> tuple[list[int], list[int], list[int]]:
        async with seglog.open(data_dir) as store:
            return await _answers(await store.open_db("t"))

    assert run(reopen()) == before
    assert any("rebuilding it" in r.getMessage() for r in caplog.records)


def test_wrong_index_positions_are_detected_and_repaired(run, data_dir: Path, caplog) -> None:
    before = run(_write_2000(data_dir))
    index_dir = data_dir / "dbs" / "t" / "index"
    env = lmdb.open(str(index_dir), max_dbs=8)
    offsets = env.open_db(b"offset")
    with env.begin(write=True) as txn:
        entries = list(txn.cursor(offsets))
        for k, v in entries:  # every entry now points 8 bytes into its frame
            seg, pos = struct.unpack(">QQ", v)
            txn.put(k, struct.pack(">QQ", seg, pos + 8), db=offsets)
    env.close()
    assert len(entries) > 5

    async def reopen() -> tuple[list[int], list[int], list[int]]:
        async with seglog.open(data_dir) as store:
            db = await store.open_db("t")
            first = await _answers(db)
            assert any("index is wrong" in r.getMessage() for r in caplog.records)
            await db._engine.drain()  # the repair queued by the read runs on the shard's worker
            caplog.clear()
            second = await _answers(db)
            assert not any("index is wrong" in r.getMessage() for r in caplog.records), "not repaired"
            assert first == second
            return first

    assert run(reopen()) == before
