"""The ``segment`` engine: segment files + sparse LMDB indexes + the I/O pool + journals.

Offsets are assigned on the event loop and the requests are queued to each shard's I/O worker
in that order, so a shard's file order is its offset order. The write path (one journal and
one fdatasync per worker drain, pending rows, rollback of a failed drain) is in
:mod:`seglog.engines.segment_writer`; this module owns the shards, reads and maintenance.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, Final, NamedTuple, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from seglog.engines.base import (
    READ_SCHEMA,
    EngineConfig,
    GenerationInfo,
    Quota,
    ReadOnlyReason,
    ShardStats,
    StreamBatch,
    StreamRead,
    empty_read_table,
    retention_start,
)
from seglog.engines.frames import (
    Maintenance,
    await_outcomes,
    check_frames_continue,
    encode_batch,
    frame_producer,
    parse_frames,
    raise_if_failed,
)
from seglog.engines.frames import with_offsets as _with_offsets
from seglog.engines.generations import GenerationLog, GenerationLookups
from seglog.engines.pending_rows import PendingPart, ShardArrays
from seglog.engines.segment_writer import (
    TAILED_S,
    FrameRequest,
    RowsRequest,
    WorkerLog,
    journal_path,
    replay_journals,
)
from seglog.engines.streams import (
    CLOSE_SNAPSHOT_RECORDS,
    SnapshotFiles,
    StreamCollector,
    learn_frames,
    recover_shard,
    snapshot_interval,
    stamp_batch,
)
from seglog.errors import (
    BusyResourceError,
    ClosedResourceError,
    CorruptFrame,
    CorruptLTS,
    InvalidArgument,
    OffsetOutOfRange,
    StorageError,
)
from seglog.index import INDEX_DIR, DbIndex, FrameEntry, IndexPosition, ShardIndex
from seglog.io_pool import IoPool
from seglog.record import (
    FRAME_HEADER_BYTES,
    EncodedFrame,
    FrameHeader,
    decode_body,
    is_zero_streams,
    parse_header,
    verify_frame,
)
from seglog.segment import FramePosition, LogSegment, ShardLog, open_shard_log
from seglog.segment.epoch_cache import MAX_EPOCH, UNDEFINED_EPOCH, UNDEFINED_OFFSET, LeaderEpochCache
from seglog.segment.high_watermark import HighWatermarkCheckpoint, HighWatermarkWriter
from seglog.segment.journal import Journal, JournalGrower
from seglog.segment.log_segment import SEGMENT_SUFFIX
from seglog.segment.producer_state import ProducerColumns, ProducerStamp
from seglog.segment.writeback import SegmentWriteback
from seglog.topics.lts import LTS
from seglog.topics.streams import StreamStamper, distinct_streams

_T = TypeVar("_T")

__all__ = ["SegmentEngine", "SegmentRange", "shard_dir_name"]

log = logging.getLogger("seglog.engines.segment")

# Reads of frames of the active segment up to this size run on the event loop (read_frames).
_INLINE_READ_BYTES: Final = 1 << 20
# Frames a follower fetched are checked (CRC, offsets, body decode) on the event loop up to
# this size: a replication round's tail (tens of KiB) takes ~15 us for 18 KiB, less than the
# hop to a thread and back (~50 us idle, and one more wake-up to be scheduled for on a busy
# machine) on the acks="all" critical path. A catch-up fetch's larger data goes to a thread.
_INLINE_PARSE_BYTES: Final = 256 << 10
# Where the last reads of a shard's frames ended, kept per shard: each tailing reader (every
# follower of a leader, a consumer) continues where its own last read ended, so a leader's
# two followers and a consumer each find theirs.
_READ_HINTS: Final = 8


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


class _Shard:
    """One shard: its log, its index, its pending rows and its offsets.

    ``next_offset`` is the event loop's (the next offset to assign); ``durable_end`` the
    worker's (acknowledged); rows from ``pending_start`` on are acknowledged but still in the
    worker's buffer, not the segment (:mod:`seglog.engines.pending_rows`). All three live in
    the database's :class:`ShardArrays`.
    """

    def __init__(
        self,
        number: int,
        log_: ShardLog,
        index: ShardIndex,
        config: EngineConfig,
        arrays: ShardArrays,
    ) -> None:
        self.number = number
        self.log = log_
        self.index = index
        self.config = config
        # Every shard's positions in arrays the engine updates in one numpy step per append.
        self._arrays = arrays
        self.next_offset = log_.next_offset  # event loop
        self.durable_end = log_.next_offset  # acknowledged (worker thread)
        self.maintenance = Maintenance()
        self.writer: WorkerLog | None = None
        # time.monotonic() of the last read of frames (event loop): a shard read lately is
        # being tailed, and a flush for another shard's read takes its buffered rows too.
        self.frames_read_at = -TAILED_S
        # Frames the index has not taken yet (its write failed): caught up from the segments.
        self.index_lagging = False
        # The index disagreed with the segments: rebuilt from scratch on the worker.
        self.index_suspect = False
        # Leader epochs: an empty cache means every frame has epoch 0 (a standalone store
        # never writes the file); the high watermark is kept lazily (Kafka's checkpoint).
        self.epochs = LeaderEpochCache(log_.directory)
        self.hw = HighWatermarkCheckpoint(log_.directory)
        # Streams: the database's stamper (None: no streams), the snapshot files, and the
        # offset this shard's snapshot covers up to (worker thread).
        self.streams: StreamStamper | None = None
        self.snapshots: SnapshotFiles | None = None
        self.snap_end = 0
        # Where the last reads of frames ended, newest first: (offset, segment, position)
        # of the frame a tailing reader asks for next (any thread: the tuple is replaced,
        # never changed; checked against the segment when used).
        self.read_ends: tuple[tuple[int, LogSegment, int], ...] = ()

    def read_hint(self, offset: int) -> tuple[LogSegment, int] | None:
        """The segment and position where a read of frames ended at ``offset``, if known."""
        for at, seg, pos in self.read_ends:
            if at == offset:
                return seg, pos
        return None

    def note_read_end(self, offset: int, seg: LogSegment, pos: int) -> None:
        """A read of frames ended at ``offset``: the frame there starts at ``pos`` of ``seg``."""
        kept = [h for h in self.read_ends if h[0] != offset]
        self.read_ends = ((offset, seg, pos), *kept[: _READ_HINTS - 1])

    def tail_bytes(self, offset: int) -> int | None:
        """Bytes of the active segment from the frame at ``offset`` on, when a read ended
        there (``None``: unknown, the frame must be looked up)."""
        hint = self.read_hint(offset)
        if hint is None or hint[0] is not self.log.active:
            return None
        return max(0, hint[0].size - hint[1])

    def save_snapshot(self, upto: int | None = None) -> None:
        """(Worker) Write the shard's LTS snapshot covering the records below ``upto``
        (default: the durable end; never above it: nothing below it is rolled back).

        Raises:
            OSError: The file could not be written (the old one stays).
        """
        if self.streams is None or self.snapshots is None:
            return
        upto = self.durable_end if upto is None else upto
        self.snapshots.save(self.number, self.streams.snapshot(self.number, upto))
        self.snap_end = upto

    def maybe_snapshot(self, behind: int | None = None) -> None:
        """(Worker) Renew the snapshot once it is ``behind`` records behind the durable end."""
        if behind is None:
            behind = snapshot_interval()
        if self.streams is None or self.durable_end - self.snap_end < behind:
            return
        try:
            self.save_snapshot()
        except OSError as exc:  # only costs replay time at the next open
            log.warning("shard %d: writing the LTS snapshot failed (%s)", self.number, exc)

    @property
    def known_epoch(self) -> int:
        """The latest leader epoch the shard's cache knows (0 when it is empty)."""
        latest = self.epochs.latest_epoch()
        return 0 if latest is None else latest

    def assign_epoch(self, epoch: int, start_offset: int) -> None:
        """(Worker) Record that ``epoch``'s frames start at ``start_offset`` (persisted)."""
        if not self.epochs.entries() and start_offset > self.log.log_start_offset:
            self.epochs.assign(0, self.log.log_start_offset)  # what the empty cache implied
        self.epochs.assign(epoch, start_offset)

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """Kafka's OffsetsForLeaderEpoch answer for ``epoch``: ``(epoch found, its end offset)``."""
        end = self.durable_end
        if not self.epochs.entries():  # every frame has epoch 0
            return (0, end) if epoch == 0 else (UNDEFINED_EPOCH, UNDEFINED_OFFSET)
        return self.epochs.end_offset_for_epoch(epoch, end)

    def reconcile_epochs(self) -> None:
        """(Open) Make the epoch cache agree with the recovered log.

        Entries at or past the log end are dropped (the log was cut after they were
        written); entries missing for epochs the frames carry (a crash between a durable
        write and the cache write) are rebuilt by scanning from the last known entry; the
        high watermark is capped at the log end.
        """
        end = self.log.next_offset
        entries = self.epochs.entries()
        if entries and entries[-1][1] >= end:
            self.epochs.truncate_from_end(end)
            entries = self.epochs.entries()
        start = self.log.log_start_offset
        if len(entries) > 1 and entries[1][1] <= start:
            self.epochs.truncate_from_start(start)
            entries = self.epochs.entries()
        last = self.log.last_header()
        begin = max(entries[-1][1] if entries else start, start)
        if last is not None and last.leader_epoch > self.known_epoch and begin < end:
            known = self.known_epoch
            for fp in self.log.frames_from(*self.locate(begin), end):
                if fp.header.leader_epoch > known:
                    self.assign_epoch(fp.header.leader_epoch, fp.header.base_offset)
                    known = fp.header.leader_epoch
        if self.hw.value > end:
            self.hw.reset(end)

    @property
    def next_offset(self) -> int:
        """The next offset to assign (event loop)."""
        return int(self._arrays.next_offsets[self.number])

    @next_offset.setter
    def next_offset(self, offset: int) -> None:
        self._arrays.next_offsets[self.number] = offset

    @property
    def durable_end(self) -> int:
        """The end of what was acknowledged (set by the worker)."""
        return int(self._arrays.durable_ends[self.number])

    @durable_end.setter
    def durable_end(self, offset: int) -> None:
        self._arrays.durable_ends[self.number] = offset

    @property
    def pending_start(self) -> int:
        """The first offset buffered in the worker and not in the segment yet (-1: none)."""
        return int(self._arrays.pending_starts[self.number])

    @property
    def has_pending(self) -> bool:
        """Whether acknowledged rows of this shard wait in its worker's buffer."""
        return bool(self._arrays.pending_starts[self.number] >= 0)

    def check_writable(self) -> None:
        """Raise :class:`StorageError` if the shard is read-only."""
        if self.writer is not None:
            self.writer.check_writable(self.number)

    def index_frames(self, frames: Sequence[tuple[FramePosition, pa.RecordBatch]]) -> None:
        """(Worker) Index frames just written (or catch a lagging/suspect index up)."""
        try:
            if self.index_suspect:
                self.index.reset()
                self.index_suspect = False
                self.index_lagging = True
            if self.index_lagging:
                _catch_up_index(self)
                self.index_lagging = False
                return  # the catch-up read these frames from the segments too
            self.index.add(self.frame_entries(frames))
        except (StorageError, CorruptFrame, OSError) as exc:
            # The data is durable and acknowledged; the index is derived and caught up later.
            # (No traceback kept: its frames would pin segment mappings.)
            self.index_lagging = True
            log.error(
                "shard %d: index write failed (%s: %s); it catches up on the next write",
                self.number,
                type(exc).__name__,
                exc,
            )

    @property
    def index_ready(self) -> bool:
        """Whether new frames can go straight into the index (it is neither lagging nor suspect)."""
        return not (self.index_lagging or self.index_suspect)

    @staticmethod
    def frame_entries(frames: Sequence[tuple[FramePosition, pa.RecordBatch]]) -> list[FrameEntry]:
        """The index entries of frames just written."""
        return [_entry(p, batch.column("key"), _frame_tags(batch)) for p, batch in frames]

    def pending_snapshot(self, stop: int, lower: int = 0) -> tuple[int, list[tuple[int, pa.RecordBatch]]]:
        """``(first pending offset or stop, [(base, rows)])``: the segments hold all below the first.

        Read ``durable_end`` before taking it (``stop``): a flush writes the segment before it
        forgets the rows, so everything below ``stop`` is in one or the other. Rows wholly
        below ``lower`` may be left out.
        """
        if self.writer is None or self.pending_start < 0:
            return stop, []
        return self.writer.pending_snapshot(self, stop, lower)

    @staticmethod
    def pending_tables(
        pending: list[tuple[int, pa.RecordBatch]], offset: int, stop: int
    ) -> list[pa.RecordBatch]:
        """Rows ``[offset, stop)`` of a pending snapshot (:data:`READ_SCHEMA` batches)."""
        out = []
        for base, batch in pending:
            end = base + batch.num_rows
            if end <= offset or base >= stop:
                continue
            lo = max(offset, base) - base
            hi = min(stop, end) - base
            out.append(_with_offsets(batch, base, lo, hi))
        return out

    # maintenance (the shard's I/O worker) ---------------------------------------------

    def drop_before(self, start: int) -> int:
        """Move the log start to ``start``; delete what it covers; return the bytes freed.

        The LTS snapshot must cover the records that go (an open learns the rest again from
        the log): it is renewed first when it does not.

        Raises:
            StorageError: The LTS snapshot could not be written; nothing was deleted.
        """
        if self.streams is not None and self.snap_end < min(start, self.durable_end):
            try:
                self.save_snapshot()
            except OSError as exc:
                raise StorageError(
                    f"shard {self.number}: cannot write the LTS snapshot; records are kept"
                ) from exc
        doomed = self.log.drop_before(start)
        entries = self.epochs.entries()
        if len(entries) > 1 and entries[1][1] <= self.log.log_start_offset:
            self.epochs.truncate_from_start(self.log.log_start_offset)  # epochs wholly gone
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
            log.warning(
                "shard %d: index is wrong (%s); reading from the segments and rebuilding it",
                self.number,
                reason,
            )
            self.index_suspect = True

    def rebuild_index(self) -> None:
        """(Worker) Rebuild a suspect or lagging index now."""
        if self.index_lagging or self.index_suspect:
            self.index_frames([])

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


