"""The ``lmdb`` engine: frames as values of one LMDB environment per database."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import os
import struct
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, Final, NamedTuple

import lmdb
import pyarrow as pa

from seglog.engines.base import EngineConfig, Fsync, Quota, ReadOnlyReason
from seglog.engines.frames import (
    FrameTable,
    FrameTableEngine,
    IntervalSync,
    Maintenance,
    WriteGenerations,
    check_leader_epoch,
    check_writable,
    decode_frame,
    encode_batch,
    epochs_after_start,
    epochs_with_frames,
    frame_bytes,
    frame_keys,
    frame_producer,
    parse_frames,
    queue_appends,
)
from seglog.engines.streams import (
    CLOSE_SNAPSHOT_RECORDS,
    SnapshotFiles,
    learn_frames,
    recover_shard,
    snapshot_interval,
    stamp_batch,
)
from seglog.errors import ClosedResourceError, CorruptFrame, OffsetOutOfRange, StorageError
from seglog.io_pool import IoPool
from seglog.record import FrameHeader, parse_header
from seglog.segment.epoch_cache import EpochEntry, entries_truncated_from_end
from seglog.segment.producer_state import ProducerStamp

__all__ = ["FRAMES_DIR", "LmdbEngine"]

log = logging.getLogger("seglog.engines.lmdb")

FRAMES_DIR: Final = "frames"
_MAP_SIZE_BYTES: Final = 1 << 40  # address space only; the file grows as needed
_U64: Final = struct.Struct(">Q")
_EPOCH_ENTRY: Final = struct.Struct(">qq")  # (epoch, start offset)
_MAX_INLINE_KEY_BYTES: Final = 400  # LMDB keys are at most 511 bytes
_LONG_KEY_MARK: Final = 0xFFFF


def _key_prefix(key: bytes) -> bytes:
    if len(key) <= _MAX_INLINE_KEY_BYTES:
        return len(key).to_bytes(2, "big") + key
    return _LONG_KEY_MARK.to_bytes(2, "big") + hashlib.blake2b(key, digest_size=16).digest()


def _start_key(shard: int) -> bytes:
    return b"start:%d" % shard


def _epochs_key(shard: int) -> bytes:
    return b"epochs:%d" % shard


def _hw_key(shard: int) -> bytes:
    return b"hw:%d" % shard


def _pack_epochs(entries: list[EpochEntry]) -> bytes:
    return b"".join(_EPOCH_ENTRY.pack(e, o) for e, o in entries)


def _unpack_epochs(raw: bytes) -> list[EpochEntry]:
    if len(raw) % _EPOCH_ENTRY.size:
        raise CorruptFrame(f"leader-epoch entries of {len(raw)} bytes")
    return [(int(e), int(o)) for e, o in _EPOCH_ENTRY.iter_unpack(raw)]


def _put_epochs(txn: Any, meta: Any, shard: int, entries: list[EpochEntry]) -> None:
    """Store ``shard``'s epoch entries in ``txn`` (no key at all: every frame has epoch 0)."""
    if entries:
        txn.put(_epochs_key(shard), _pack_epochs(entries), db=meta)
    else:
        txn.delete(_epochs_key(shard), db=meta)


class _Pending(NamedTuple):
    gen: int  # the shard's write generation when the offsets were assigned
    base: int
    frames: list[tuple[FrameHeader, bytes, list[tuple[bytes, int]]]]


