"""The ``lmdb`` engine: frames as values of one LMDB environment per database."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import os
import struct
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, Final, NamedTuple

import lmdb
import pyarrow as pa

from seglog.engines.base import EngineConfig, Quota
from seglog.engines.frames import (
    FrameTable,
    FrameTableEngine,
    IntervalSync,
    Maintenance,
    WriteGenerations,
    check_writable,
    decode_frame,
    frame_bytes,
    frame_keys,
    queue_appends,
    split_batch,
)
from seglog.errors import ClosedResourceError, CorruptFrame, OffsetOutOfRange, StorageError
from seglog.io_pool import IoPool
from seglog.record import FrameHeader, encode_frame, parse_header

__all__ = ["FRAMES_DIR", "LmdbEngine"]

log = logging.getLogger("seglog.engines.lmdb")

FRAMES_DIR: Final = "frames"
_MAP_SIZE_BYTES: Final = 1 << 40  # address space only; the file grows as needed
_U64: Final = struct.Struct(">Q")
_MAX_INLINE_KEY_BYTES: Final = 400  # LMDB keys are at most 511 bytes
_LONG_KEY_MARK: Final = 0xFFFF


def _key_prefix(key: bytes) -> bytes:
    if len(key) <= _MAX_INLINE_KEY_BYTES:
        return len(key).to_bytes(2, "big") + key
    return _LONG_KEY_MARK.to_bytes(2, "big") + hashlib.blake2b(key, digest_size=16).digest()


def _start_key(shard: int) -> bytes:
    return b"start:%d" % shard


class _Pending(NamedTuple):
    gen: int  # the shard's write generation when the offsets were assigned
    base: int
    frames: list[tuple[FrameHeader, bytes, list[tuple[bytes, int]]]]


class _LmdbShard(WriteGenerations):
    """One shard's write side (a :class:`~seglog.io_pool.BatchWriter`): one write txn per group.

    A failed transaction is aborted by LMDB (nothing of it is kept) and the shard goes on
    (see :class:`WriteGenerations`); a failed ``interval`` sync makes it read-only until reopen.
    """

    def __init__(self, number: int, env: lmdb.Environment, meta: Any, config: EngineConfig, table: FrameTable) -> None:
        super().__init__(table.end)
        self.number = number
        self.env = env
        self.meta = meta
        self.frames_db = env.open_db(b"f%d" % number)
        self.keys_db = env.open_db(b"k%d" % number)
        self.config = config
        self.table = table
        self.maintenance = Maintenance()
        self._interval = IntervalSync(config.fsync_interval_ms)

    def write_batch(self, items: Sequence[_Pending]) -> Sequence[Any]:
        live, results = self.split_stale(items)
        if not live:
            return results
        try:
            with self.env.begin(write=True) as txn:
                for item in live:
                    for header, data, keys in item.frames:
                        txn.put(_U64.pack(header.base_offset), data, db=self.frames_db, append=True)
                        for k, o in keys:
                            txn.put(_key_prefix(k) + _U64.pack(o), b"", db=self.keys_db)
        except lmdb.Error as exc:
            # LMDB aborted the transaction: nothing of it is kept.
            self.rewind(live[0].gen, self.table.end)
            raise StorageError(f"write to shard {self.number} failed; nothing of it was kept") from exc
        t = self.table
        with t.lock:
            for item in live:
                for header, _data, _keys in item.frames:
                    t.add(header)
        # "always": the environment syncs at every commit. Under "interval" a failed sync
        # makes the shard read-only; this batch is committed like the acknowledged ones
        # before it (the policy acknowledges after write).
        if self.config.fsync == "interval" and self._interval.due():
            with contextlib.suppress(StorageError):
                self._sync()
        return self.merge_results(results, [item.base for item in live])

    def _sync(self) -> None:
        try:
            self.env.sync(True)
        except lmdb.Error as exc:
            self.make_read_only(exc, "a failed sync (acknowledged writes since the last sync may be lost)")
            raise StorageError(f"sync of shard {self.number} failed") from exc
        self._interval.synced()

    def sync_deadline(self) -> float | None:
        return None if self.failed is not None else self._interval.deadline()

    def flush_idle(self) -> None:
        if self._interval.pending and self.failed is None:
            self._sync()

    def drop_before(self, start: int) -> int:
        """Delete the frames (and their key entries) wholly below ``start`` in one txn; return bytes freed."""
        t = self.table
        with t.lock:
            start = max(t.start, start)
            doomed = t.doomed_before(start)
        with self.env.begin(write=True) as txn:
            for h, _ in doomed:
                k = _U64.pack(h.base_offset)
                data = txn.get(k, db=self.frames_db)
                if data is not None:
                    try:
                        batch = decode_frame(data, h)
                        for key, o in frame_keys(batch, h.base_offset):
                            txn.delete(_key_prefix(key) + _U64.pack(o), db=self.keys_db)
                    except CorruptFrame:  # stale key entries are filtered by the start offset
                        log.warning("shard %d: corrupt frame %d dropped with its key entries", self.number, h.base_offset)
                    txn.delete(k, db=self.frames_db)
            txn.put(_start_key(self.number), _U64.pack(start), db=self.meta)
        if self.config.fsync != "always":
            self.env.sync(True)
        with t.lock:
            return t.drop_before(start)


class LmdbEngine(FrameTableEngine):
    """Frames stored in one LMDB environment per database (``<db dir>/frames/``).

    One named database per shard maps the big-endian base offset to the frame bytes (the
    same encoded frames, and CRCs, as the segment engine); another maps ``(key, offset)``
    to nothing for key lookups; ``meta`` holds each shard's start offset. Appends go through
    the shared :class:`IoPool`: one write transaction (frames and key entries together,
    atomically) per drained group per shard, synced at commit under ``fsync="always"``.
    Time lookups use the frame headers, which are loaded into memory when the database
    opens (one cursor pass over the frames).

    What it cannot do:

    * The environment is single-node and single-writer: write transactions of all shards
      are serialised by LMDB, so shards do not write in parallel.
    * ``fsync="interval"``/``"never"`` open the environment without sync: a power loss can
      lose acknowledged appends (and, on filesystems that reorder writes, damage the
      environment); a process crash loses nothing.
    * LMDB files never shrink: retention frees pages for reuse but :meth:`disk_bytes` (the
      file size) stays at its high-water mark, and the store's quota measurement on open
      does not count LMDB files (appends and frees are still accounted while open).
    * ``stats().segments`` is 0; ``segment_bytes``/``segment_ms`` are accepted and ignored;
      retention frees whole frames, oldest first (every frame is eligible).
    """

    name: Final = "lmdb"

    def __init__(
        self,
        config: EngineConfig,
        env: lmdb.Environment,
        shards: list[_LmdbShard],
        io_pool: IoPool,
        executor: Executor,
    ) -> None:
        super().__init__(config, [s.table for s in shards], executor)
        self._env = env
        self._shards = shards
        self._io_pool = io_pool
        self._path = config.directory / FRAMES_DIR

    @classmethod
    def open_blocking(cls, config: EngineConfig, io_pool: IoPool, executor: Executor) -> LmdbEngine:
        """Open or create the environment and load every shard's frame headers."""
        path = config.directory / FRAMES_DIR
        try:
            path.mkdir(parents=True, exist_ok=True)
            env = lmdb.open(
                str(path),
                map_size=_MAP_SIZE_BYTES,
                max_dbs=2 * config.shards + 1,
                sync=config.fsync == "always",
                metasync=config.fsync == "always",
                readahead=False,
                max_readers=256,
            )
        except (OSError, lmdb.Error) as exc:
            raise StorageError(f"cannot open LMDB environment {path}") from exc
        try:
            meta = env.open_db(b"meta")
            shards = []
            for n in range(config.shards):
                table = FrameTable()
                shard = _LmdbShard(n, env, meta, config, table)
                with env.begin(buffers=True) as txn:
                    raw_start = txn.get(_start_key(n), db=meta)
                    start = _U64.unpack(bytes(raw_start))[0] if raw_start is not None else 0
                    for _k, value in txn.cursor(db=shard.frames_db):
                        table.add(parse_header(value))
                table.start = start
                table.end = max(table.end, start)
                shard.next_offset = table.end
                shards.append(shard)
        except (lmdb.Error, CorruptFrame) as exc:
            env.close()
            raise StorageError(f"cannot load LMDB environment {path}") from exc
        return cls(config, env, shards, io_pool, executor)

    def _shard(self, shard: int) -> _LmdbShard:
        self._table(shard)  # checks closed and range
        return self._shards[shard]

    # --- append ------------------------------------------------------------------------

    async def append(self, shard: int, batch: pa.RecordBatch) -> int:
        return (await self.append_many([(shard, batch)]))[0]

    def _encode(self, gen: int, base: int, batch: pa.RecordBatch) -> tuple[_Pending, int]:
        frames = []
        offset = base
        for part in split_batch(batch):
            frame = encode_frame(part, offset, compression=self.config.compression)
            frames.append((frame.header, frame_bytes(frame), frame_keys(part, offset)))
            offset += part.num_rows
        return _Pending(gen, base, frames), offset

    async def append_many(self, parts: Sequence[tuple[int, pa.RecordBatch]], quota: Quota | None = None) -> list[int]:
        """Append batches to distinct shards; ``quota`` may veto before anything is queued."""
        shards = [self._shard(n) for n, _ in parts]
        check_writable(shards)
        encoded = [
            self._encode(s.gen, s.next_offset, batch) for s, (_, batch) in zip(shards, parts, strict=True)
        ]
        sizes = [sum(h.size for h, _d, _k in pending.frames) for pending, _ in encoded]
        return await queue_appends(self._io_pool, shards, encoded, sizes, quota, self.listener)

    # --- reads -------------------------------------------------------------------------

    def _fetch(self, shard: int, frames: Sequence[tuple[FrameHeader, Any]]) -> list[bytes]:
        s = self._shards[shard]
        out: list[bytes] = []
        with self._env.begin() as txn:
            for h, _ in frames:
                data = txn.get(_U64.pack(h.base_offset), db=s.frames_db)
                if data is None:  # dropped by retention after the range check
                    t = s.table
                    raise OffsetOutOfRange(h.base_offset, t.start, t.end, shard=shard)
                out.append(data)
        return out

    def _key_offsets(self, shard: int, key: bytes) -> list[int]:
        s = self._shard(shard)
        prefix = _key_prefix(key)
        out: list[int] = []
        with self._env.begin(buffers=True) as txn:
            cur = txn.cursor(db=s.keys_db)
            if cur.set_range(prefix):
                for k in cur.iternext(keys=True, values=False):
                    kb = bytes(k)
                    if not kb.startswith(prefix) or len(kb) != len(prefix) + 8:
                        if not kb.startswith(prefix):
                            break
                        continue
                    out.append(_U64.unpack_from(kb, len(prefix))[0])
        return out

    # --- maintenance -------------------------------------------------------------------

    async def _on_worker(self, s: _LmdbShard, fn: Callable[[], Any]) -> Any:
        return await self._io_pool.submit(s.number, s.maintenance, fn)

    async def truncate_before(self, shard: int, offset: int) -> int:
        """Make ``offset`` the first readable offset (never lowers it); return the frame bytes freed."""
        s = self._shard(shard)
        t = s.table
        if offset > t.end:
            raise OffsetOutOfRange(offset, t.start, t.end, shard=shard)
        freed: int = await self._on_worker(s, functools.partial(_guarded, s, offset))
        return freed

    async def enforce_retention(
        self,
        retention_bytes: int | None,
        retention_ms: int | None,
        now_us: int,
        floors: Sequence[int | None],
    ) -> int:
        """Drop whole frames past retention, oldest first, never at/above ``floors[shard]``."""
        if retention_bytes is None and retention_ms is None:
            return 0

        def one(s: _LmdbShard) -> int:
            with s.table.lock:
                start = s.table.retention_start(retention_bytes, retention_ms, now_us, floors[s.number])
            return 0 if start is None else _guarded(s, start)

        freed = await asyncio.gather(*(self._on_worker(s, functools.partial(one, s)) for s in self._shards))
        return sum(freed)

    async def drain(self) -> None:
        """Wait until every append queued so far has completed."""
        if self._closed:
            return
        with contextlib.suppress(ClosedResourceError):  # a closed pool is drained
            await asyncio.gather(*(self._on_worker(s, lambda: None) for s in self._shards))

    def disk_bytes(self) -> int:
        """Size of the LMDB data file (it never shrinks)."""
        try:
            return os.stat(self._path / "data.mdb").st_size
        except OSError:
            return 0

    @staticmethod
    def measure_bytes(directory: Path) -> int:
        """0: the store's quota measure leaves LMDB files out (see the class docstring).

        They never shrink, so counting them would keep a store over quota after data was
        freed; appends and frees are still accounted while the database is open.
        """
        del directory
        return 0

    def close_blocking(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._env.sync(True)
            self._env.close()
        except lmdb.Error as exc:
            raise StorageError("closing the engine failed") from exc

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self.close_blocking)

    @property
    def path(self) -> Path:
        """The LMDB environment directory."""
        return self._path


def _guarded(s: _LmdbShard, start: int) -> int:
    try:
        return s.drop_before(start)
    except lmdb.Error as exc:
        raise StorageError(f"shard {s.number}: deleting frames below {start} failed") from exc