class _ReadFlush:
    """A queued flush of buffered rows of some shards of one I/O worker (see ``_flush_for_read``).

    Shards join on the event loop until the worker starts it; the lock makes joining and
    starting exclusive, so a shard that joined is flushed, and one that comes too late
    starts the next.
    """

    def __init__(self, writer: WorkerLog) -> None:
        self.writer = writer
        self.future: asyncio.Future[Any] | None = None
        self._shards: dict[int, _Shard] = {}
        self._started = False
        self._lock = threading.Lock()

    def add(self, s: _Shard) -> bool:
        """(Loop) Join this flush; False once it has started."""
        with self._lock:
            if self._started:
                return False
            self._shards[s.number] = s
            return True

    def __call__(self) -> None:
        """(Worker) Flush the shards that joined and the tailed ones (see ``_flush_for_read``)."""
        with self._lock:
            self._started = True
            shards = self._shards
        for s in self.writer.tailed_pending():
            shards.setdefault(s.number, s)
        self.writer.flush_shards(list(shards.values()))


def _entry(p: FramePosition, keys: pa.Array, tags: np.ndarray[Any, Any]) -> FrameEntry:
    h = p.header
    return FrameEntry(
        h.base_offset, h.next_offset, h.max_ts, p.segment.base_offset, p.pos, h.size, keys, tags
    )


# Frames whose rows read_key filters in one pyarrow call: per-call overhead exceeds a frame's
# filtering, so frames are batched; the bound keeps decompressed frames' memory in check.
_KEY_FILTER_FRAMES: Final = 64