class _LmdbShard(WriteGenerations):
    """One shard's write side (a :class:`~seglog.io_pool.BatchWriter`): one write txn per group.

    A failed transaction is aborted by LMDB (nothing of it is kept) and the shard goes on
    (see :class:`WriteGenerations`); a failed ``interval`` sync makes it read-only until reopen.
    """

    def __init__(
        self, number: int, env: lmdb.Environment, meta: Any, config: EngineConfig, table: FrameTable
    ) -> None:
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
        # The high watermark moved since it was last written: written lazily (with the next
        # write transaction, when the worker is idle, at close), as Kafka checkpoints it; a
        # crash may bring back an older value, which only hides records.
        self.hw_dirty = False
        # Streams: ``self.stamper`` (WriteGenerations), the snapshot files and the offset the
        # shard's snapshot covers up to (worker thread).
        self.snapshots: SnapshotFiles | None = None
        self.snap_end = 0

    def save_snapshot(self, upto: int | None = None) -> None:
        """(Worker) Write the LTS snapshot covering the records below ``upto`` (default:
        the committed end).

        Raises:
            OSError: The file could not be written (the old one stays).
        """
        if self.stamper is None or self.snapshots is None:
            return
        upto = self.table.end if upto is None else upto
        self.snapshots.save(self.number, self.stamper.snapshot(self.number, upto))
        self.snap_end = upto

    def maybe_snapshot(self, behind: int | None = None) -> None:
        """(Worker) Renew the snapshot once it is ``behind`` records behind the committed end."""
        if behind is None:
            behind = snapshot_interval()
        if self.stamper is None or self.table.end - self.snap_end < behind:
            return
        try:
            self.save_snapshot()
        except OSError as exc:  # only costs replay time at the next open
            log.warning("shard %d: writing the LTS snapshot failed (%s)", self.number, exc)

    def write_batch(self, items: Sequence[_Pending]) -> Sequence[Any]:
        live, results = self.split_stale(items)
        if not live:
            return results
        t = self.table
        with t.lock:
            old_epochs, start = t.epochs, t.start
        epochs = epochs_with_frames(old_epochs, [h for item in live for h, _d, _k in item.frames], start)
        hw_was_dirty = self.hw_dirty
        try:
            with self.env.begin(write=True) as txn:
                for item in live:
                    for header, data, keys in item.frames:
                        txn.put(_U64.pack(header.base_offset), data, db=self.frames_db, append=True)
                        for k, o in keys:
                            txn.put(_key_prefix(k) + _U64.pack(o), b"", db=self.keys_db)
                # In the frames' transaction: an epoch entry exists exactly when its frame does.
                if epochs != old_epochs:
                    _put_epochs(txn, self.meta, self.number, epochs)
                self.take_hw(txn)
        except lmdb.Error as exc:
            # LMDB aborted the transaction: nothing of it is kept.
            self.hw_dirty = self.hw_dirty or hw_was_dirty
            self.rewind(live[0].gen, self.table.end)
            raise StorageError(f"write to shard {self.number} failed; nothing of it was kept") from exc
        with t.lock:
            for item in live:
                for header, _data, _keys in item.frames:
                    t.add(header)
            t.epochs = epochs
        # "always": the environment syncs at every commit. Under "interval" a failed sync
        # makes the shard read-only; this batch is committed like the acknowledged ones
        # before it (the policy acknowledges after write).
        if self.config.fsync_policy is Fsync.INTERVAL and self._interval.due():
            with contextlib.suppress(StorageError):
                self._sync()
        self.maybe_snapshot()
        return self.merge_results(results, [item.base for item in live])

    def _sync(self) -> None:
        try:
            self.env.sync(True)
        except lmdb.Error as exc:
            self.make_read_only(exc, ReadOnlyReason.FAILED_SYNC)
            raise StorageError(f"sync of shard {self.number} failed") from exc
        self._interval.synced()

    def sync_deadline(self) -> float | None:
        return None if self.failed is not None else self._interval.deadline()

    def flush_idle(self) -> None:
        if self.hw_dirty:
            try:
                self.write_hw()
            except StorageError as exc:  # retried; a stale value only hides records
                log.warning("shard %d: writing the high watermark failed (%s)", self.number, exc)
        if self._interval.pending and self.failed is None:
            self._sync()

    def take_hw(self, txn: Any) -> None:
        """Put a moved high watermark into ``txn`` (the caller marks it dirty again if the txn fails)."""
        if not self.hw_dirty:
            return
        self.hw_dirty = False  # before reading: a move after this is written next time
        txn.put(_hw_key(self.number), _U64.pack(self.table.hw), db=self.meta)

    def write_hw(self) -> None:
        """Write a moved high watermark in its own transaction.

        Raises:
            StorageError: The transaction failed (the value stays dirty, retried later).
        """
        try:
            with self.env.begin(write=True) as txn:
                self.take_hw(txn)
        except lmdb.Error as exc:
            self.hw_dirty = True
            raise StorageError(f"shard {self.number}: writing the high watermark failed") from exc

    def cut(self, offset: int) -> int:
        """Remove the frames holding ``offset`` or later, their key entries, the epoch entries
        starting at or past the new end and a high watermark above it, in one transaction.

        Returns:
            The new end offset (``offset`` or the base of the frame holding it).
        """
        t = self.table
        with t.lock:
            new_end = t.cut_point(offset)
            doomed = t.doomed_from(new_end)
            epochs = entries_truncated_from_end(t.epochs, new_end)
            hw = min(t.hw, new_end)
        try:
            with self.env.begin(write=True) as txn:
                for h, _ in doomed:
                    self._delete_frame(txn, h)
                _put_epochs(txn, self.meta, self.number, epochs)
                txn.put(_hw_key(self.number), _U64.pack(hw), db=self.meta)
        except lmdb.Error as exc:
            raise StorageError(
                f"shard {self.number}: truncation to {offset} failed; nothing was cut"
            ) from exc
        # Committed: the table follows the environment before the sync, which may fail.
        with t.lock:
            t.cut_end(new_end)
            t.epochs = epochs
            t.hw = min(t.hw, new_end)
        if self.config.fsync_policy is not Fsync.ALWAYS:
            self._sync()  # a cut is rare; it must not come undone after it returned
        if self.stamper is not None:
            self.stamper.cut(self.number, new_end)
            if self.snap_end > new_end:
                # The old snapshot knows topics of records that are gone, whose offsets are
                # handed out again: it must not be restored.
                try:
                    self.save_snapshot(new_end)
                except OSError as exc:
                    self.make_read_only(exc, ReadOnlyReason.TRUNCATION_FAILED)
                    raise StorageError(f"shard {self.number}: rewriting the LTS snapshot failed") from exc
        return new_end

    def _delete_frame(self, txn: Any, h: FrameHeader) -> None:
        """Delete one frame and its key entries in ``txn``."""
        k = _U64.pack(h.base_offset)
        data = txn.get(k, db=self.frames_db)
        if data is not None:
            try:
                batch = decode_frame(data, h)
                for key, o in frame_keys(batch, h.base_offset):
                    txn.delete(_key_prefix(key) + _U64.pack(o), db=self.keys_db)
            except CorruptFrame:  # stale key entries are filtered by the start/end offsets
                log.warning(
                    "shard %d: corrupt frame %d dropped with its key entries", self.number, h.base_offset
                )
            txn.delete(k, db=self.frames_db)

    def drop_before(self, start: int) -> int:
        """Delete the frames (and their key entries) wholly below ``start`` in one txn; return bytes freed.

        The LTS snapshot is renewed first when it does not cover what goes.
        """
        t = self.table
        if self.stamper is not None and self.snap_end < min(start, t.end):
            try:
                self.save_snapshot()
            except OSError as exc:
                raise StorageError(
                    f"shard {self.number}: cannot write the LTS snapshot; records are kept"
                ) from exc
        with t.lock:
            start = max(t.start, start)
            doomed = t.doomed_before(start)
            epochs = epochs_after_start(t.epochs, start)
        with self.env.begin(write=True) as txn:
            for h, _ in doomed:
                self._delete_frame(txn, h)
            txn.put(_start_key(self.number), _U64.pack(start), db=self.meta)
            if epochs != t.epochs:
                _put_epochs(txn, self.meta, self.number, epochs)
        if self.config.fsync_policy is not Fsync.ALWAYS:
            self.env.sync(True)
        with t.lock:
            t.epochs = epochs
            return t.drop_before(start)


