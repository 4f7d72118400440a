"""Index entries are written by the worker's indexer thread, after the append is acknowledged.

An append must not wait for its index transaction (a key-index merge is tens of ms of CPU):
these tests hold the index's LMDB write lock from another thread and check that appends are
still acknowledged and readable, then that the index catches up and agrees with one rebuilt
from the segments, also across merges and a truncation.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import seglog
from seglog.index.shard_index import DEFAULT_MERGE_FRAMES
from tests.helpers import make_records, read_all

# A hang guard, not a timing assertion: an append that waits for the held index lock never ends.
_GUARD_S = 60.0


@contextmanager
def _index_write_lock(db: seglog.Database) -> Iterator[None]:
    """Hold the database index's LMDB write lock (one write transaction) while the block runs."""
    env: Any = db._engine._index._tables.env  # type: ignore[attr-defined]
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        txn = env.begin(write=True)
        held.set()
        release.wait()
        txn.abort()

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait()
    try:
        yield
    finally:
        release.set()
        thread.join()


async def _scanned_keys(db: seglog.Database) -> list[list[int]]:
    """Per key ``dev0``..``dev49``, the offsets holding it, from a scan of every record."""
    records = await read_all(db, 0)
    return [[r.offset for r in records if r.key == f"dev{k}".encode()] for k in range(50)]  # type: ignore[misc]


async def _keyed_offsets(db: seglog.Database) -> list[list[int]]:
    return [[r.offset for r in await db.read_key(0, f"dev{k}".encode())] for k in range(50)]  # type: ignore[misc]


def test_append_is_acknowledged_while_the_index_write_waits(run: Any, data_dir: Path) -> None:
    async def go() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", index_interval_bytes=256)
            # 255 keyed frames: the next one makes the key index merge its summaries.
            for i in range(0, 2 * (DEFAULT_MERGE_FRAMES - 1), 2):
                await db.append(make_records(2, start=i))
            await db._engine.drain()  # type: ignore[attr-defined]
            end = db.end_offset(0)
            with _index_write_lock(db):
                # Before the indexer, the worker wrote the index (and merged) before
                # acknowledging: these appends would wait for the lock and never finish.
                for i in range(end, end + 500, 100):
                    await asyncio.wait_for(db.append(make_records(100, start=i)), _GUARD_S)
                assert db.end_offset(0) == end + 500
                # The index lags; reads by key and by offset scan the frames past it.
                want = await _scanned_keys(db)
                assert await _keyed_offsets(db) == want
                assert [r.offset for r in await db.read(0, end + 450, 10)] == list(
                    range(end + 450, end + 460)
                )
            await db._engine.drain()  # type: ignore[attr-defined]
            assert db._engine._shards[0].index.indexed_end == end + 500  # type: ignore[attr-defined]
            assert await _keyed_offsets(db) == want

    run(go())


def test_index_written_by_the_indexer_matches_a_rebuild(run: Any, data_dir: Path) -> None:
    """Hundreds of keyed frames (several key-index merges) and a cut in the middle."""

    async def write() -> tuple[list[list[int]], int]:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", segment_bytes=64 * 1024, index_interval_bytes=512)
            for i in range(0, 6000, 10):
                await db.append(make_records(10, start=i))
            end = await db.truncate_to(0, 4321, force=True)
            await db.append(make_records(500, start=end))
            return await _keyed_offsets(db), db.end_offset(0)

    before, end = run(write())
    assert end > 4321 and sum(len(o) for o in before) == end

    async def reopen() -> list[list[int]]:
        async with seglog.open(data_dir) as store:
            return await _keyed_offsets(await store.open_db("t"))

    assert run(reopen()) == before
    shutil.rmtree(data_dir / "dbs" / "t" / "index")
    assert run(reopen()) == before


def test_clean_close_leaves_no_index_to_catch_up(run: Any, data_dir: Path, caplog: Any) -> None:
    """Close stops the indexer after it wrote every entry, those of rows pending at close too."""

    async def write() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", shards=4)
            for i in range(0, 3000, 300):  # keyed rows over 4 shards: buffered until close
                await db.append(make_records(300, start=i))

    before = set(threading.enumerate())
    run(write())
    # Every indexer this store started was stopped by close, after its last entries.
    assert not [t.name for t in set(threading.enumerate()) - before if t.name.startswith("seglog-index-")]
    caplog.set_level(logging.INFO, logger="seglog.engines.segment")

    async def reopen() -> int:
        async with seglog.open(data_dir) as store:
            db = await store.open_db("t")
            return len(await db.read_key(b"dev7"))

    assert run(reopen()) == 60
    assert not [r for r in caplog.records if "from the segments" in r.getMessage()]


def test_a_failed_index_write_is_caught_up_not_skipped(run: Any, data_dir: Path, monkeypatch: Any) -> None:
    """Whatever the indexer's write raises, the shard catches up: no hole below indexed_end."""
    from seglog.index.shard_index import ShardIndex

    real_add = ShardIndex.add
    failures = [RuntimeError("injected index failure")]

    def add(self: ShardIndex, frames: Any) -> None:
        if failures:
            raise failures.pop()
        real_add(self, frames)

    async def go() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t")
            await db.append(make_records(100))
            await db._engine.drain()  # type: ignore[attr-defined]
            monkeypatch.setattr(ShardIndex, "add", add)
            await db.append(make_records(100, start=100))  # its index write fails
            await db._engine.drain()  # type: ignore[attr-defined]
            await db.append(make_records(100, start=200))
            await db._engine.drain()  # type: ignore[attr-defined]
            assert not failures
            assert db._engine._shards[0].index.indexed_end == 300  # type: ignore[attr-defined]
            assert [len(o) for o in await _keyed_offsets(db)] == [6] * 50

    run(go())