# A candidate frame at most this many frames ahead is reached by reading the headers in
# between rather than by an index lookup.
_KEY_WALK_FRAMES: Final = 16


def _key_rows(parts: list[tuple[pa.RecordBatch, int]], key: bytes) -> pa.Table:
    """The rows of ``parts`` (frame batches and the offset of their first row) whose key is ``key``."""
    table = pa.Table.from_batches([b for b, _ in parts])
    keep = pc.fill_null(pc.equal(table.column("key"), pa.scalar(key, pa.binary())), False)
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
        if (
            it is None
            or h is None
            or offset < h.base_offset
            or (
                offset >= h.next_offset
                and offset - h.next_offset > _KEY_WALK_FRAMES * (h.next_offset - h.base_offset)
            )
        ):
            it = s.frames(offset, end)
            fp = next(it, None)
        else:
            while fp is not None and fp.header.next_offset <= offset:
                fp = next(it, None)
        yield fp


def _read_tail(s: _Shard, offset: int, end: int, max_bytes: int) -> bytes | None:
    """The frames from ``offset`` to ``end`` when a tailing reader asks where its last read
    ended and all of them fit in ``max_bytes``; ``None``: read the general way.

    A caught-up reader's every poll: one ``pread`` from the position the last read ended
    at, instead of an index lookup, a header scan from the entry it finds and a new
    mapping of the grown segment. Each header read must continue the one before from
    ``offset`` on (a position left by a cut log, or another segment, falls back).
    """
    hint = s.read_hint(offset)
    if hint is None:
        return None
    seg, pos = hint
    if seg is not s.log.active:
        return None  # rolled since: the index finds the next segment
    size = seg.size
    if not pos < size <= pos + max_bytes:
        return None
    try:
        data = seg.read(pos, size)
    except OSError:
        return None  # the general path reports it
    cut = 0
    at = offset
    while cut < len(data):
        try:
            header = parse_header(data, cut)
        except CorruptFrame:
            return None
        if header.base_offset != at:
            return None
        if at >= end:
            break  # written, not acknowledged yet
        cut += header.size
        at = header.next_offset
    if not cut:
        return None
    s.note_read_end(at, seg, pos + cut)
    return data if cut == len(data) else data[:cut]


def _frame_starts_at(seg: LogSegment, pos: int, base_offset: int) -> bool:
    """Whether a valid frame header with ``base_offset`` starts at ``pos`` of ``seg``."""
    if pos < 0 or pos + FRAME_HEADER_BYTES > seg.size:
        return False
    try:
        return parse_header(seg.view(pos, pos + FRAME_HEADER_BYTES), 0).base_offset == base_offset
    except CorruptFrame:
        return False


# A frame holding more streams than this is tagged MIXED_TAG alone (every stream read reads
# it): an index entry per (stream, frame) would cost the append path one LMDB put per stream,
# and a stream read of such interleaved data reads most frames anyway.
MAX_FRAME_TAGS: Final = 16
MIXED_TAG: Final = 0xFFFFFFFF  # never a stream id (ids are dense from 0)
_MIXED: Final = np.array([MIXED_TAG], np.uint32)
_STREAM_ZERO: Final = np.array([0], np.uint32)


def _frame_tags(batch: pa.RecordBatch) -> np.ndarray[Any, np.dtype[np.uint32]]:
    """The index tags of a frame: its distinct stream ids, ascending, or :data:`MIXED_TAG`."""
    streams = batch.column("stream")
    if is_zero_streams(streams):
        return _STREAM_ZERO  # the column appends without streams get: no need to read it
    if streams.null_count == 0:
        # numpy on the zero-copy buffer: pyarrow.compute's per-call cost dominates small frames
        values = streams.to_numpy(zero_copy_only=True)
        if not values.any():
            return _STREAM_ZERO  # no streams (the database's default): one reduction
        tags = distinct_streams(values, MAX_FRAME_TAGS)
        return _MIXED if tags is None else tags
    tags = np.array(sorted(pc.unique(streams).drop_null().to_pylist()), np.uint32)
    return _MIXED if len(tags) > MAX_FRAME_TAGS else tags


