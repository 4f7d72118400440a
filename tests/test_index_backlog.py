"""Index entries of a tailed many-shard append wait in the worker's backlog for a few drains.

A drain of 16 tailed shards writes a small frame per shard; one LMDB transaction per drain
(and a put of every shard's ``indexed_end``) cost more than the entries. The entries are
written when the backlog holds ``INDEX_BATCH_FRAMES`` frames, when it is ``INDEX_BATCH_S``
old, or at a barrier (a drain, maintenance, close). Readers scan past ``indexed_end`` meanwhile.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import seglog
import seglog.engines.segment_writer as segment_writer
from tests.helpers import read_all

SHARDS = 16
DEVICES = 64


def _table(tick: int) -> pa.Table:
    """One record per device (keyed, so the rows spread over every shard)."""
    return pa.table(
        {
            "ts": pa.array([1_700_000_000_000_000 + tick] * DEVICES, pa.int64()),
            "topic": pa.array([f"dev/{d}" for d in range(DEVICES)], pa.string()),
            "key": pa.array([b"dev%d" % d for d in range(DEVICES)], pa.binary()),
            "value": pa.array([b"%d-%d" % (tick, d) for d in range(DEVICES)], pa.binary()),
        }
    )


async def _tail_every_shard(db: seglog.Database) -> None:
    """Read frames of every shard, as a tailing consumer does: drains then flush them at once."""
    for s in range(SHARDS):
        await db.read_frames(s, db.end_offset(s))


def _txn_id(db: seglog.Database) -> int:
    env: Any = db._engine._index._tables.env  # type: ignore[attr-defined]
    return int(env.info()["last_txnid"])


def _ends(db: seglog.Database) -> tuple[list[int], list[int]]:
    shards = db._engine._shards  # type: ignore[attr-defined]
    return [s.index.indexed_end for s in shards], [db.end_offset(n) for n in range(SHARDS)]


async def _by_key(db: seglog.Database) -> dict[bytes, list[int]]:
    return {
        b"dev%d" % d: [r.offset for r in await db.read_key(db.shard_for(b"dev%d" % d), b"dev%d" % d)]
        for d in range(DEVICES)
    }


async def _scanned(db: seglog.Database) -> dict[bytes, list[int]]:
    out: dict[bytes, list[int]] = {b"dev%d" % d: [] for d in range(DEVICES)}
    for s in range(SHARDS):
        for r in await read_all(db, s):
            assert r.key is not None
            out[r.key].append(r.offset)
    return out


def test_tailed_drains_share_index_transactions(
    run: Any, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only the frame count writes the backlog: the test does not depend on how fast drains run.
    monkeypatch.setattr(segment_writer, "INDEX_BATCH_S", 3600.0)
    appends = 40

    async def go() -> None:
        async with seglog.open(data_dir, fsync="always") as store:
            db = await store.create_db("t", shards=SHARDS)
            await _tail_every_shard(db)
            await db.append_arrow(_table(-1))
            await db._engine.drain()  # type: ignore[attr-defined]
            before = _txn_id(db)
            for tick in range(appends):
                await db.append_arrow(_table(tick))
                await _tail_every_shard(db)
            # Every drain flushed every shard's rows: a frame per shard per append.
            frames = appends * SHARDS
            writes = _txn_id(db) - before
            assert writes <= frames // segment_writer.INDEX_BATCH_FRAMES + 1 < appends
            await db._engine.drain()  # type: ignore[attr-defined]
            indexed, ends = _ends(db)
            assert indexed == ends
            assert await _by_key(db) == await _scanned(db)

    run(go())


def test_backlogged_entries_are_found_by_scanning_and_written_at_a_barrier(
    run: Any, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(segment_writer, "INDEX_BATCH_S", 3600.0)
    monkeypatch.setattr(segment_writer, "INDEX_BATCH_FRAMES", 10**9)

    async def go() -> None:
        async with seglog.open(data_dir, fsync="always") as store:
            db = await store.create_db("t", shards=SHARDS)
            await _tail_every_shard(db)
            for tick in range(5):
                await db.append_arrow(_table(tick))
                await _tail_every_shard(db)
            indexed, ends = _ends(db)
            assert all(i < e for i, e in zip(indexed, ends, strict=True))  # all in the backlog
            writers = {id(s.writer): s.writer for s in db._engine._shards}  # type: ignore[attr-defined]
            # An idle worker is woken for the backlog: its deadline is set.
            assert all(w.sync_deadline() is not None for w in writers.values())
            assert await _by_key(db) == await _scanned(db)  # read_key scans past indexed_end
            await db._engine.drain()  # type: ignore[attr-defined]
            indexed, ends = _ends(db)
            assert indexed == ends
            assert await _by_key(db) == await _scanned(db)
            await db.append_arrow(_table(5))
            await _tail_every_shard(db)
        # Close writes the backlog: the next open has nothing to catch up.
        async with seglog.open(data_dir, fsync="always") as store:
            db = await store.open_db("t")
            indexed, ends = _ends(db)
            assert indexed == ends
            assert await _by_key(db) == await _scanned(db)

    run(go())
