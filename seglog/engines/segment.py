"""The ``segment`` engine: segment files + sparse LMDB indexes + the I/O pool.

Offsets are assigned on the event loop when a batch is encoded, and the frames are queued to
the shard's I/O worker in that order, so a shard's file order is its offset order. A shard
whose write fails is failed for good (the offsets queued behind the failure can no longer be
honoured); every later append raises :class:`~seglog.errors.StorageError` until the store is
reopened, which recovers the shard from disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from typing import Any, Final, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from seglog.engines.base import (
    READ_SCHEMA,
    EngineConfig,
    Quota,
    ShardStats,
    empty_read_table,
    retention_start,
)
from seglog.engines.frames import IntervalSync, Maintenance, WriteGenerations, check_writable, queue_appends
from seglog.engines.frames import split_batch as _split
from seglog.engines.frames import with_offsets as _with_offsets
from seglog.errors import ClosedResourceError, CorruptFrame, InvalidArgument, OffsetOutOfRange, StorageError
from seglog.index import INDEX_DIR, DbIndex, FrameEntry, ShardIndex
from seglog.io_pool import IoPool
from seglog.record import (
    FRAME_HEADER_BYTES,
    EncodedFrame,
    decode_body,
    encode_frame,
    parse_header,
    verify_frame,
)
from seglog.segment import FramePosition, LogSegment, ShardLog
from seglog.segment.shard_log import AppendMark

__all__ = ["SegmentEngine", "SegmentRange", "shard_dir_name"]

log = logging.getLogger("seglog.engines.segment")

def shard_dir_name(shard: int) -> str:
    """Directory name of a shard inside a database directory."""
    return f"shard-{shard:04d}"


class SegmentRange(NamedTuple):
    """One local segment of a shard, for tiering: readable offsets ``[start, end)``."""

    start: int
    end: int
    size: int
    sealed: bool
    max_ts: int | None


class _PendingFrames(NamedTuple):
    gen: int  # the shard's write generation when the offsets were assigned
    frames: list[EncodedFrame]
    keys: list[pa.Array]  # each frame's key column (the index takes its distinct keys)
    tags: list[list[int]]


class _Shard(WriteGenerations):
    """One shard: its log, its index and its write state (a :class:`BatchWriter`).

    A failed write is rolled back (:meth:`ShardLog.rollback`) before its callers hear of it,
    and the shard keeps taking writes: offsets assigned behind the failure are refused and
    the next offsets continue from the durable end (see :class:`WriteGenerations`). Only when
    the rollback itself fails, or an ``interval`` sync fails (acknowledged data may be lost),
    does the shard become read-only until the store is reopened.
    """

    def __init__(self, number: int, log_: ShardLog, index: ShardIndex, config: EngineConfig) -> None:
        super().__init__(log_.next_offset)
        self.number = number
        self.log = log_
        self.index = index
        self.config = config
        self.durable_end = log_.next_offset  # acknowledged (worker thread)
        self.maintenance = Maintenance()
        self._interval = IntervalSync(config.fsync_interval_ms)
        # Frames the index has not taken yet (its write failed): caught up from the segments.
        self.index_lagging = False
        # The index disagreed with the segments: rebuilt from scratch on the worker.
        self.index_suspect = False

    # BatchWriter -----------------------------------------------------------------------

    def write_batch(self, items: Sequence[_PendingFrames]) -> Sequence[Any]:
        live, results = self.split_stale(items)
        if not live:
            return results
        frames = [f for item in live for f in item.frames]
        if frames[0].header.base_offset != self.log.next_offset:
            raise StorageError(
                f"shard {self.number}: frames at {frames[0].header.base_offset} do not continue the log "
                f"at {self.log.next_offset}"
            )
        mark = self.log.mark()
        syncing = False
        try:
            positions = self.log.append(frames)
            syncing = True
            self._sync_per_policy()
        except OSError as exc:
            self._undo(mark, live[0].gen, exc, sync_failed=syncing)
            raise StorageError(f"write to shard {self.number} failed; nothing of it was kept") from exc
        self.durable_end = positions[-1].header.next_offset
        try:
            self.log.publish_durable_end()
        except OSError as exc:
            # The batch is durable, so it is acknowledged; but followers would no longer see
            # the log grow, so the shard takes no more writes until reopen.
            self.make_read_only(exc, "publishing its durable end failed")
        self._index(live, positions)
        return self.merge_results(results, [item.frames[0].header.base_offset for item in live])

    def _undo(self, mark: AppendMark, gen: int, exc: OSError, *, sync_failed: bool) -> None:
        """Roll a failed write back, or make the shard read-only if that fails too."""
        try:
            self.log.rollback(mark)
        except OSError as undo_exc:
            self.make_read_only(undo_exc, "a write it could not undo")
            try:
                self.log.fence(mark)
            except OSError:
                log.error("shard %d: the durable-end fence could not be written either; a reopen in this "
                          "process still removes the failed write, a restart of the process may not", self.number)
            return
        log.warning("shard %d: write failed (%s); rolled back to offset %d", self.number, exc, self.durable_end)
        self.rewind(gen, self.durable_end)
        if sync_failed and self._interval.pending:
            self._interval_sync_failed(exc)

    def _index(self, items: Sequence[_PendingFrames], positions: Sequence[FramePosition]) -> None:
        try:
            if self.index_suspect:
                self.index.reset()
                self.index_suspect = False
                self.index_lagging = True
            if self.index_lagging:
                _catch_up_index(self)
                self.index_lagging = False
                return  # the catch-up read these frames from the segments too
            entries = []
            i = 0
            for item in items:
                for keys, tags in zip(item.keys, item.tags, strict=True):
                    entries.append(_entry(positions[i], keys, tags))
                    i += 1
            self.index.add(entries)
        except (StorageError, CorruptFrame, OSError):
            # The data is durable and acknowledged; the index is derived and caught up later.
            self.index_lagging = True
            log.exception("shard %d: index write failed; it catches up on the next write", self.number)

    def sync_deadline(self) -> float | None:
        return None if self.failed is not None else self._interval.deadline()

    def flush_idle(self) -> None:
        if self._interval.pending and self.failed is None:
            try:
                self.log.sync()
            except OSError as exc:
                self._interval_sync_failed(exc)
                return
            self._interval.synced()
        self.rebuild_index()

    def _interval_sync_failed(self, exc: OSError) -> None:
        # Acknowledged writes were in that sync: the kernel may have dropped their pages.
        self.make_read_only(exc, "a failed fsync (acknowledged writes since the last sync may be lost)")

    def _sync_per_policy(self) -> None:
        policy = self.config.fsync
        if policy == "always":
            self.log.sync()
        elif policy == "interval" and self._interval.due():
            self.log.sync()
            self._interval.synced()
        # "never": the OS writes back when it likes; seal and close still fsync.

    # maintenance (the shard's I/O worker) ---------------------------------------------

    def drop_before(self, start: int) -> int:
        """Move the log start to ``start``; delete what it covers; return the bytes freed."""
        doomed = self.log.drop_before(start)
        try:
            self.index.delete_below(self.log.log_start_offset)
        except Exception:  # derived data: a stale entry is skipped by lookups
            log.exception("shard %d: index cleanup below %d failed", self.number, self.log.log_start_offset)
        return sum(seg.size for seg in doomed)

    def retention_start(
        self, retention_bytes: int | None, retention_ms: int | None, now_us: int, floor: int | None
    ) -> int | None:
        """The start offset retention allows (whole sealed segments only), ``None``: no change."""
        segments = self.log.segments_snapshot()
        units = (
            (seg.next_offset, seg.size, seg.largest_ts() if retention_ms is not None else None)
            for seg in segments[:-1]
        )
        total = sum(seg.size for seg in segments)
        return retention_start(units, total, retention_bytes, retention_ms, now_us, floor)

    def enforce_retention(
        self, retention_bytes: int | None, retention_ms: int | None, now_us: int, floor: int | None
    ) -> int:
        start = self.retention_start(retention_bytes, retention_ms, now_us, floor)
        if start is None or start <= self.log.log_start_offset:
            return 0
        return self.drop_before(start)

    # reading (any thread) --------------------------------------------------------------

    def locate(self, offset: int) -> tuple[LogSegment, int]:
        """The segment holding ``offset`` and a frame position at or before it.

        An index entry that does not point at a frame of its offset marks the index suspect
        (rebuilt on the worker) and the segment is scanned from its start instead.
        """
        seg = self.log.segment_for(offset)
        if self.index_suspect:
            return seg, 0
        try:
            floor = self.index.floor(offset)
        except StorageError as exc:
            self.suspect(f"lookup failed: {exc}")
            return seg, 0
        if floor is not None and floor[1].segment_base == seg.base_offset:
            base, pos = floor[0], floor[1].pos
            if _frame_starts_at(seg, pos, base):
                return seg, pos
            self.suspect(f"entry for offset {base} points at no such frame ({seg.path.name} position {pos})")
        return seg, 0

    def suspect(self, reason: str) -> None:
        """(Any thread) The index disagrees with the segments: stop trusting it, rebuild it."""
        if not self.index_suspect:
            log.warning("shard %d: index is wrong (%s); reading from the segments and rebuilding it",
                        self.number, reason)
            self.index_suspect = True

    def rebuild_index(self) -> None:
        """(Worker) Rebuild a suspect or lagging index now."""
        if self.failed is None and (self.index_lagging or self.index_suspect):
            self._index([], [])

    def frames(self, offset: int, end: int) -> Iterator[FramePosition]:
        """Frames from the one holding ``offset`` up to ``end`` (exclusive)."""
        seg, pos = self.locate(offset)
        for fp in self.log.frames_from(seg, pos, end):
            if fp.header.next_offset > offset:
                yield fp

    def decode(self, fp: FramePosition) -> pa.RecordBatch:
        buf = fp.segment.view(fp.pos, fp.pos + fp.header.size)
        verify_frame(buf, 0, fp.header)
        return decode_body(buf, 0, fp.header)


def _entry(p: FramePosition, keys: pa.Array, tags: list[int]) -> FrameEntry:
    h = p.header
    return FrameEntry(h.base_offset, h.next_offset, h.max_ts, p.segment.base_offset, p.pos, h.size, keys, tags)


# Frames whose rows read_key filters in one pyarrow call: per-call overhead exceeds a frame's
# filtering, so frames are batched; the bound keeps decompressed frames' memory in check.
_KEY_FILTER_FRAMES: Final = 64


# A candidate frame at most this many frames ahead is reached by reading the headers in
# between rather than by an index lookup.
_KEY_WALK_FRAMES: Final = 16


def _key_rows(parts: list[tuple[pa.RecordBatch, int]], key: bytes) -> pa.Table:
    """The rows of ``parts`` (frame batches and the offset of their first row) whose key is ``key``."""
    table = pa.Table.from_batches([b for b, _ in parts])
    keep = pc.fill_null(pc.equal(table.column(2), pa.scalar(key, pa.binary())), False)
    rows = np.flatnonzero(keep.to_numpy())
    offsets = np.concatenate([np.arange(first, first + b.num_rows, dtype=np.int64) for b, first in parts])
    # take, not filter: filtering a many-chunk table (its map column above all) costs more.
    picked = table.take(pa.array(rows))
    return pa.Table.from_arrays([pa.array(offsets[rows]), *picked.columns], schema=READ_SCHEMA)


def _frames_holding(s: _Shard, offsets: Sequence[int], end: int) -> Iterator[FramePosition | None]:
    """For each of the ascending ``offsets``, the frame holding it (``None``: none below ``end``).

    Nearby frames are reached by walking the headers from the previous one; farther ones are
    located through the index (and checked against the segment, see :meth:`_Shard.locate`).
    """
    it: Iterator[FramePosition] | None = None
    fp: FramePosition | None = None
    for offset in offsets:
        h = fp.header if fp is not None else None
        if it is None or h is None or offset < h.base_offset or (
            offset >= h.next_offset and offset - h.next_offset > _KEY_WALK_FRAMES * (h.next_offset - h.base_offset)
        ):
            it = s.frames(offset, end)
            fp = next(it, None)
        else:
            while fp is not None and fp.header.next_offset <= offset:
                fp = next(it, None)
        yield fp


def _frame_starts_at(seg: LogSegment, pos: int, base_offset: int) -> bool:
    """Whether a valid frame header with ``base_offset`` starts at ``pos`` of ``seg``."""
    if pos < 0 or pos + FRAME_HEADER_BYTES > seg.size:
        return False
    try:
        return parse_header(seg.view(pos, pos + FRAME_HEADER_BYTES), 0).base_offset == base_offset
    except CorruptFrame:
        return False


def _frame_tags(batch: pa.RecordBatch) -> list[int]:
    streams = batch.column(5)
    mm = pc.min_max(streams)
    lo, hi = mm["min"].as_py(), mm["max"].as_py()
    if lo == hi:
        return [lo]
    return sorted(pc.unique(streams).to_pylist())


class SegmentEngine:
    """Segment files per shard, LMDB indexes, writes through the shared :class:`IoPool`."""

    name: Final = "segment"

    def __init__(
        self, config: EngineConfig, shards: list[_Shard], io_pool: IoPool, executor: Executor, index: DbIndex
    ) -> None:
        self.config = config
        self._shards = shards
        self._index = index  # every shard's index, one LMDB environment
        self._io_pool = io_pool
        self._executor = executor
        self._closed = False
        self._repairs: dict[int, asyncio.Future[Any]] = {}
        # Called on the event loop with the shard number when an append to it completed.
        self.listener: Callable[[int], None] | None = None

    @classmethod
    def open_blocking(cls, config: EngineConfig, io_pool: IoPool, executor: Executor) -> SegmentEngine:
        """Open or create every shard: recover segments, then bring indexes up to date."""
        clock_ms: Callable[[], int] = lambda: config.clock_us() // 1000  # noqa: E731
        db_index = DbIndex(config.directory / INDEX_DIR, index_interval_bytes=config.index_interval_bytes)
        shards = []
        try:
            for n in range(config.shards):
                directory = config.directory / shard_dir_name(n)
                log_, _report = ShardLog.open(
                    directory, segment_bytes=config.segment_bytes, segment_ms=config.segment_ms, clock_ms=clock_ms
                )
                # A shard's own index (the layout before indexes were shared) is removed.
                index = db_index.shard(n, legacy_dir=directory / INDEX_DIR)
                shard = _Shard(n, log_, index, config)
                _catch_up_index(shard)
                shards.append(shard)
        except BaseException:
            with contextlib.suppress(StorageError):
                db_index.close()  # let go of the environment (its lock and map)
            raise
        return cls(config, shards, io_pool, executor, db_index)

    def _shard(self, shard: int) -> _Shard:
        if self._closed:
            raise ClosedResourceError("the database is closed")
        if not 0 <= shard < len(self._shards):
            raise InvalidArgument(f"shard {shard} out of range 0..{len(self._shards) - 1}")
        return self._shards[shard]

    def start_offset(self, shard: int) -> int:
        return self._shard(shard).log.log_start_offset

    def end_offset(self, shard: int) -> int:
        return self._shard(shard).durable_end

    # --- append ------------------------------------------------------------------------

    async def append(self, shard: int, batch: pa.RecordBatch) -> int:
        return (await self.append_many([(shard, batch)]))[0]

    def _encode(self, gen: int, base: int, batch: pa.RecordBatch) -> tuple[_PendingFrames, int]:
        frames: list[EncodedFrame] = []
        keys: list[pa.Array] = []
        tags: list[list[int]] = []
        offset = base
        for part in _split(batch):
            frames.append(encode_frame(part, offset, compression=self.config.compression))
            keys.append(part.column(2))
            tags.append(_frame_tags(part))
            offset += part.num_rows
        return _PendingFrames(gen, frames, keys, tags), offset

    async def append_many(self, parts: Sequence[tuple[int, pa.RecordBatch]], quota: Quota | None = None) -> list[int]:
        """Append batches to distinct shards; ``quota`` may veto before anything is queued."""
        shards = [self._shard(n) for n, _ in parts]
        check_writable(shards)
        # Encoding, admission and offset assignment run without awaiting: no interleaving.
        encoded = [
            self._encode(s.gen, s.next_offset, batch) for s, (_, batch) in zip(shards, parts, strict=True)
        ]
        sizes = [sum(f.size for f in pending.frames) for pending, _ in encoded]
        return await queue_appends(self._io_pool, shards, encoded, sizes, quota, self.listener)

    # --- reads -------------------------------------------------------------------------

    def _check_range(self, s: _Shard, offset: int) -> int:
        end = s.durable_end
        start = s.log.log_start_offset
        if not start <= offset <= end:
            raise OffsetOutOfRange(offset, start, end, shard=s.number)
        return end

    def read_arrow_blocking(self, shard: int, offset: int, max_records: int) -> pa.Table:
        """Blocking body of :meth:`read_arrow` (runs in the read executor)."""
        s = self._shard(shard)
        end = self._check_range(s, offset)
        if max_records < 1:
            raise InvalidArgument("max_records must be >= 1")
        stop = min(end, offset + max_records)
        if offset >= stop:
            return empty_read_table()
        out: list[pa.RecordBatch] = []
        try:
            for fp in s.frames(offset, stop):
                h = fp.header
                batch = s.decode(fp)
                lo = max(offset, h.base_offset) - h.base_offset
                hi = min(stop, h.next_offset) - h.base_offset
                out.append(_with_offsets(batch, h.base_offset, lo, hi))
        except CorruptFrame as exc:
            raise StorageError(f"shard {shard}: corrupt frame while reading offset {offset}") from exc
        return pa.Table.from_batches(out, schema=READ_SCHEMA)

    async def read_arrow(self, shard: int, offset: int, max_records: int) -> pa.Table:
        try:
            return await self._run(self.read_arrow_blocking, shard, offset, max_records)
        finally:
            self._repair_if_needed(shard)

    def offset_for_time_blocking(self, shard: int, ts: int) -> int:
        """Blocking body of :meth:`offset_for_time`."""
        s = self._shard(shard)
        end = s.durable_end
        start = s.log.log_start_offset
        lower = None
        if not s.index_suspect:
            try:
                lower = s.index.time_lower_bound(ts)
            except StorageError as exc:
                s.suspect(f"time lookup failed: {exc}")
        begin = start if lower is None else max(start, lower)
        if begin >= end:
            return end
        for fp in s.frames(begin, end):
            h = fp.header
            if h.max_ts < ts:
                continue
            batch = s.decode(fp)
            first_row = max(begin, h.base_offset) - h.base_offset
            mask = pc.greater_equal(batch.column(0).slice(first_row), ts)
            idx = int(pc.index(mask, True).as_py())
            if idx >= 0:
                return h.base_offset + first_row + idx
        return end

    async def offset_for_time(self, shard: int, ts: int) -> int:
        try:
            offset: int = await self._run(self.offset_for_time_blocking, shard, ts)
        finally:
            self._repair_if_needed(shard)
        return offset

    def read_key_blocking(self, shard: int, key: bytes) -> pa.Table:
        """Blocking body of :meth:`read_key`.

        Frames the index names (below ``indexed_end``) are read and filtered by the key;
        frames it has not taken yet (a failed index write) or all frames (a suspect index)
        are scanned.
        """
        s = self._shard(shard)
        end = s.durable_end
        start = s.log.log_start_offset
        scan_from = start
        bases: list[int] = []
        if not s.index_suspect:
            indexed_end = s.index.indexed_end  # before the lookup: later entries are scanned
            try:
                found = s.index.key_frames(key, start=start)
            except StorageError as exc:
                s.suspect(f"key lookup failed: {exc}")
            else:
                scan_from = max(start, min(indexed_end, end))
                bases = [b for b in found if b < scan_from]
        out: list[pa.Table] = []
        parts: list[tuple[pa.RecordBatch, int]] = []

        def take(fp: FramePosition, first: int) -> None:
            parts.append((s.decode(fp).slice(first - fp.header.base_offset), first))
            if len(parts) >= _KEY_FILTER_FRAMES:
                out.append(_key_rows(parts, key))
                parts.clear()

        for base, fp in zip(bases, _frames_holding(s, [max(b, start) for b in bases], scan_from), strict=True):
            if fp is None or fp.header.base_offset != base:
                if base < start:
                    continue  # wholly below the start: gone with retention (one reaching past it is read)
                s.suspect(f"key entry for frame {base} points at no such frame")
                return self.read_key_blocking(shard, key)  # a full scan now
            take(fp, max(base, start))
        if scan_from < end:
            for fp in s.frames(scan_from, end):
                take(fp, max(scan_from, fp.header.base_offset))
        if parts:
            out.append(_key_rows(parts, key))
        return pa.concat_tables(out) if out else empty_read_table()

    async def read_key(self, shard: int, key: bytes) -> pa.Table:
        try:
            return await self._run(self.read_key_blocking, shard, key)
        finally:
            self._repair_if_needed(shard)

    def _repair_if_needed(self, shard: int) -> None:
        """Queue an index rebuild on the shard's worker when a read found the index wrong."""
        if self._closed or not 0 <= shard < len(self._shards):
            return
        s = self._shards[shard]
        if not s.index_suspect or shard in self._repairs:
            return
        try:
            task = asyncio.ensure_future(self._on_worker(s, s.rebuild_index))
        except ClosedResourceError:
            return
        self._repairs[shard] = task
        task.add_done_callback(functools.partial(self._repaired, shard))

    def _repaired(self, shard: int, task: asyncio.Future[Any]) -> None:
        self._repairs.pop(shard, None)
        if not task.cancelled() and task.exception() is not None:
            log.warning("shard %d: index rebuild failed: %s", shard, task.exception())

    def stats(self, shard: int) -> ShardStats:
        s = self._shard(shard)
        segments = s.log.segments_snapshot()
        return ShardStats(shard, s.log.log_start_offset, s.durable_end, len(segments), sum(x.size for x in segments))

    def segment_ranges(self, shard: int, *, with_ts: bool = False) -> list[SegmentRange]:
        """The local segments of ``shard``, oldest first (``max_ts`` only with ``with_ts``;
        it may scan the headers of segments trusted at open, so call it off the loop then)."""
        s = self._shard(shard)
        segments = s.log.segments_snapshot()
        start = s.log.log_start_offset
        last = len(segments) - 1
        return [
            SegmentRange(
                max(seg.base_offset, start),
                seg.next_offset,
                seg.size,
                i < last,
                seg.largest_ts() if with_ts else None,
            )
            for i, seg in enumerate(segments)
        ]

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fn, *args)

    # --- lifecycle ---------------------------------------------------------------------

    # --- maintenance --------------------------------------------------------------------

    async def _on_worker(self, s: _Shard, fn: Callable[[], Any]) -> Any:
        return await self._io_pool.submit(s.number, s.maintenance, fn)

    async def seal(self, shard: int) -> bool:
        """Seal the active segment of ``shard`` if it holds data (a new empty one follows).

        Runs on the shard's I/O worker, after every append queued before it.

        Returns:
            Whether a segment was sealed.
        """
        s = self._shard(shard)

        def roll() -> bool:
            if s.log.active.size == 0:
                return False
            s.log.roll()
            return True

        sealed: bool = await self._on_worker(s, roll)
        return sealed

    async def truncate_before(self, shard: int, offset: int) -> int:
        """Make ``offset`` the first readable offset (never lowers it); return bytes freed.

        Raises:
            OffsetOutOfRange: ``offset`` is past the end offset.
        """
        s = self._shard(shard)
        end = s.durable_end
        if offset > end:
            raise OffsetOutOfRange(offset, s.log.log_start_offset, end, shard=shard)
        freed: int = await self._on_worker(s, lambda: s.drop_before(offset))
        return freed

    async def enforce_retention(
        self,
        retention_bytes: int | None,
        retention_ms: int | None,
        now_us: int,
        floors: Sequence[int | None],
    ) -> int:
        """Drop whole sealed segments past retention, never at/above ``floors[shard]``; return bytes freed."""
        if retention_bytes is None and retention_ms is None:
            return 0
        freed = await asyncio.gather(*(
            self._on_worker(s, functools.partial(
                s.enforce_retention, retention_bytes, retention_ms, now_us, floors[s.number]))
            for s in self._shards
        ))
        return sum(freed)

    def reconfigure(self, *, segment_bytes: int, segment_ms: int) -> None:
        """Apply new segment rolling settings (they take effect on the next append)."""
        for s in self._shards:
            s.log.segment_bytes = segment_bytes
            s.log.segment_ms = segment_ms

    async def drain(self) -> None:
        """Wait until every append queued so far has completed."""
        if self._closed:
            return
        with contextlib.suppress(ClosedResourceError):  # a closed pool is drained
            await asyncio.gather(*(self._on_worker(s, lambda: None) for s in self._shards))

    def disk_bytes(self) -> int:
        """Bytes of the segment files (fast, from memory)."""
        return sum(s.log.size_bytes() for s in self._shards)

    def close_blocking(self) -> None:
        """Checkpoint and close every shard (after the I/O pool drained)."""
        if self._closed:
            return
        self._closed = True
        errors: list[BaseException] = []
        for close in [*(s.log.close for s in self._shards), self._index.close]:
            try:
                close()
            except (OSError, StorageError) as exc:
                errors.append(exc)
        if errors:
            raise StorageError("closing the engine failed") from errors[0]

    async def close(self) -> None:
        await self._run(self.close_blocking)



def _catch_up_index(s: _Shard) -> None:
    """Cut index entries past the log end and index frames the index has not seen."""
    end = s.log.next_offset
    start = s.log.log_start_offset
    if s.index.indexed_end > end:
        log.warning("shard %d: index ran ahead of the log (%d > %d); cutting it back",
                    s.number, s.index.indexed_end, end)
        s.index.truncate_from(end)
    begin = max(s.index.indexed_end, start)
    if begin >= end:
        return
    log.info("shard %d: indexing offsets %d..%d from the segments", s.number, begin, end)
    seg = s.log.segment_for(begin)
    pos = 0
    floor = s.index.floor(begin)
    if floor is not None and floor[1].segment_base == seg.base_offset:
        pos = floor[1].pos
    pending: list[FrameEntry] = []
    for fp in s.log.frames_from(seg, pos, end):
        if fp.header.next_offset <= begin:
            continue
        batch = s.decode(fp)
        pending.append(_entry(fp, batch.column(2), _frame_tags(batch)))
        if len(pending) >= 1024:
            s.index.add(pending)
            pending = []
    s.index.add(pending)