class SegmentEngine(GenerationLookups):
    """Segment files per shard, LMDB indexes, writes through the shared :class:`IoPool`."""

    name: Final = "segment"

    def __init__(
        self,
        config: EngineConfig,
        shards: list[_Shard],
        writers: list[WorkerLog],
        io_pool: IoPool,
        executor: Executor,
        index: DbIndex,
        arrays: ShardArrays,
        streams: StreamStamper | None = None,
    ) -> None:
        self.config = config
        self._streams = streams
        #: The database's generations (``None`` without streams); see :meth:`add_generation`.
        self.generations: GenerationLog | None = None
        #: Frames decoded by :meth:`read_stream` (stream reads skip frames; tests compare).
        self.stream_frames_read = 0
        self._shards = shards
        self._arrays = arrays  # shard n's positions at [n] (see _Shard)
        self._next_offsets = arrays.next_offsets
        self._writers = writers
        self._index = index  # every shard's index, one LMDB environment
        self._io_pool = io_pool
        self._executor = executor
        self._closed = False
        #: Zero-fills the journals ahead of their drains (set by :meth:`open_blocking`).
        self.journal_grower: JournalGrower | None = None
        self.segment_writeback: SegmentWriteback | None = None
        self.hw_writer: HighWatermarkWriter | None = None
        self._repairs: dict[int, asyncio.Future[Any]] = {}
        self._truncating: set[int] = set()  # shards whose truncate_to runs (appends refused)
        # Called on the event loop with the shard number when an append to it completed.
        self.listener: Callable[[int], None] | None = None
        # Called instead of ``listener`` with the shard numbers of one append, when set.
        self.listener_many: Callable[[np.ndarray[Any, Any]], None] | None = None
        # Set while add_generation switches tries: appends wait for it before taking offsets.
        self._generation_gate: asyncio.Event | None = None
        # Per I/O worker, the queued flush that reads of shards with buffered rows join.
        self._read_flushes: dict[int, _ReadFlush] = {}

    @classmethod
    def open_blocking(cls, config: EngineConfig, io_pool: IoPool, executor: Executor) -> SegmentEngine:
        """Open or create every shard: recover segments, replay the journals, update indexes."""
        clock_ms: Callable[[], int] = lambda: config.clock_us() // 1000  # noqa: E731
        db_index = DbIndex(config.directory / INDEX_DIR, index_interval_bytes=config.index_interval_bytes)
        shards = []
        arrays = ShardArrays.zeros(config.shards)
        try:
            for n in range(config.shards):
                directory = config.directory / shard_dir_name(n)
                log_, _report = open_shard_log(
                    directory,
                    segment_bytes=config.segment_bytes,
                    segment_ms=config.segment_ms,
                    clock_ms=clock_ms,
                )
                # A shard's own index (the layout before indexes were shared) is removed.
                index = db_index.shard(n, legacy_dir=directory / INDEX_DIR)
                shards.append(_Shard(n, log_, index, config, arrays))
            replay_journals(config.directory, shards, compression=config.compression)
            for shard in shards:
                _catch_up_index(shard)
                shard.reconcile_epochs()
            streams: StreamStamper | None = None
            generations: GenerationLog | None = None
            if config.lts_thresholds is not None:
                streams = StreamStamper(config.shards, config.lts_thresholds)
                generations = GenerationLog(config.directory, config.shards)
                generations.clamp_to([s.log.next_offset for s in shards])
                current = generations.current
                snapshots = SnapshotFiles(config.directory, generations.snapshot_subdir(current.id))
                for shard in shards:
                    shard.streams = streams
                    shard.snapshots = snapshots
                    base = None
                    if current.id > 1:
                        base = (
                            _inherited_trie(generations, current.id, shard.number, config.lts_thresholds),
                            current.starts[shard.number],
                        )
                    shard.snap_end = recover_shard(
                        streams,
                        snapshots,
                        shard.number,
                        shard.log.log_start_offset,
                        shard.log.next_offset,
                        functools.partial(_frame_batches, shard),
                        base,
                    )
        except BaseException:
            with contextlib.suppress(StorageError):
                db_index.close()  # let go of the environment (its lock and map)
            raise
        workers = io_pool.io_workers
        writers = []
        grower = JournalGrower(f"seglog-journal-grow-{config.directory.name}")
        writeback = SegmentWriteback(f"seglog-segment-writeback-{config.directory.name}")
        hw_writer = HighWatermarkWriter(f"seglog-high-watermark-{config.directory.name}")
        for w in range(workers):
            journal = Journal(
                journal_path(config.directory, w), journal_bytes=config.journal_bytes, grower=grower
            )
            journal.recycle()  # everything it held was replayed and synced above
            writer = WorkerLog(
                w,
                shards[w::workers],
                journal,
                arrays,
                fsync=config.fsync,
                fsync_interval_ms=config.fsync_interval_ms,
                buffer_ms=config.buffer_ms,
                compression=config.compression,
                index=db_index,
                streams=streams,
                writeback=writeback,
                hw_writer=hw_writer,
            )
            writers.append(writer)
            for s in writer.shards:
                s.writer = writer
        for stale in sorted((config.directory / "journal").glob("*.journal"))[workers:]:
            stale.unlink()  # an earlier open had more I/O workers; replayed above
        engine = cls(config, shards, writers, io_pool, executor, db_index, arrays, streams)
        engine.generations = generations
        engine.journal_grower = grower
        engine.segment_writeback = writeback
        engine.hw_writer = hw_writer
        return engine

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

    async def append_many(
        self,
        parts: Sequence[tuple[int, pa.RecordBatch]],
        quota: Quota | None = None,
        *,
        leader_epoch: int = 0,
        producer: ProducerStamp | None = None,
    ) -> list[int]:
        """Append batches to distinct shards; ``quota`` may veto before anything is queued."""
        parts = [(n, b) for n, b in parts if b.num_rows]
        for n, _ in parts:
            self._shard(n)
        if not parts:
            return []
        if len(parts) == 1:
            shard, batch = parts[0]
            routes = np.full(batch.num_rows, shard, np.int32)
        else:
            batch = pa.Table.from_batches([b for _, b in parts]).combine_chunks().to_batches()[0]
            routes = np.repeat(np.array([n for n, _ in parts], np.int32), [b.num_rows for _, b in parts])
        offsets = await self.append_routed(batch, routes, quota, leader_epoch=leader_epoch, producer=producer)
        bases = []
        row = 0
        for _, b in parts:
            bases.append(int(offsets[row]))
            row += b.num_rows
        return bases

    async def append_routed(
        self,
        batch: pa.RecordBatch,
        routes: np.ndarray[Any, np.dtype[np.int32]],
        quota: Quota | None = None,
        *,
        leader_epoch: int = 0,
        producer: ProducerStamp | None = None,
    ) -> np.ndarray[Any, np.dtype[np.int64]]:
        """Append the rows of ``batch`` to the shards ``routes`` names; return each row's offset.

        Frames are stamped with ``leader_epoch`` (0 for a standalone store); the first frame
        of a new epoch on a shard is recorded in its leader-epoch cache. With ``producer``
        every shard's rows are framed on their own (never buffered with other appends' rows),
        each frame carrying the producer fields.

        One request per I/O worker (see :mod:`seglog.engines.segment_writer`); offsets are
        assigned without awaiting, so concurrent appends cannot interleave.

        Raises:
            QuotaExceeded: From ``quota``; nothing was queued.
            AppendFailed: Some workers' parts failed (nothing of them is in the log); the
                others were written.
        """
        if self._closed:
            raise ClosedResourceError("the database is closed")
        while self._generation_gate is not None:  # add_generation switches tries: after it
            await self._generation_gate.wait()
        n = batch.num_rows
        workers = self._io_pool.io_workers
        if not 0 <= leader_epoch <= MAX_EPOCH:
            raise InvalidArgument(f"leader_epoch must be in 0..{MAX_EPOCH}, not {leader_epoch!r}")
        if self._truncating and bool(np.isin(routes, list(self._truncating)).any()):
            raise BusyResourceError(f"shards {sorted(self._truncating)} are being truncated; retry")
        # Offsets are assigned per shard in row order without moving the rows: a sort of
        # the batch here would copy every row on the loop, and the flush sorts anyway.
        first = int(routes[0])
        if n == 1 or not bool((routes != first).any()):
            # One shard (a keyed append to a one-shard database, a forced shard): a fixed
            # cost of a few numpy calls, which is most of a 1000-row append's loop time.
            ids = np.array([first], np.int64)
            counts = np.array([n], np.int64)
            bases = self._next_offsets[ids]
            offsets = np.arange(int(bases[0]), int(bases[0]) + n, dtype=np.int64)
        else:
            sorted_routes = routes
            order: np.ndarray[Any, Any] | None = None
            if bool((routes[1:] < routes[:-1]).any()):
                # int16 (MAX_SHARDS fits): numpy's stable sort is a radix sort for 16-bit keys.
                order = np.argsort(routes.astype(np.int16), kind="stable")
                sorted_routes = routes[order]
            starts = np.concatenate(([0], np.flatnonzero(sorted_routes[1:] != sorted_routes[:-1]) + 1))
            counts = np.diff(np.concatenate((starts, [n])))
            ids = sorted_routes[starts].astype(np.int64)
            bases = self._next_offsets[ids]
            offsets = np.repeat(bases - starts, counts) + np.arange(n, dtype=np.int64)
            if order is not None:
                unsorted = np.empty(n, np.int64)
                unsorted[order] = offsets
                offsets = unsorted
        stamper = self._streams
        # One request per I/O worker (shards n % workers), built before any offset moves:
        # an encoding error assigns nothing.
        requests: list[tuple[WorkerLog, FrameRequest | RowsRequest, np.ndarray[Any, Any], int]] = []
        try:
            if stamper is not None:
                # Stamped in offset order as the offsets are assigned (nothing awaits until
                # they are taken); a failure before that forgets what the batch taught.
                if len(ids) == 1:
                    stamps = stamper.stamp(batch.column("topic"), int(ids[0]), int(bases[0]))
                else:
                    stamps = stamper.stamp(batch.column("topic"), routes, offsets)
                batch = stamp_batch(batch, stamps)
            worker_of = ids % workers if workers > 1 else None
            for w in [0] if worker_of is None else np.unique(worker_of).tolist():
                writer = self._writers[w]
                mine = None if worker_of is None else worker_of == w
                wids = ids if mine is None else ids[mine]
                writer.check_writable(int(wids[0]))  # read-only is per worker, not per shard
                if mine is None or bool(mine.all()):
                    wbatch, wroutes, woffsets = batch, routes, offsets
                else:
                    rows = np.flatnonzero(routes % workers == w)
                    wbatch, wroutes, woffsets = batch.take(pa.array(rows)), routes[rows], offsets[rows]
                req: FrameRequest | RowsRequest
                if len(wids) == 1:
                    s = self._shards[int(wids[0])]
                    stamp = frame_producer(producer, s.number, 0)
                    frames, batches = self._encode(int(woffsets[0]), wbatch, leader_epoch, stamp)
                    req = FrameRequest(writer.gen, s, frames, batches)
                    size = sum(f.size for f in frames)
                else:
                    wbases = bases if mine is None else bases[mine]
                    part = PendingPart.make(
                        wbatch,
                        wroutes.astype(np.int32, copy=False),
                        woffsets,
                        wids,
                        wbases,
                        counts if mine is None else counts[mine],
                        None if producer is None else _row_stamps(producer, wids, wbases, wroutes, woffsets),
                    )
                    req = RowsRequest(writer.gen, part, leader_epoch)
                    size = wbatch.nbytes
                requests.append((writer, req, wids, size))
            if quota is not None:
                quota.admit(sum(r[3] for r in requests))
        except BaseException:
            if stamper is not None:
                for shard_id, base in zip(ids.tolist(), bases.tolist(), strict=True):
                    stamper.cut(shard_id, base)
            raise
        self._next_offsets[ids] += counts  # ids are distinct: one group per shard
        loop = asyncio.get_running_loop()
        futures = []
        for writer, req, _, _ in requests:
            writer.loop = loop
            futures.append(self._io_pool.submit(writer.worker, writer, req))
        outcomes = await await_outcomes(futures)
        for (_, _, wids, _), outcome in zip(requests, outcomes, strict=True):
            if not isinstance(outcome, BaseException):
                self._notify(wids)
        if any(isinstance(o, BaseException) for o in outcomes):
            failed: dict[int, BaseException] = {}
            written: dict[int, int] = {}
            base_of = dict(zip(ids.tolist(), bases.tolist(), strict=True))
            for (_, _, wids, size), outcome in zip(requests, outcomes, strict=True):
                if isinstance(outcome, BaseException):
                    for number in wids.tolist():
                        failed[number] = outcome
                    if quota is not None:
                        quota.release(size)
                else:
                    for number in wids.tolist():
                        written[number] = base_of[number]
            raise_if_failed(failed, written)
        return offsets

    def _notify(self, ids: np.ndarray[Any, Any]) -> None:
        """Tell the listeners that appends to the shards ``ids`` completed."""
        if self.listener_many is not None:
            self.listener_many(ids)
        elif self.listener is not None:
            for number in ids.tolist():
                self.listener(number)

    # --- replica log ----------------------------------------------------------------------

    async def append_frames(self, shard: int, frames: Any, *, expected_base: int) -> int:
        """Store frames another node encoded, byte for byte, at the end of ``shard``'s log.

        Checked (magic, lengths, CRC, offset continuity from ``expected_base``: on the loop
        up to ``_INLINE_PARSE_BYTES``, beyond in a thread), then written, made durable and
        indexed like any append; each frame keeps its leader epoch.

        Returns:
            The new end offset.

        Raises:
            OffsetMismatch: ``expected_base`` is not the log end, or the frames have a gap or
                an overlap; nothing was written.
            CorruptFrame: A frame fails its checks; nothing was written.
            BusyResourceError: The shard is being truncated.
            StorageError: The write failed; nothing of it is in the log.
        """
        s = self._shard(shard)
        s.check_writable()
        if memoryview(frames).nbytes <= _INLINE_PARSE_BYTES:
            encoded, batches = parse_frames(frames, expected_base, shard=shard)
        else:
            encoded, batches = await self._run(
                functools.partial(parse_frames, frames, expected_base, shard=shard)
            )
        if shard in self._truncating:
            raise BusyResourceError(f"shard {shard} is being truncated")
        check_frames_continue(shard, expected_base, s.next_offset)
        writer = s.writer
        assert writer is not None
        new_end = int(encoded[-1].header.next_offset)
        if self._streams is not None:
            learn_frames(self._streams, shard, encoded, batches)
        s.next_offset = new_end
        writer.loop = asyncio.get_running_loop()
        outcome = await await_outcomes(
            [self._io_pool.submit(writer.worker, writer, FrameRequest(writer.gen, s, encoded, batches))]
        )
        if isinstance(outcome[0], BaseException):
            raise outcome[0]
        if self.listener is not None:
            self.listener(shard)
        return new_end

    async def truncate_to(self, shard: int, offset: int, *, force: bool = False) -> int:
        """Remove every record of ``shard`` at or after ``offset`` (a follower diverged).

        The cut is at a frame boundary: the new end is ``offset`` or the base of the frame
        holding it. Runs on the shard's I/O worker after every append queued before it: the
        worker first checkpoints (its journal must not replay what is cut), then the log is
        cut crash-safely (:meth:`~seglog.segment.ShardLog.truncate_to`) and the index cut
        back. Appends to the shard are refused while it runs.

        Returns:
            The new end offset.

        Raises:
            OffsetOutOfRange: ``offset`` is below the log start or past the end.
            InvalidArgument: ``offset`` is below the high watermark and not ``force``.
            BusyResourceError: The shard is already being truncated.
            StorageError: A step failed; the next open completes the cut.
        """
        s = self._shard(shard)
        s.check_writable()
        if offset < s.hw.value and not force:
            raise InvalidArgument(
                f"shard {shard}: truncate_to({offset}) is below the high watermark {s.hw.value}; "
                "records below it may have been read (force=True to cut anyway)"
            )
        if shard in self._truncating:
            raise BusyResourceError(f"shard {shard} is already being truncated")
        if not s.log.log_start_offset <= offset <= s.next_offset:
            raise OffsetOutOfRange(offset, s.log.log_start_offset, s.next_offset, shard=shard)
        writer = s.writer
        assert writer is not None

        def cut() -> int:
            writer.checkpoint()
            writer.index_barrier()  # no entry past the cut is written after it
            try:
                new_end = s.log.truncate_to(offset)
            except OSError as exc:
                writer.make_read_only(exc, ReadOnlyReason.TRUNCATION_FAILED)
                raise StorageError(f"shard {shard}: truncation to {offset} failed") from exc
            s.durable_end = new_end
            try:
                s.epochs.truncate_from_end(new_end)
                if s.hw.value > new_end:
                    s.hw.reset(new_end)
            except StorageError as exc:
                writer.make_read_only(exc, ReadOnlyReason.EPOCH_CACHE_FAILED)
                raise
            finally:
                writer.refresh_epoch_floor()  # the next frame of an epoch cut here is recorded again
            try:
                s.index.truncate_from(new_end)
            except StorageError as exc:
                s.suspect(f"cutting it back after truncation failed: {exc}")
            if s.streams is not None:
                s.streams.cut(shard, new_end)
                if s.snap_end > new_end:
                    # The old snapshot knows topics of records that are gone: the offsets
                    # they had are handed out again, so it must not be restored.
                    try:
                        s.save_snapshot(new_end)
                    except OSError as exc:
                        writer.make_read_only(exc, ReadOnlyReason.TRUNCATION_FAILED)
                        raise StorageError(f"shard {shard}: rewriting the LTS snapshot failed") from exc
            return new_end

        self._truncating.add(shard)
        try:
            new_end: int = await self._io_pool.submit(s.number, s.maintenance, cut)
        finally:
            self._truncating.discard(shard)
        s.next_offset = new_end
        return new_end

    async def restart_at(self, shard: int, offset: int) -> int:
        """Empty ``shard`` and start it over at ``offset``, at or past its end (Kafka's
        ``truncateFullyAndStartAt``): for a follower whose log ends below its leader's start.

        Like :meth:`truncate_to` it runs on the shard's I/O worker after every append queued
        before it, checkpoints the journal first, and refuses appends while it runs. The log
        goes crash-safely (:meth:`~seglog.segment.ShardLog.restart_at`); the epoch cache, the
        index entries and the high watermark go with it (the high watermark is ``offset``).

        Returns:
            ``offset``, the shard's new start and end.

        Raises:
            InvalidArgument: ``offset`` is below the end offset.
            BusyResourceError: The shard is being truncated.
            StorageError: A step failed; the next open finds an empty log (at the old start
                or at ``offset``).
        """
        s = self._shard(shard)
        s.check_writable()
        if offset < s.next_offset:
            raise InvalidArgument(
                f"shard {shard}: restart_at({offset}) is below the end offset {s.next_offset} "
                "(truncate_to or truncate_before move within the log)"
            )
        if shard in self._truncating:
            raise BusyResourceError(f"shard {shard} is already being truncated")
        writer = s.writer
        assert writer is not None

        def restart() -> int:
            writer.checkpoint()
            writer.index_barrier()
            if s.streams is not None and s.snap_end < s.durable_end:
                s.save_snapshot()  # the topics learned so far outlive the records
            try:
                s.log.restart_at(offset)
            except OSError as exc:
                writer.make_read_only(exc, ReadOnlyReason.TRUNCATION_FAILED)
                raise StorageError(f"shard {shard}: restarting the log at {offset} failed") from exc
            s.durable_end = offset
            try:
                s.epochs.clear()
                s.hw.reset(offset)
            except StorageError as exc:
                writer.make_read_only(exc, ReadOnlyReason.EPOCH_CACHE_FAILED)
                raise
            finally:
                writer.refresh_epoch_floor()
            try:
                s.index.truncate_from(0)
            except StorageError as exc:
                s.suspect(f"emptying it after a restart failed: {exc}")
            if s.streams is not None:
                try:
                    s.save_snapshot(offset)  # learning goes on from the new start
                except OSError as exc:
                    log.warning(
                        "shard %d: LTS snapshot after the restart at %d failed: %s", shard, offset, exc
                    )
            return offset

        self._truncating.add(shard)
        try:
            await self._io_pool.submit(s.number, s.maintenance, restart)
        finally:
            self._truncating.discard(shard)
        s.next_offset = offset
        return offset

    def end_offset_for_epoch(self, shard: int, epoch: int) -> tuple[int, int]:
        """Kafka's OffsetsForLeaderEpoch for ``shard``: the largest epoch at or below ``epoch``
        this log knows and the offset where it ends (``(-1, -1)`` when there is none)."""
        return self._shard(shard).end_offset_for_epoch(epoch)

    def leader_epochs(self, shard: int) -> list[tuple[int, int]]:
        """The shard's leader-epoch cache: ``(epoch, start offset)``, oldest first."""
        return [(e, o) for e, o in self._shard(shard).epochs.entries()]

    def high_watermark(self, shard: int) -> int:
        """The shard's high watermark (in memory; persisted lazily)."""
        return self._shard(shard).hw.value

    def update_high_watermark(self, shard: int, hw: int) -> bool:
        """Move the high watermark up to ``hw`` (never down; at most the end offset).

        Persisted lazily: when the shard's worker is idle (at most every
        ``HW_FLUSH_INTERVAL_S``) and at close, so a crash may bring
        back an older value (safe: readers see less, a replica relearns it).

        Returns:
            Whether it moved.

        Raises:
            OffsetOutOfRange: ``hw`` is past the end offset.
        """
        s = self._shard(shard)
        if not 0 <= hw <= s.durable_end:
            raise OffsetOutOfRange(hw, s.log.log_start_offset, s.durable_end, shard=shard)
        moved = s.hw.update(hw)
        if moved and s.writer is not None:
            s.writer.hw_dirty[s.number] = s
        return moved

    def read_frames_blocking(self, shard: int, offset: int, max_bytes: int) -> bytes:
        """Blocking body of :meth:`read_frames` (segments only: pending rows are not frames yet)."""
        s = self._shard(shard)
        end = self._check_range(s, offset)
        if max_bytes < 1:
            raise InvalidArgument("max_bytes must be >= 1")
        out: list[memoryview] = []
        total = 0
        if offset >= end:
            return b""
        tail = _read_tail(s, offset, end, max_bytes)
        if tail is not None:
            return tail
        last: FramePosition | None = None
        for fp in s.frames(offset, end):
            size = fp.header.size
            if out and total + size > max_bytes:
                break
            out.append(fp.segment.view(fp.pos, fp.pos + size))
            total += size
            last = fp
        if last is not None:
            s.note_read_end(last.header.next_offset, last.segment, last.pos + last.header.size)
        return b"".join(out)

    async def read_frames(self, shard: int, offset: int, max_bytes: int) -> bytes:
        """The stored frames of ``shard`` from the one holding ``offset``, byte for byte.

        At least one frame (if any lies at or after ``offset``), otherwise at most
        ``max_bytes``; only acknowledged frames. Rows buffered from many-shard appends are
        written into the segment first.

        Raises:
            OffsetOutOfRange: ``offset`` is outside ``[start, end]``.
        """
        s = self._shard(shard)
        if s.writer is not None:
            s.writer.note_tailed(s)
        if s.has_pending:
            await self._flush_for_read(s)
        if offset >= s.log.active.base_offset:
            # The tail of the active segment was just written: it is in the page cache, and
            # copying it here costs less than the hop to a thread and back (a tailing
            # consumer's every poll, and every follower fetch of an acks="all" round).
            if max_bytes <= _INLINE_READ_BYTES:
                return self.read_frames_blocking(shard, offset, max_bytes)
            tail = s.tail_bytes(offset)
            if tail is not None and tail <= _INLINE_READ_BYTES:
                # A follower asks for up to 4 MiB but continues where its last read ended:
                # what is there fits the inline bound (and so does the answer, capped).
                return self.read_frames_blocking(shard, offset, _INLINE_READ_BYTES)
        data: bytes = await self._run(self.read_frames_blocking, shard, offset, max_bytes)
        return data

    async def _flush_for_read(self, s: _Shard) -> None:
        """Write ``s``'s buffered rows into its segment before a read of frames.

        Reads arriving together (a consumer's long polls on every shard, woken by one
        append) share one request on the I/O worker: one flush of all their shards, one
        index transaction, instead of one of each per shard. The flush also takes the buffered
        rows of every shard of the worker read within the last ``TAILED_S``: their readers'
        polls are about to arrive for them too.
        """
        writer = s.writer
        assert writer is not None
        flush = self._read_flushes.get(writer.worker)
        if flush is None or not flush.add(s):
            flush = _ReadFlush(writer)
            flush.add(s)
            flush.future = self._io_pool.submit(s.number, s.maintenance, flush)
            # Its failure reaches every reader still waiting; retrieved here for the others.
            flush.future.add_done_callback(lambda f: f.cancelled() or f.exception())
            self._read_flushes[writer.worker] = flush
        assert flush.future is not None
        # Shielded: a reader that goes away must not cancel the flush the others wait for.
        await asyncio.shield(flush.future)

    def _encode(
        self,
        base: int,
        batch: pa.RecordBatch,
        leader_epoch: int = 0,
        producer: tuple[int, int, int] | None = None,
    ) -> tuple[list[EncodedFrame], list[pa.RecordBatch]]:
        encoded = encode_batch(
            batch, base, compression=self.config.compression, leader_epoch=leader_epoch, producer=producer
        )
        return [f for f, _ in encoded], [b for _, b in encoded]

    async def producer_headers(self, shard: int) -> list[FrameHeader]:
        """Headers of the durable frames of ``shard`` an idempotent producer wrote, oldest first
        (a scan of every segment's headers on the shard's I/O worker, after its buffered rows
        are written: no append moves the log under the scan)."""
        s = self._shard(shard)

        def scan() -> list[FrameHeader]:
            out: list[FrameHeader] = []
            for seg in s.log.segments_snapshot():
                out.extend(h for _pos, h in seg.headers(0, seg.size) if h.producer_id >= 0)
            return out

        headers: list[FrameHeader] = await self._on_worker(s, scan)
        return headers

    # --- streams -----------------------------------------------------------------------

    def _check_shard_number(self, shard: int) -> None:
        self._shard(shard)

    def read_stream_blocking(
        self, shard: int, offset: int, want: StreamRead, max_records: int, max_frames: int
    ) -> StreamBatch:
        """Blocking body of :meth:`read_stream` (the read executor).

        Frames the index has taken are found through its tag entries (one per distinct
        stream of a frame); frames past what it has taken, and all frames when it is
        suspect, are scanned; rows still pending in memory are filtered last.
        """
        s = self._shard(shard)
        end = s.durable_end
        # Below the start: those records are gone. Past the end: the log was cut back
        # (truncate_to) and the offsets from its end are new records.
        offset = min(max(offset, s.log.log_start_offset), end)
        collector = StreamCollector(want, max_records, max_frames)
        if offset >= end:
            return collector.result(offset)
        mem_start, pending = s.pending_snapshot(end, offset)
        seg_stop = min(end, mem_start)
        pos = offset
        try:
            if pos < seg_stop and s.index_ready:
                pos = self._read_stream_indexed(s, pos, seg_stop, collector)
            if pos < seg_stop and not collector.done:
                for fp in s.frames(pos, seg_stop):
                    h = fp.header
                    collector.add(
                        s.decode(fp),
                        h.base_offset,
                        max(pos, h.base_offset) - h.base_offset,
                        min(seg_stop, h.next_offset) - h.base_offset,
                    )
                    pos = min(seg_stop, h.next_offset)
                    if collector.done:
                        break
                else:
                    pos = seg_stop
        except CorruptFrame as exc:
            raise StorageError(f"shard {shard}: corrupt frame while reading offset {pos}") from exc
        finally:
            self.stream_frames_read += collector.frames
        if collector.done:
            return collector.result(pos)
        pos = max(pos, seg_stop)
        for base, part in pending:
            count = part.num_rows
            if base + count <= pos:
                continue
            collector.add(part, base, max(pos, base) - base, min(end, base + count) - base)
            if collector.stop_at is not None:
                break
        return collector.result(end)

    def _read_stream_indexed(self, s: _Shard, pos: int, stop: int, collector: StreamCollector) -> int:
        """Read the frames in ``[pos, stop)`` the tag index names; return where it left off.

        Below the index's end only named frames can hold the stream; past it the caller
        scans. A tag entry that points at no such frame marks the index suspect (the caller
        scans from the returned position).
        """
        indexed_end = s.index.indexed_end  # before the lookups: later entries are scanned
        limit = min(stop, indexed_end)
        if pos >= limit:
            return pos
        want = collector.want
        begin = pos
        try:
            if want.min_ts is not None and want.min_ts > 0:
                lower = s.index.time_lower_bound(want.min_ts)
                if lower is not None:
                    begin = max(begin, min(lower, limit))
            floor = s.index.floor(begin)
            from_base = floor[0] if floor is not None else 0
            # The stream's own frames and the mixed ones (too many streams to tag), in order.
            named = heapq.merge(_tagged(s, want.stream, from_base), _tagged(s, MIXED_TAG, from_base))
            for base, where in named:
                if base >= limit:
                    return limit
                fp = _frame_at(s, base, where)
                if fp is None:
                    s.suspect(f"tag entry for frame {base} points at no such frame")
                    return pos
                h = fp.header
                if h.next_offset <= begin:
                    continue
                collector.add(s.decode(fp), base, max(begin, base) - base, min(limit, h.next_offset) - base)
                pos = min(limit, h.next_offset)
                if collector.done:
                    return pos
            return limit
        except StorageError as exc:
            s.suspect(f"stream lookup failed: {exc}")
            return pos

    async def read_stream(
        self, shard: int, offset: int, want: StreamRead, max_records: int, max_frames: int
    ) -> StreamBatch:
        """Up to ``max_records`` rows of one stream from ``offset`` (see :class:`StreamEngine`)."""
        self._stamper()
        try:
            batch: StreamBatch = await self._run(
                self.read_stream_blocking, shard, offset, want, max_records, max_frames
            )
        finally:
            self._repair_if_needed(shard)
        return batch

    # --- reads -------------------------------------------------------------------------

    def _check_range(self, s: _Shard, offset: int) -> int:
        end = s.durable_end
        start = s.log.log_start_offset
        if not start <= offset <= end:
            raise OffsetOutOfRange(offset, start, end, shard=s.number)
        return end

    def read_arrow_blocking(
        self, shard: int, offset: int, max_records: int, upper: int | None = None
    ) -> pa.Table:
        """Blocking body of :meth:`read_arrow` (runs in the read executor)."""
        s = self._shard(shard)
        end = self._check_range(s, offset)
        if max_records < 1:
            raise InvalidArgument("max_records must be >= 1")
        stop = min(end, offset + max_records)
        if upper is not None:
            stop = min(stop, upper)
        if offset >= stop:
            return empty_read_table()
        mem_start, pending = s.pending_snapshot(stop, offset)
        seg_stop = min(stop, mem_start)
        out: list[pa.RecordBatch] = []
        try:
            if offset < seg_stop:
                for fp in s.frames(offset, seg_stop):
                    h = fp.header
                    batch = s.decode(fp)
                    lo = max(offset, h.base_offset) - h.base_offset
                    hi = min(seg_stop, h.next_offset) - h.base_offset
                    out.append(_with_offsets(batch, h.base_offset, lo, hi))
        except CorruptFrame as exc:
            raise StorageError(f"shard {shard}: corrupt frame while reading offset {offset}") from exc
        out.extend(s.pending_tables(pending, max(offset, seg_stop), stop))
        return pa.Table.from_batches(out, schema=READ_SCHEMA)

    async def read_arrow(
        self, shard: int, offset: int, max_records: int, upper: int | None = None
    ) -> pa.Table:
        """Records ``[offset, min(end, offset + max_records, upper))`` (``upper``: e.g. the high
        watermark a server caps consumers at)."""
        try:
            return await self._run(self.read_arrow_blocking, shard, offset, max_records, upper)
        finally:
            self._repair_if_needed(shard)

    async def read_arrow_then(
        self,
        shard: int,
        offset: int,
        max_records: int,
        then: Callable[[pa.Table], _T],
        upper: int | None = None,
    ) -> _T:
        """:meth:`read_arrow`, then ``then(table)`` on the same read-executor thread."""

        def job() -> _T:
            return then(self.read_arrow_blocking(shard, offset, max_records, upper))

        try:
            result: _T = await self._run(job)
            return result
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
        mem_start, pending = s.pending_snapshot(end, begin)
        seg_stop = min(end, mem_start)
        if begin < seg_stop:
            for fp in s.frames(begin, seg_stop):
                h = fp.header
                if h.max_ts < ts:
                    continue
                batch = s.decode(fp)
                first_row = max(begin, h.base_offset) - h.base_offset
                mask = pc.greater_equal(batch.column("ts").slice(first_row), ts)
                idx = int(pc.index(mask, True).as_py())
                if idx >= 0:
                    return h.base_offset + first_row + idx
        for part in s.pending_tables(pending, max(begin, seg_stop), end):
            idx = int(pc.index(pc.greater_equal(part.column("ts"), ts), True).as_py())
            if idx >= 0:
                return int(part.column("offset")[idx].as_py())
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
        durable_end = s.durable_end
        start = s.log.log_start_offset
        mem_start, pending = s.pending_snapshot(durable_end)
        end = min(durable_end, mem_start)  # the segments' part
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

        for base, fp in zip(
            bases, _frames_holding(s, [max(b, start) for b in bases], scan_from), strict=True
        ):
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
        for part in s.pending_tables(pending, max(start, end), durable_end):
            picked = part.filter(pc.equal(part.column("key"), pa.scalar(key, pa.binary())))
            out.append(pa.Table.from_batches([picked], schema=READ_SCHEMA))
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
        return ShardStats(
            shard, s.log.log_start_offset, s.durable_end, len(segments), sum(x.size for x in segments)
        )

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
        """Run ``fn`` on ``s``'s I/O worker, after its pending rows are in the segment."""
        writer = s.writer
        assert writer is not None

        def run() -> Any:
            writer.flush_shard(s)
            writer.index_barrier()  # maintenance may write the index or read it as complete
            return fn()

        return await self._io_pool.submit(s.number, s.maintenance, run)

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

    async def add_generation(self, created_us: int) -> GenerationInfo:
        """Close the current generation and start the next one on every shard.

        Appends wait at a gate while it switches (none is assigned offsets meanwhile): the
        boundary of every shard is its next offset; the closing generation's tries and then the
        manifest naming the new one are written durably (in a thread: the loop keeps serving
        reads); then the stamper switches to the inherited tries (every offset from the
        boundaries on is stamped by them) and the gate opens. A crash
        before the manifest is replaced leaves the old generation current, after it the new
        one: never a mix. Afterwards every shard's active segment is sealed, so the new
        generation starts a segment (what ``drop_slab`` deletes is whole segments).

        Raises:
            InvalidArgument: The database has no streams.
            StorageError: The files could not be written (nothing changed).
        """
        stamper = self._stamper()
        gens = self.generations
        assert gens is not None
        if self._closed:
            raise ClosedResourceError("the database is closed")
        while self._generation_gate is not None:  # another switch runs: after it
            await self._generation_gate.wait()
        gate = self._generation_gate = asyncio.Event()
        try:
            current = gens.current
            new = GenerationInfo(current.id + 1, created_us, tuple(self._next_offsets.tolist()))
            finals = stamper.copy_tries()

            after = [*gens.generations, new]

            def commit() -> None:  # files only: the in-memory state changes on the loop
                gens.save_final_tries(current.id, finals)
                gens.save_manifest(after)

            try:
                await asyncio.to_thread(commit)
            except OSError as exc:
                raise StorageError(
                    f"cannot write generation {new.id}; the current one stays {current.id}"
                ) from exc
            gens.adopt(current.id, finals, after)
            files = SnapshotFiles(self.config.directory, gens.snapshot_subdir(new.id))
            for s in self._shards:  # before the switch: a snapshot of the old tries goes to the
                s.snapshots = files  # new directory at an offset <= the start, which an open ignores
            stamper.begin_generation([lts.inherit_wildcards() for lts in finals])
        finally:
            self._generation_gate = None
            gate.set()
        if current.id > 1 and gens.generations[-3].dropped:  # no longer a recovery base
            gens.forget_tries(current.id - 1)  # one unlink

        def seal_at_boundary(s: _Shard) -> int:
            end = s.log.next_offset  # every append queued before is in (or failed)
            if s.log.active.size:
                s.log.roll()
            return end

        ends = await asyncio.gather(
            *(self._on_worker(s, functools.partial(seal_at_boundary, s)) for s in self._shards)
        )
        if any(end < start for end, start in zip(ends, new.starts, strict=True)):
            # A write of the old generation failed: its offsets are handed out again, to
            # records stamped by the new tries, so the new generation starts there.
            try:
                await asyncio.to_thread(gens.clamp_to, list(ends))
            except OSError as exc:
                raise StorageError(f"cannot write generation {new.id}'s starts") from exc
            new = gens.current
        old_files = SnapshotFiles(self.config.directory, gens.snapshot_subdir(current.id))

        def forget_snapshots() -> None:
            for s in self._shards:
                with contextlib.suppress(OSError):
                    old_files.path(s.number).unlink(missing_ok=True)

        await asyncio.to_thread(forget_snapshots)
        return new

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
        freed = await asyncio.gather(
            *(
                self._on_worker(
                    s,
                    functools.partial(
                        s.enforce_retention, retention_bytes, retention_ms, now_us, floors[s.number]
                    ),
                )
                for s in self._shards
            )
        )
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

    @staticmethod
    def measure_bytes(directory: Path) -> int:
        """Bytes of the segment files under a database ``directory``, without opening it.

        What the store's quota counts: LMDB files (indexes, groups) are left out because
        they never shrink, so counting them would keep a store over quota after data was
        freed; journals are left out because they are reused, not grown.
        """
        total = 0
        for root, _dirs, files in os.walk(directory):
            for f in files:
                if not f.endswith(SEGMENT_SUFFIX):
                    continue
                with contextlib.suppress(OSError):  # removed while walking
                    total += os.stat(os.path.join(root, f)).st_size
        return total

    def close_blocking(self) -> None:
        """Checkpoint the journals and close every shard (the I/O pool is drained or closed)."""
        if self._closed:
            return
        self._closed = True
        errors: list[BaseException] = []
        for writer in self._writers:
            try:
                writer.close()
            except (OSError, StorageError) as exc:
                errors.append(exc)
        if self.journal_grower is not None:
            self.journal_grower.close()  # the journals are closed: its thread is gone after this
        if self.segment_writeback is not None:
            self.segment_writeback.close()  # the checkpoints synced everything it had queued
        if self.hw_writer is not None:
            self.hw_writer.close()  # idle: each worker's close waited for it and wrote the rest
        for s in self._shards:
            if s.writer is not None and s.writer.failed is None:
                s.maybe_snapshot(CLOSE_SNAPSHOT_RECORDS)
        for close in [*(s.log.close for s in self._shards), self._index.close]:
            try:
                close()
            except (OSError, StorageError) as exc:
                errors.append(exc)
        if errors:
            raise StorageError("closing the engine failed") from errors[0]

    async def close(self) -> None:
        if self._closed:
            return
        # On the workers, so no idle flush of the pool races the final checkpoint.
        maintenance = Maintenance()
        with contextlib.suppress(ClosedResourceError):  # a closed pool runs nothing more
            await asyncio.gather(
                *(self._io_pool.submit(w.worker, maintenance, w.close) for w in self._writers),
                return_exceptions=True,
            )
        await self._run(self.close_blocking)