class LmdbEngine(FrameTableEngine):
    """Frames stored in one LMDB environment per database (``<db dir>/frames/``).

    One named database per shard maps the big-endian base offset to the frame bytes (the
    same encoded frames, and CRCs, as the segment engine); another maps ``(key, offset)``
    to nothing for key lookups; ``meta`` holds each shard's start offset, leader-epoch entries
    (``(epoch, start offset)`` pairs, written in the transaction of the frames that start them;
    no key: every frame has epoch 0) and high watermark (written lazily, like the segment
    engine's: with the next write transaction, when idle, at close). ``truncate_to`` deletes
    frames and key entries and cuts epochs and high watermark in one transaction. Appends go through
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
                sync=config.fsync_policy is Fsync.ALWAYS,
                metasync=config.fsync_policy is Fsync.ALWAYS,
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
                    # Copied inside the txn: its buffers are only valid until it ends.
                    raw_epochs = txn.get(_epochs_key(n), db=meta)
                    epochs = _unpack_epochs(bytes(raw_epochs)) if raw_epochs is not None else []
                    raw_hw = txn.get(_hw_key(n), db=meta)
                    hw = _U64.unpack(bytes(raw_hw))[0] if raw_hw is not None else 0
                table.start = start
                table.end = max(table.end, start)
                # Written in the frames' transactions, so they agree with the frames; the
                # high watermark is capped defensively (it is never written past the end).
                table.epochs = epochs
                table.hw = min(hw, table.end)
                shard.next_offset = table.end
                shards.append(shard)
            engine = cls(config, env, shards, io_pool, executor)
            stamper = engine._streams
            if stamper is not None:
                snapshots = SnapshotFiles(config.directory)
                for shard in shards:
                    shard.stamper = stamper
                    shard.snapshots = snapshots
                    shard.snap_end = recover_shard(
                        stamper,
                        snapshots,
                        shard.number,
                        shard.table.start,
                        shard.table.end,
                        functools.partial(engine._frame_batches, shard.number),
                    )
        except (lmdb.Error, CorruptFrame) as exc:
            env.close()
            raise StorageError(f"cannot load LMDB environment {path}") from exc
        return engine

    def _frame_batches(self, shard: int, offset: int) -> Iterator[tuple[int, pa.RecordBatch]]:
        """``(base, batch)`` of the frames holding ``offset`` and after (at open)."""
        t = self._tables[shard]
        frames = t.span(offset, t.end) if offset < t.end else []
        for i in range(0, len(frames), 256):
            chunk = frames[i : i + 256]
            for (h, _), buf in zip(chunk, self._fetch(shard, chunk), strict=True):
                yield h.base_offset, decode_frame(buf, h)

    def _shard(self, shard: int) -> _LmdbShard:
        self._table(shard)  # checks closed and range
        return self._shards[shard]

    # --- append ------------------------------------------------------------------------

    async def append(self, shard: int, batch: pa.RecordBatch) -> int:
        return (await self.append_many([(shard, batch)]))[0]

    def _encode(
        self,
        gen: int,
        base: int,
        batch: pa.RecordBatch,
        leader_epoch: int,
        producer: tuple[ProducerStamp, int] | None = None,
    ) -> tuple[_Pending, int]:
        frames = []
        stamp = None if producer is None else frame_producer(*producer, 0)
        for frame, part in encode_batch(
            batch, base, compression=self.config.compression, leader_epoch=leader_epoch, producer=stamp
        ):
            frames.append((frame.header, frame_bytes(frame), frame_keys(part, frame.header.base_offset)))
        return _Pending(gen, base, frames), base + batch.num_rows

    async def append_many(
        self,
        parts: Sequence[tuple[int, pa.RecordBatch]],
        quota: Quota | None = None,
        *,
        leader_epoch: int = 0,
        producer: ProducerStamp | None = None,
    ) -> list[int]:
        """Append batches to distinct shards, frames stamped with ``leader_epoch`` (and
        ``producer``); ``quota`` may
        veto before anything is queued. A new epoch's first frame is recorded in the shard's
        epoch entries in the frames' own transaction."""
        shards = [self._shard(n) for n, _ in parts]
        check_leader_epoch(leader_epoch)
        check_writable(shards)
        self._check_not_truncating([n for n, _ in parts])
        stamper = self._streams
        try:
            if stamper is not None:
                parts = [
                    (n, stamp_batch(batch, stamper.stamp(batch.column("topic"), n, s.next_offset)))
                    for s, (n, batch) in zip(shards, parts, strict=True)
                ]
            encoded = [
                self._encode(
                    s.gen, s.next_offset, batch, leader_epoch, None if producer is None else (producer, n)
                )
                for s, (n, batch) in zip(shards, parts, strict=True)
            ]
            sizes = [sum(h.size for h, _d, _k in pending.frames) for pending, _ in encoded]
            if quota is not None:
                quota.admit(sum(sizes))
        except BaseException:
            if stamper is not None:
                for s in shards:
                    stamper.cut(s.number, s.next_offset)
            raise
        return await queue_appends(self._io_pool, shards, encoded, sizes, None, self.listener, admitted=quota)

    async def append_frames(self, shard: int, frames: Any, *, expected_base: int) -> int:
        """Store frames another node encoded, byte for byte, at the end of ``shard``.

        Checked off the loop (magic, lengths, CRC, offset continuity from ``expected_base``),
        then written in one transaction with their key entries and the epoch entries they
        start (each frame keeps its leader epoch), like any append.

        Returns:
            The new end offset.

        Raises:
            OffsetMismatch: ``expected_base`` is not the end, or the frames have a gap or an
                overlap; nothing was written.
            CorruptFrame: A frame fails its checks; nothing was written.
            BusyResourceError: The shard is being truncated.
            StorageError: The write failed; nothing of it is in the log.
        """
        s = self._shard(shard)
        s.check_writable()
        encoded, batches = await self._run(
            functools.partial(parse_frames, frames, expected_base, shard=shard)
        )
        self._check_append_frames(shard, expected_base)  # after the await: the end may have moved
        if self._streams is not None:
            learn_frames(self._streams, shard, encoded, batches)
        pending = _Pending(
            s.gen,
            expected_base,
            [
                (f.header, frame_bytes(f), frame_keys(b, f.header.base_offset))
                for f, b in zip(encoded, batches, strict=True)
            ],
        )
        new_end = int(encoded[-1].header.next_offset)
        await queue_appends(self._io_pool, [s], [(pending, new_end)], [0], None, self.listener)
        return new_end

    def _assigned_end(self, shard: int) -> int:
        return self._shards[shard].next_offset

    def _check_writable(self, shard: int) -> None:
        self._shards[shard].check_writable()

    def _hw_moved(self, shard: int) -> None:
        self._shards[shard].hw_dirty = True

    async def _cut(self, shard: int, offset: int) -> int:
        s = self._shards[shard]
        # On the shard's worker: after every append queued before it, in its own transaction.
        new_end: int = await self._on_worker(s, functools.partial(s.cut, offset))
        s.next_offset = new_end
        return new_end

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
            with self._env.begin(write=True) as txn:  # moved high watermarks (written lazily)
                for s in self._shards:
                    s.take_hw(txn)
            self._env.sync(True)
            for s in self._shards:
                if s.failed is None:
                    s.maybe_snapshot(CLOSE_SNAPSHOT_RECORDS)
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