_TAG_BATCH: Final = 256  # tag entries fetched per index lookup of a stream read


def _tagged(s: _Shard, tag: int, start: int) -> Iterator[tuple[int, IndexPosition]]:
    """The index's frames with ``tag`` from ``start``, ascending, fetched a batch at a time."""
    while True:
        found = s.index.tag_frames(tag, start=start, limit=_TAG_BATCH)
        yield from found
        if len(found) < _TAG_BATCH:
            return
        start = found[-1][0] + 1


def _frame_at(s: _Shard, base: int, where: IndexPosition) -> FramePosition | None:
    """The frame with base offset ``base`` at an index position, or ``None`` if it is not there."""
    try:
        seg = s.log.segment_for(base)
    except OffsetOutOfRange:
        return None
    if seg.base_offset != where.segment_base or not _frame_starts_at(seg, where.pos, base):
        return None
    header = parse_header(seg.view(where.pos, where.pos + FRAME_HEADER_BYTES), 0)
    return FramePosition(seg, where.pos, header)


def _inherited_trie(gens: GenerationLog, generation: int, shard: int, thresholds: Sequence[int]) -> LTS:
    """The trie ``generation`` started with in ``shard`` (its predecessor's wildcards).

    A missing or damaged tries file is logged, not fatal: the generation's log is learned
    from an empty trie, and records whose stamps then disagree are logged by the recovery.
    """
    try:
        return gens.final_trie(generation - 1, shard).inherit_wildcards()
    except CorruptLTS as exc:
        log.error("shard %d: generation %d's starting trie is unavailable (%s)", shard, generation, exc)
        return LTS(thresholds, cache_size=0)


def _frame_batches(s: _Shard, offset: int) -> Iterator[tuple[int, pa.RecordBatch]]:
    """``(base, batch)`` of the frames of ``s`` holding ``offset`` and after (at open)."""
    end = s.log.next_offset
    if offset >= end:
        return
    seg, pos = s.locate(offset)
    for fp in s.log.frames_from(seg, pos, end):
        if fp.header.next_offset > offset:
            yield fp.header.base_offset, s.decode(fp)


def _catch_up_index(s: _Shard) -> None:
    """Cut index entries past the log end and index frames the index has not seen."""
    end = s.log.next_offset
    start = s.log.log_start_offset
    if s.index.indexed_end > end:
        log.warning(
            "shard %d: index ran ahead of the log (%d > %d); cutting it back",
            s.number,
            s.index.indexed_end,
            end,
        )
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
        pending.append(_entry(fp, batch.column("key"), _frame_tags(batch)))
        if len(pending) >= 1024:
            s.index.add(pending)
            pending = []
    s.index.add(pending)


def _row_stamps(
    producer: ProducerStamp,
    ids: np.ndarray[Any, Any],
    bases: np.ndarray[Any, Any],
    routes: np.ndarray[Any, Any],
    offsets: np.ndarray[Any, Any],
) -> ProducerColumns:
    """Each row's producer fields: its shard's first sequence plus its place in the shard's rows."""
    n = len(routes)
    first_seq = np.array([producer.sequences[i] for i in ids.tolist()], np.int64)
    k = np.searchsorted(ids, routes)  # ids ascending: each row's shard's index in it
    seq = (first_seq[k] + offsets - bases[k]).astype(np.int32)
    return ProducerColumns(
        np.full(n, producer.producer_id, np.int64), np.full(n, producer.producer_epoch, np.int16), seq
    )
