"""Helpers shared by the engines: cutting batches into frames and an in-memory frame directory.

The ``memory`` and ``lmdb`` engines keep, per shard, a :class:`FrameTable`: the headers of
its frames in offset order (plus a running maximum timestamp for time lookups) and a start
offset. :class:`FrameTableEngine` implements every read of the :class:`~seglog.engines.base.Engine`
protocol on top of it; the subclasses say how frame bytes and key lookups are fetched.
"""

from __future__ import annotations

import abc
import asyncio
import bisect
import contextlib
import functools
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Any, Final, Protocol, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from seglog.engines.base import (
    READ_SCHEMA,
    EngineConfig,
    Quota,
    ReadOnlyReason,
    ShardStats,
    StreamBatch,
    StreamRead,
    empty_read_table,
    retention_start,
    with_offsets,  # moved to base (readers outside the engines use it); re-exported here
)
from seglog.engines.streams import StreamCollector, StreamLookups
from seglog.errors import (
    AppendFailed,
    BusyResourceError,
    ClosedResourceError,
    CorruptFrame,
    InvalidArgument,
    OffsetMismatch,
    OffsetOutOfRange,
    StorageError,
)
from seglog.io_pool import BatchWriter, IoPool, ItemError
from seglog.record import (
    EncodedFrame,
    FrameHeader,
    decode_body,
    encode_frame,
    encode_frames,
    parse_header,
    verify_frame,
)
from seglog.segment.epoch_cache import (
    MAX_EPOCH,
    UNDEFINED_EPOCH,
    UNDEFINED_OFFSET,
    EpochEntry,
    assign_entry,
    end_offset_for_epoch,
    entries_truncated_from_start,
)
from seglog.segment.producer_state import ProducerColumns, ProducerStamp, producer_runs
from seglog.topics.streams import StreamStamper

_T = TypeVar("_T")

__all__ = [
    "MAX_FRAME_RECORDS",
    "MAX_FRAME_VALUE_BYTES",
    "FrameTable",
    "FrameTableEngine",
    "IntervalSync",
    "Maintenance",
    "QueueableShard",
    "WriteGenerations",
    "await_outcomes",
    "check_frames_continue",
    "check_leader_epoch",
    "epochs_after_start",
    "epochs_with_frames",
    "frame_bytes",
    "frame_keys",
    "frame_producer",
    "parse_frames",
    "queue_appends",
    "raise_if_failed",
    "shard_end_offset_for_epoch",
    "split_batch",
    "split_stream_runs",
    "with_offsets",
]

log = logging.getLogger("seglog.engines")


def check_frames_continue(shard: int, expected_base: int, end: int) -> None:
    """Raise :class:`OffsetMismatch` unless frames starting at ``expected_base`` continue a log ending at ``end``."""
    if expected_base != end:
        raise OffsetMismatch(
            f"shard {shard}: frames start at {expected_base} but the log ends at {end}",
            expected=end,
            actual=expected_base,
            shard=shard,
        )


def parse_frames(
    data: Any, expected_base: int, *, shard: int
) -> tuple[list[EncodedFrame], list[pa.RecordBatch]]:
    """Check frames another node encoded and cut them for ``append_frames``, byte for byte.

    Every frame's magic, lengths and CRC are verified and its body decoded (zero-copy
    unless compressed, for the index); offsets must run on from ``expected_base`` without a
    gap or an overlap.

    Raises:
        CorruptFrame: A frame fails its magic, length or CRC check, or the data ends inside one.
        OffsetMismatch: A frame does not start where the one before it (or ``expected_base``) ends.
        InvalidArgument: ``data`` holds no frame.
    """
    view = memoryview(data).cast("B")
    if not len(view):
        raise InvalidArgument("append_frames needs at least one frame")
    frames: list[EncodedFrame] = []
    batches: list[pa.RecordBatch] = []
    pos = 0
    expected = expected_base
    while pos < len(view):
        header = parse_header(view, pos)
        if pos + header.size > len(view):
            raise CorruptFrame(
                f"shard {shard}: the data ends inside the frame at byte {pos} (offset {header.base_offset})"
            )
        verify_frame(view, pos, header)
        if header.base_offset != expected:
            what = "a gap" if header.base_offset > expected else "an overlap"
            raise OffsetMismatch(
                f"shard {shard}: frame at byte {pos} starts at offset {header.base_offset}, {what} after {expected}",
                expected=expected,
                actual=header.base_offset,
                shard=shard,
            )
        body = view[pos : pos + header.size]
        frames.append(EncodedFrame(header, (body,)))
        batches.append(decode_body(body, 0, header))
        expected = header.next_offset
        pos += header.size
    return frames, batches


# --- leader epochs of a frame-table shard ---------------------------------------------------
# The same rules as the segment engine's shard (its LeaderEpochCache plus "an empty cache
# means every frame has epoch 0"), over a plain list the engine stores where it likes.


def check_leader_epoch(leader_epoch: int) -> None:
    """Raise :class:`InvalidArgument` unless ``leader_epoch`` fits a frame header."""
    if not 0 <= leader_epoch <= MAX_EPOCH:
        raise InvalidArgument(f"leader_epoch must be in 0..{MAX_EPOCH}, not {leader_epoch!r}")


def epochs_with_frames(
    entries: list[EpochEntry], headers: Sequence[FrameHeader], log_start: int
) -> list[EpochEntry]:
    """``entries`` after frames ``headers`` were appended: each new epoch's first frame recorded.

    A frame whose epoch is not above the latest known one (0 for an empty list) records
    nothing, as on the segment engine. The first entry of an empty list that does not start
    at ``log_start`` is preceded by ``(0, log_start)``: what the empty list implied.
    """
    known = entries[-1][0] if entries else 0
    for h in headers:
        if h.leader_epoch > known:
            if not entries and h.base_offset > log_start:
                entries = assign_entry(entries, 0, log_start)
            entries = assign_entry(entries, h.leader_epoch, h.base_offset)
            known = h.leader_epoch
    return entries


def epochs_after_start(entries: list[EpochEntry], start: int) -> list[EpochEntry]:
    """``entries`` after the log start moved up to ``start`` (retention, ``truncate_before``).

    Only when a whole epoch went: the first entry keeps its start otherwise, as on the
    segment engine (so both answer ``end_offset_for_epoch`` alike).
    """
    if len(entries) > 1 and entries[1][1] <= start:
        return entries_truncated_from_start(entries, start)
    return entries


def shard_end_offset_for_epoch(entries: list[EpochEntry], epoch: int, end: int) -> tuple[int, int]:
    """Kafka's OffsetsForLeaderEpoch for a shard whose empty list means "every frame has epoch 0"."""
    if not entries:
        if epoch < UNDEFINED_EPOCH:
            raise InvalidArgument(f"epoch {epoch} out of range")
        return (0, end) if epoch == 0 else (UNDEFINED_EPOCH, UNDEFINED_OFFSET)
    return end_offset_for_epoch(entries, epoch, end)


# A batch is cut into frames of at most this many records / value bytes.
MAX_FRAME_RECORDS: Final = 16_384
MAX_FRAME_VALUE_BYTES: Final = 8 << 20


def frame_producer(
    producer: ProducerStamp | None, shard: int, rows_before: int
) -> tuple[int, int, int] | None:
    """The producer fields of a frame of ``shard`` whose first row is ``rows_before`` rows into its part."""
    if producer is None:
        return None
    return (producer.producer_id, producer.producer_epoch, producer.sequences[shard] + rows_before)


def split_batch(batch: pa.RecordBatch, *, frame_bytes: int | None = None) -> list[pa.RecordBatch]:
    """Cut a batch into frame-sized parts.

    Args:
        batch: The rows.
        frame_bytes: Also keep each part's Arrow bytes about this small (rows buffered from
            many appends are cut to fit the shard's ``segment_bytes``; an append's own batch
            keeps its size).
    """
    n = batch.num_rows
    values = batch.column("value")
    # From the offsets, not the data buffer's size: a slice shares its parent's whole buffer.
    offsets = (
        np.frombuffer(values.buffers()[1], np.int32, count=n + 1, offset=values.offset * 4) if n else None
    )
    total = int(offsets[-1]) - int(offsets[0]) if offsets is not None else 0
    per_frame = MAX_FRAME_RECORDS
    if total > MAX_FRAME_VALUE_BYTES:
        per_frame = max(1, min(per_frame, n * MAX_FRAME_VALUE_BYTES // total))
    # The buffers' total size bounds the rows' bytes from above and costs nothing; the exact
    # figure (``nbytes``, ~12 µs: it walks every column's offsets) only when the bound is over.
    if frame_bytes is not None and n > 1 and batch.get_total_buffer_size() > frame_bytes:
        nbytes = batch.nbytes
        if nbytes > frame_bytes:
            per_frame = max(1, min(per_frame, n * frame_bytes // nbytes))
    if n <= per_frame:
        return [batch]
    return [batch.slice(i, per_frame) for i in range(0, n, per_frame)]


# Rows the log frames itself (buffered rows of many appends) are cut where the stream changes
# when runs of one stream average at least this many rows: a stream read then skips the
# frames of other streams. Shorter runs (streams interleaved row by row) are left as they
# are: frames that small would cost more than skipping saves.
MIN_STREAM_RUN_ROWS: Final = 64


def split_stream_runs(batch: pa.RecordBatch, *, frame_bytes: int | None = None) -> list[pa.RecordBatch]:
    """:func:`split_batch`, after cutting the rows at stream changes when streams come in runs."""
    n = batch.num_rows
    if n < 2 * MIN_STREAM_RUN_ROWS:
        return split_batch(batch, frame_bytes=frame_bytes)
    streams = batch.column("stream").to_numpy()
    cuts = np.flatnonzero(streams[1:] != streams[:-1]) + 1
    if not len(cuts) or n < MIN_STREAM_RUN_ROWS * (len(cuts) + 1):
        return split_batch(batch, frame_bytes=frame_bytes)
    bounds = [0, *cuts.tolist(), n]
    out: list[pa.RecordBatch] = []
    for lo, hi in itertools.pairwise(bounds):
        out.extend(split_batch(batch.slice(lo, hi - lo), frame_bytes=frame_bytes))
    return out


def encode_batch(
    batch: pa.RecordBatch,
    base: int,
    *,
    compression: int,
    leader_epoch: int,
    producer: tuple[int, int, int] | None = None,
) -> list[tuple[EncodedFrame, pa.RecordBatch]]:
    """An append's batch as frames from ``base`` (:func:`split_batch`), each with its rows;
    ``producer`` ``(id, epoch, sequence of the first row)`` is stamped per frame."""
    out: list[tuple[EncodedFrame, pa.RecordBatch]] = []
    offset = base
    for part in split_batch(batch):
        stamp = None if producer is None else (producer[0], producer[1], producer[2] + offset - base)
        out.append(
            (
                encode_frame(
                    part, offset, compression=compression, leader_epoch=leader_epoch, producer=stamp
                ),
                part,
            )
        )
        offset += part.num_rows
    return out


def encode_rows(
    rows: pa.RecordBatch,
    offset: int,
    stamps: ProducerColumns | None,
    *,
    compression: int,
    leader_epoch: int,
    frame_bytes: int | None,
) -> tuple[list[EncodedFrame], list[pa.RecordBatch]]:
    """Frames of one shard's buffered rows from ``offset`` on: cut by producer run, then as
    :func:`split_stream_runs` cuts; each frame stamped with its first row's producer fields."""
    frames: list[EncodedFrame] = []
    batches: list[pa.RecordBatch] = []
    n = rows.num_rows
    for lo, hi, producer in producer_runs(stamps, n):
        run = rows if hi - lo == n else rows.slice(lo, hi - lo)
        first = offset
        for part in split_stream_runs(run, frame_bytes=frame_bytes):
            stamp = None if producer is None else (producer[0], producer[1], producer[2] + offset - first)
            frames.append(
                encode_frame(part, offset, compression=compression, leader_epoch=leader_epoch, producer=stamp)
            )
            batches.append(part)
            offset += part.num_rows
    return frames, batches


def encode_shard_rows(
    rows: pa.RecordBatch,
    starts: np.ndarray[Any, Any],
    counts: np.ndarray[Any, Any],
    offsets: Sequence[int],
    stamps: ProducerColumns | None,
    *,
    compression: int,
    leader_epoch: int,
    frame_bytes: Sequence[int | None],
) -> list[tuple[list[EncodedFrame], list[pa.RecordBatch]]]:
    """:func:`encode_rows` of many shards' buffered rows at once, the same frames.

    Shard ``i``'s rows are ``rows[starts[i] : starts[i] + counts[i]]`` (every count > 0, the
    shards one after the other) from offset ``offsets[i]``, with ``frame_bytes[i]``. When no
    run of rows is long enough to be cut (by stream or by size), every producer run is one
    frame: the runs, their base offsets and producer fields are found for all shards with a
    few NumPy steps and the frames encoded by :func:`encode_frames`; otherwise each shard
    goes through :func:`encode_rows`.
    """
    k = len(starts)
    if not k:
        return []
    starts = np.asarray(starts, np.int64)
    counts = np.asarray(counts, np.int64)
    n = rows.num_rows
    if stamps is None:
        piece_starts = starts
    else:
        pid, epoch, seq = stamps
        # producer_runs' breaks, over every shard's rows at once (a shard's start breaks too).
        breaks = (
            np.flatnonzero(
                (pid[1:] != pid[:-1])
                | (epoch[1:] != epoch[:-1])
                | ((pid[1:] >= 0) & (seq[1:] != seq[:-1] + 1))
            )
            + 1
        )
        piece_starts = np.union1d(starts, breaks)
    lengths = np.diff(piece_starts, append=n)
    values = rows.column("value")
    value_offsets = np.frombuffer(values.buffers()[1], np.int32, count=n + 1, offset=values.offset * 4)
    bounds = [fb for fb in frame_bytes if fb is not None]
    fast = (
        int(starts[0]) == 0
        and int(starts[-1] + counts[-1]) == n
        and bool((starts[1:] == starts[:-1] + counts[:-1]).all())
        and int(lengths.max()) < 2 * MIN_STREAM_RUN_ROWS  # not cut at stream changes
        and int(value_offsets[-1]) - int(value_offsets[0]) <= MAX_FRAME_VALUE_BYTES
        and (not bounds or rows.get_total_buffer_size() <= min(bounds))  # a slice's bound is its parent's
    )
    if not fast:
        return [
            encode_rows(
                rows.slice(a, c),
                offset,
                None if stamps is None else stamps.slice(a, a + c),
                compression=compression,
                leader_epoch=leader_epoch,
                frame_bytes=fb,
            )
            for a, c, offset, fb in zip(starts.tolist(), counts.tolist(), offsets, frame_bytes, strict=True)
        ]
    shard_of = np.searchsorted(starts, piece_starts, side="right") - 1
    bases = (np.asarray(offsets, np.int64)[shard_of] + (piece_starts - starts[shard_of])).tolist()
    producers: list[tuple[int, int, int] | None] | None = None
    if stamps is not None:
        producers = [
            None if p < 0 else (p, e, q)
            for p, e, q in zip(
                stamps.pid[piece_starts].tolist(),
                stamps.epoch[piece_starts].tolist(),
                stamps.seq[piece_starts].tolist(),
                strict=True,
            )
        ]
    lo, ln = piece_starts.tolist(), lengths.tolist()
    frames = encode_frames(
        rows, lo, ln, bases, compression=compression, leader_epoch=leader_epoch, producers=producers
    )
    batches = [rows.slice(a, b) for a, b in zip(lo, ln, strict=True)]
    if len(frames) == k:  # one frame per shard (no producer run cut one)
        return [([f], [b]) for f, b in zip(frames, batches, strict=True)]
    per_shard = np.bincount(shard_of, minlength=k).tolist()
    out: list[tuple[list[EncodedFrame], list[pa.RecordBatch]]] = []
    i = 0
    for m in per_shard:
        out.append((frames[i : i + m], batches[i : i + m]))
        i += m
    return out


def frame_keys(batch: pa.RecordBatch, base: int) -> list[tuple[bytes, int]]:
    """``(key, offset)`` of every keyed record of a frame starting at ``base``."""
    keys = batch.column("key")
    if keys.null_count == len(keys):
        return []
    return [(k, base + i) for i, k in enumerate(keys.to_pylist()) if k is not None]


def frame_bytes(frame: EncodedFrame) -> bytes:
    """The frame exactly as the segment engine writes it (header, body, padding)."""
    return b"".join(frame.buffers)


def decode_frame(buf: bytes, header: FrameHeader) -> pa.RecordBatch:
    """Check the CRC of a stored frame and decode its batch."""
    verify_frame(buf, 0, header)
    return decode_body(buf, 0, header)


class FrameTable:
    """The frames of one shard in offset order, with their sizes and a running max timestamp.

    ``extra`` holds one engine-defined value per frame (the memory engine keeps the frame
    bytes there). Every access goes through :attr:`lock`.
    """

    def __init__(self, start: int = 0) -> None:
        self.lock = threading.Lock()
        self.headers: list[FrameHeader] = []
        self.bases: list[int] = []
        self.run_max: list[int] = []
        self.extra: list[Any] = []
        self.start = start
        self.end = start
        self.bytes = 0
        # Leader epochs ((epoch, start offset), empty: every frame has epoch 0) and the high
        # watermark, kept here so they change under the same lock as the frames.
        self.epochs: list[EpochEntry] = []
        self.hw = 0

    def add(self, header: FrameHeader, extra: Any = None) -> None:
        """Append a frame (caller holds the lock)."""
        prev = self.run_max[-1] if self.run_max else header.max_ts
        self.headers.append(header)
        self.bases.append(header.base_offset)
        self.run_max.append(max(prev, header.max_ts))
        self.extra.append(extra)
        self.end = header.next_offset
        self.bytes += header.size

    def index_of(self, offset: int) -> int:
        """Index of the frame holding ``offset`` (``-1``: before the first frame)."""
        return bisect.bisect_right(self.bases, offset) - 1

    def cut_point(self, offset: int) -> int:
        """The end a ``truncate_to(offset)`` leaves: ``offset`` or the base of the frame holding it.

        Frames are shipped and checksummed whole, so a cut is at a frame boundary; never
        below the start (a frame straddling the start goes whole, its head was unreadable).
        """
        if offset >= self.end:
            return self.end
        i = self.index_of(offset)
        return max(self.start, self.bases[i]) if i >= 0 else max(self.start, offset)

    def doomed_from(self, end: int) -> list[tuple[FrameHeader, Any]]:
        """Frames holding any offset at or past ``end`` (what cutting the log at ``end`` removes)."""
        k = len(self.headers)
        while k and self.headers[k - 1].next_offset > end:
            k -= 1
        return list(zip(self.headers[k:], self.extra[k:], strict=True))

    def cut_end(self, end: int) -> None:
        """Forget the frames holding any offset at or past ``end``; the log ends at ``end``."""
        k = len(self.headers) - len(self.doomed_from(end))
        self.bytes -= sum(h.size for h in self.headers[k:])
        del self.headers[k:], self.bases[k:], self.run_max[k:], self.extra[k:]
        self.end = end

    def span(self, offset: int, stop: int) -> list[tuple[FrameHeader, Any]]:
        """Frames overlapping ``[offset, stop)``."""
        i = max(0, self.index_of(offset))
        out = []
        while i < len(self.headers) and self.bases[i] < stop:
            h = self.headers[i]
            if h.next_offset > offset:
                out.append((h, self.extra[i]))
            i += 1
        return out

    def time_candidate(self, ts: int, after: int) -> tuple[int, FrameHeader, Any] | None:
        """The first frame at index ``>= after`` past the start that has a record with ``ts >=`` the given one."""
        i = max(after, bisect.bisect_left(self.run_max, ts), self.index_of(self.start), 0)
        while i < len(self.headers):
            h = self.headers[i]
            if h.max_ts >= ts and h.next_offset > self.start:
                return i, h, self.extra[i]
            i += 1
        return None

    def doomed_before(self, start: int) -> list[tuple[FrameHeader, Any]]:
        """Frames wholly below ``start``."""
        return [(h, e) for h, e in zip(self.headers, self.extra, strict=True) if h.next_offset <= start]

    def drop_before(self, start: int) -> int:
        """Move the start up to ``start``; forget the frames wholly below it; return their bytes."""
        self.start = max(self.start, start)
        k = 0
        while k < len(self.headers) and self.headers[k].next_offset <= self.start:
            k += 1
        freed = sum(h.size for h in self.headers[:k])
        if k:
            del self.headers[:k], self.bases[:k], self.run_max[:k], self.extra[:k]
        self.bytes -= freed
        self.end = max(self.end, self.start)
        return freed

    def retention_start(
        self, retention_bytes: int | None, retention_ms: int | None, now_us: int, floor: int | None
    ) -> int | None:
        """The start offset retention allows (whole frames, oldest first); ``None``: no change."""
        units = ((h.next_offset, h.size, h.max_ts) for h in self.headers)
        new_start = retention_start(units, self.bytes, retention_bytes, retention_ms, now_us, floor)
        if new_start is None or new_start <= self.start:
            return None
        return new_start


class WriteGenerations:
    """Offset assignment that survives a failed write (base of every queued shard writer).

    Offsets are assigned on the event loop (:attr:`next_offset`) and written in that order by
    the shard's I/O worker. When a write fails and is rolled back, the offsets already handed
    to requests queued behind it no longer continue the log. Each request therefore carries
    the generation it was assigned in; the worker refuses requests of an older generation
    than its own, and :meth:`rewind` moves the loop's next offset back to the durable end in
    a new generation, so later appends continue the log with no gap.
    """

    number: int

    def __init__(self, next_offset: int) -> None:
        self.next_offset = next_offset  # event-loop thread
        self.gen = 0  # event-loop thread
        self.failed: BaseException | None = None  # set by the worker: read-only until reopen
        self.read_only_reason: ReadOnlyReason | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._min_gen = 0  # worker thread
        # The database's stamper (None: no streams): a rewind forgets what refused requests
        # taught the shard's trie, since their offsets are handed out again.
        self.stamper: StreamStamper | None = None

    def make_read_only(self, exc: BaseException, reason: ReadOnlyReason) -> None:
        """(Worker) Refuse every later write until reopen; ``reason`` completes "read-only after …"."""
        self.failed = exc
        self.read_only_reason = reason
        log.error("shard %d: %s (%s); read-only until reopen", self.number, reason, exc)

    def check_writable(self) -> None:
        """Raise :class:`StorageError` if the shard is read-only."""
        if self.failed is not None:
            raise StorageError(
                f"shard {self.number} is read-only after {self.read_only_reason}; reopen the store"
            ) from self.failed

    def split_stale(self, items: Sequence[Any]) -> tuple[list[Any], list[Any]]:
        """The live items (``item.gen`` current) and a result list with stale ones failed.

        Raises:
            StorageError: The shard is read-only (every item fails).
        """
        self.check_writable()
        results: list[Any] = [None] * len(items)
        live = []
        for i, item in enumerate(items):
            if item.gen < self._min_gen:
                results[i] = ItemError(
                    StorageError(
                        "not written: an earlier write to this shard failed and was rolled back; retry"
                    )
                )
            else:
                live.append(item)
        return live, results

    @staticmethod
    def merge_results(results: list[Any], live_results: Sequence[Any]) -> list[Any]:
        """Fill the live items' results into ``results`` (from :meth:`split_stale`)."""
        it = iter(live_results)
        return [next(it) if r is None else r for r in results]

    def rewind(self, gen: int, end: int) -> None:
        """(Worker) Requests of ``gen`` are refused from now on; new offsets restart at ``end``."""
        self._min_gen = gen + 1
        loop = self.loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # a closed loop appends nothing more
                loop.call_soon_threadsafe(self._rewound, gen, end)

    def _rewound(self, gen: int, end: int) -> None:
        if self.gen == gen:
            self.gen = gen + 1
            self.next_offset = end
            if self.stamper is not None:
                self.stamper.cut(self.number, end)


class IntervalSync:
    """The ``fsync="interval"`` bookkeeping of one writer (worker thread only).

    A writer asks :meth:`due` after each write; when it says no, the write is acknowledged
    unsynced and :meth:`deadline` tells the I/O worker when the sync is owed.
    """

    def __init__(self, interval_ms: int) -> None:
        self._interval_s = interval_ms / 1000
        self._last_sync_s = time.monotonic()
        self._unsynced_since_s: float | None = None

    @property
    def pending(self) -> bool:
        """Whether acknowledged writes are waiting for a sync."""
        return self._unsynced_since_s is not None

    def due(self) -> bool:
        """After a write: whether to sync now (else the write is recorded as unsynced)."""
        now = time.monotonic()
        if now - self._last_sync_s >= self._interval_s:
            return True
        if self._unsynced_since_s is None:
            self._unsynced_since_s = now
        return False

    def synced(self) -> None:
        """Record a successful sync."""
        self._last_sync_s = time.monotonic()
        self._unsynced_since_s = None

    def deadline(self) -> float | None:
        """``time.monotonic()`` by which the pending writes must be synced (``None``: nothing pending)."""
        return None if self._unsynced_since_s is None else self._unsynced_since_s + self._interval_s


class Maintenance:
    """Runs callables on a shard's I/O worker, ordered with its appends (a :class:`BatchWriter`)."""

    def write_batch(self, items: Sequence[Callable[[], Any]]) -> Sequence[Any]:
        return [item() for item in items]

    def sync_deadline(self) -> float | None:
        return None

    def flush_idle(self) -> None:
        pass


class QueueableShard(BatchWriter, Protocol):
    """A shard an engine appends to through the :class:`IoPool`."""

    number: int
    next_offset: int
    gen: int
    loop: asyncio.AbstractEventLoop | None

    def check_writable(self) -> None: ...


def check_writable(shards: Sequence[QueueableShard]) -> None:
    """Raise :class:`StorageError` if any shard is read-only."""
    for s in shards:
        s.check_writable()


async def queue_appends(
    io_pool: IoPool,
    shards: Sequence[QueueableShard],
    encoded: Sequence[tuple[Any, int]],
    sizes: Sequence[int],
    quota: Quota | None,
    listener: Callable[[int], None] | None,
    *,
    admitted: Quota | None = None,
) -> list[int]:
    """Admit, assign offsets, queue each shard's encoded frames on its I/O worker, await durability.

    ``admitted``: the quota the caller already admitted ``sizes`` to (failed parts give
    their bytes back to it, as to ``quota``).

    ``encoded`` holds, per shard, the writer's pending item and the offset after it; ``sizes``
    its bytes. The offsets are taken without awaiting, so concurrent appends cannot
    interleave. The bytes of parts that fail are given back to ``quota``.

    Returns:
        The base offset of each shard's part.

    Raises:
        QuotaExceeded: From ``quota``; nothing was queued.
        AppendFailed: Some parts failed (nothing of them is in the log); the others were written.
    """
    if quota is not None:
        quota.admit(sum(sizes))
    else:
        quota = admitted
    loop = asyncio.get_running_loop()
    bases: list[int] = []
    futures: list[asyncio.Future[Any]] = []
    queued: list[int] = []  # index into shards of each future
    for i, (s, (pending, end)) in enumerate(zip(shards, encoded, strict=True)):
        bases.append(s.next_offset)
        if end == s.next_offset:
            continue
        s.loop = loop
        s.next_offset = end
        fut = io_pool.submit(s.number, s, pending)
        if listener is not None:
            fut.add_done_callback(functools.partial(_notify, listener, s.number))
        futures.append(fut)
        queued.append(i)
    outcomes = await await_outcomes(futures)
    failed: dict[int, BaseException] = {}
    written: dict[int, int] = {}
    for i, outcome in zip(queued, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            failed[shards[i].number] = outcome
            if quota is not None:
                quota.release(sizes[i])
        else:
            written[shards[i].number] = bases[i]
    raise_if_failed(failed, written)
    return bases


async def await_outcomes(futures: Sequence[asyncio.Future[Any]]) -> list[Any]:
    """Each future's result, or its :class:`StorageError` (any other exception propagates)."""
    if len(futures) == 1:
        # The common single-request case, without gather's bookkeeping.
        try:
            return [await futures[0]]
        except StorageError as exc:
            return [exc]
    return list(await asyncio.gather(*futures, return_exceptions=True))


def raise_if_failed(failed: dict[int, BaseException], written: dict[int, int]) -> None:
    """Raise :class:`AppendFailed` naming the failed and written shards (nothing if none failed).

    An exception that is not a :class:`StorageError` (a bug, a cancellation) is re-raised as is.
    """
    if not failed:
        return
    first = next(iter(failed.values()))
    if not isinstance(first, StorageError):
        raise first
    raise AppendFailed(
        f"append failed on shard(s) {sorted(failed)} (nothing of those parts was kept)"
        + (f"; the parts for shard(s) {sorted(written)} were written" if written else ""),
        failed=failed,
        written=written,
    ) from first


def _notify(listener: Callable[[int], None], shard: int, _fut: asyncio.Future[Any]) -> None:
    listener(shard)


class FrameTableEngine(StreamLookups, abc.ABC):
    """Reads of the engine protocol over :class:`FrameTable` shards (see the module docstring)."""

    name: str = "frames"

    def __init__(self, config: EngineConfig, tables: list[FrameTable], executor: Executor | None) -> None:
        self.config = config
        self._tables = tables
        self._executor = executor
        self._closed = False
        self.listener: Callable[[int], None] | None = None
        self.listener_many: Callable[[np.ndarray[Any, Any]], None] | None = None  # not used here
        # Shards a truncate_to is cutting: appends to them are refused until it is done.
        self._truncating: set[int] = set()
        self._streams: StreamStamper | None = (
            StreamStamper(config.shards, config.lts_thresholds) if config.lts_thresholds is not None else None
        )
        #: Frames decoded by :meth:`read_stream`.
        self.stream_frames_read = 0

    # --- for subclasses ----------------------------------------------------------------

    @abc.abstractmethod
    def _fetch(self, shard: int, frames: Sequence[tuple[FrameHeader, Any]]) -> list[bytes]:
        """The bytes of ``frames`` (a frame that is gone raises :class:`OffsetOutOfRange`)."""

    @abc.abstractmethod
    def _key_offsets(self, shard: int, key: bytes) -> list[int]:
        """Offsets that may hold ``key`` (a superset; filtered against the real key)."""

    @abc.abstractmethod
    async def append_many(
        self,
        parts: Sequence[tuple[int, pa.RecordBatch]],
        quota: Quota | None = None,
        *,
        leader_epoch: int = 0,
        producer: ProducerStamp | None = None,
    ) -> list[int]:
        """Append batches to distinct shards, frames stamped with ``leader_epoch`` (the engine protocol's)."""

    @abc.abstractmethod
    async def append_frames(self, shard: int, frames: Any, *, expected_base: int) -> int:
        """Store frames another node encoded, byte for byte (the engine protocol's)."""

    @abc.abstractmethod
    async def _cut(self, shard: int, offset: int) -> int:
        """Remove the frames of ``shard`` holding ``offset`` or later, with their key entries,
        and cut its epochs and high watermark; return the new end (checks are done)."""

    async def producer_headers(self, shard: int) -> list[FrameHeader]:
        """Headers of the frames of ``shard`` an idempotent producer wrote, oldest first."""
        t = self._table(shard)
        with t.lock:
            return [h for h in t.headers if h.producer_id >= 0]

    def _assigned_end(self, shard: int) -> int:
        """The offset after the last one handed to an append (queued ones included)."""
        return self._tables[shard].end

    def _check_writable(self, shard: int) -> None:
        """Raise :class:`StorageError` if ``shard`` takes no writes."""

    def _hw_moved(self, shard: int) -> None:
        """The high watermark of ``shard`` moved up (an engine may persist it lazily)."""

    def _check_not_truncating(self, shards: Sequence[int]) -> None:
        busy = self._truncating.intersection(shards)
        if busy:
            raise BusyResourceError(f"shards {sorted(busy)} are being truncated; retry")

    async def append_routed(
        self,
        batch: pa.RecordBatch,
        routes: np.ndarray[Any, np.dtype[np.int32]],
        quota: Quota | None = None,
        *,
        leader_epoch: int = 0,
        producer: ProducerStamp | None = None,
    ) -> np.ndarray[Any, np.dtype[np.int64]]:
        """Append rows to the shards ``routes`` names, one part per shard (:meth:`append_many`)."""
        order = np.argsort(routes, kind="stable")
        counts = np.bincount(routes, minlength=len(self._tables))
        parts: list[tuple[int, np.ndarray[Any, Any]]] = []
        start = 0
        for s, c in enumerate(counts.tolist()):
            if c:
                parts.append((s, order[start : start + c]))
                start += c
        bases = await self.append_many(
            [(s, batch.take(pa.array(idx))) for s, idx in parts],
            quota,
            leader_epoch=leader_epoch,
            producer=producer,
        )
        offsets = np.empty(batch.num_rows, np.int64)
        for (_, idx), base in zip(parts, bases, strict=True):
            offsets[idx] = np.arange(base, base + len(idx), dtype=np.int64)
        return offsets

    # --- streams -----------------------------------------------------------------------

    def _check_shard_number(self, shard: int) -> None:
        self._table(shard)

    def _frame_may_hold(self, extra: Any, stream: int) -> bool:
        """Whether a frame (its ``extra``) may hold records of ``stream`` (without decoding it)."""
        del extra, stream
        return True

    def read_stream_blocking(
        self, shard: int, offset: int, want: StreamRead, max_records: int, max_frames: int
    ) -> StreamBatch:
        """Blocking body of :meth:`read_stream`: the frames from ``offset``, filtered."""
        t = self._table(shard)
        with t.lock:
            start, end = t.start, t.end
            offset = min(max(offset, start), end)  # (see the segment engine's read_stream)
            picked = t.span(offset, end) if offset < end else []
        collector = StreamCollector(want, max_records, max_frames)
        pos = offset
        try:
            for (h, extra), buf in zip(picked, self._fetch_lazy(shard, picked), strict=True):
                if self._frame_may_hold(extra, want.stream):
                    batch = self._decode(shard, buf(), h)
                    collector.add(
                        batch, h.base_offset, max(pos, h.base_offset) - h.base_offset, h.record_count
                    )
                pos = h.next_offset
                if collector.done:
                    break
            else:
                pos = max(pos, end)
        finally:
            self.stream_frames_read += collector.frames
        return collector.result(pos)

    def _fetch_lazy(self, shard: int, frames: Sequence[tuple[FrameHeader, Any]]) -> list[Callable[[], bytes]]:
        """A getter of each frame's bytes, called only for frames that are decoded."""
        return [functools.partial(lambda f: self._fetch(shard, [f])[0], f) for f in frames]

    async def read_stream(
        self, shard: int, offset: int, want: StreamRead, max_records: int, max_frames: int
    ) -> StreamBatch:
        """Up to ``max_records`` rows of one stream from ``offset`` (see :class:`StreamEngine`)."""
        self._stamper()
        batch: StreamBatch = await self._run(
            self.read_stream_blocking, shard, offset, want, max_records, max_frames
        )
        return batch

    # --- common ------------------------------------------------------------------------

    def _table(self, shard: int) -> FrameTable:
        if self._closed:
            raise ClosedResourceError("the database is closed")
        if not 0 <= shard < len(self._tables):
            raise InvalidArgument(f"shard {shard} out of range 0..{len(self._tables) - 1}")
        return self._tables[shard]

    def start_offset(self, shard: int) -> int:
        return self._table(shard).start

    def end_offset(self, shard: int) -> int:
        return self._table(shard).end

    def stats(self, shard: int) -> ShardStats:
        """``segments`` is always 0: these engines keep no segment files; ``bytes`` are frame bytes."""
        t = self._table(shard)
        with t.lock:
            return ShardStats(shard, t.start, t.end, 0, t.bytes)

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fn, *args)

    def _decode(self, shard: int, buf: bytes, h: FrameHeader) -> pa.RecordBatch:
        try:
            return decode_frame(buf, h)
        except CorruptFrame as exc:
            raise StorageError(f"shard {shard}: corrupt frame at offset {h.base_offset}") from exc

    def read_arrow_blocking(
        self, shard: int, offset: int, max_records: int, upper: int | None = None
    ) -> pa.Table:
        t = self._table(shard)
        if max_records < 1:
            raise InvalidArgument("max_records must be >= 1")
        with t.lock:
            start, end = t.start, t.end
            if not start <= offset <= end:
                raise OffsetOutOfRange(offset, start, end, shard=shard)
            stop = min(end, offset + max_records)
            if upper is not None:
                stop = min(stop, upper)
            picked = t.span(offset, stop) if offset < stop else []
        if not picked:
            return empty_read_table()
        out: list[pa.RecordBatch] = []
        for (h, _), buf in zip(picked, self._fetch(shard, picked), strict=True):
            batch = self._decode(shard, buf, h)
            lo = max(offset, h.base_offset) - h.base_offset
            hi = min(stop, h.next_offset) - h.base_offset
            out.append(with_offsets(batch, h.base_offset, lo, hi))
        return pa.Table.from_batches(out, schema=READ_SCHEMA)

    async def read_arrow(
        self, shard: int, offset: int, max_records: int, upper: int | None = None
    ) -> pa.Table:
        """Records ``[offset, min(end, offset + max_records, upper))`` (``upper``: e.g. the high
        watermark a server caps consumers at)."""
        return await self._run(self.read_arrow_blocking, shard, offset, max_records, upper)

    async def read_arrow_then(
        self,
        shard: int,
        offset: int,
        max_records: int,
        then: Callable[[pa.Table], _T],
        upper: int | None = None,
    ) -> _T:
        """:meth:`read_arrow`, then ``then(table)`` on the same executor thread."""

        def job() -> _T:
            return then(self.read_arrow_blocking(shard, offset, max_records, upper))

        result: _T = await self._run(job)
        return result

    def offset_for_time_blocking(self, shard: int, ts: int) -> int:
        t = self._table(shard)
        after = 0
        while True:
            with t.lock:
                start, end = t.start, t.end
                found = t.time_candidate(ts, after)
                if found is not None:
                    # Indexes shift when the front is dropped: continue by offset, not index.
                    i, h, extra = found
                    after_offset = h.next_offset
            if found is None:
                return end
            buf = self._fetch(shard, [(h, extra)])[0]
            batch = self._decode(shard, buf, h)
            first_row = max(start, h.base_offset) - h.base_offset
            mask = pc.greater_equal(batch.column("ts").slice(first_row), ts)
            idx = int(pc.index(mask, True).as_py())
            if idx >= 0:
                return h.base_offset + first_row + idx
            with t.lock:
                after = max(i + 1, t.index_of(after_offset))

    async def offset_for_time(self, shard: int, ts: int) -> int:
        offset: int = await self._run(self.offset_for_time_blocking, shard, ts)
        return offset

    def read_key_blocking(self, shard: int, key: bytes) -> pa.Table:
        t = self._table(shard)
        candidates = self._key_offsets(shard, key)
        with t.lock:
            start, end = t.start, t.end
            offsets = sorted({o for o in candidates if start <= o < end})
            groups: list[tuple[tuple[FrameHeader, Any], list[int]]] = []
            for o in offsets:
                if groups and o < groups[-1][0][0].next_offset:
                    groups[-1][1].append(o)
                    continue
                i = t.index_of(o)
                groups.append(((t.headers[i], t.extra[i]), [o]))
        if not groups:
            return empty_read_table()
        out: list[pa.RecordBatch] = []
        bufs = self._fetch(shard, [g[0] for g in groups])
        for ((h, _), offs), buf in zip(groups, bufs, strict=True):
            batch = self._decode(shard, buf, h)
            rows_arr = pa.array([o - h.base_offset for o in offs], pa.int64())
            picked = batch.take(rows_arr)
            keep = pc.equal(picked.column("key"), pa.scalar(key, pa.binary()))
            offs_arr = pc.add(rows_arr, h.base_offset).filter(keep)
            out.append(
                pa.RecordBatch.from_arrays([offs_arr, *picked.filter(keep).columns], schema=READ_SCHEMA)
            )
        return pa.Table.from_batches(out, schema=READ_SCHEMA)

    async def read_key(self, shard: int, key: bytes) -> pa.Table:
        return await self._run(self.read_key_blocking, shard, key)

    # --- replica log -------------------------------------------------------------------

    def read_frames_blocking(self, shard: int, offset: int, max_bytes: int) -> bytes:
        """Blocking body of :meth:`read_frames`."""
        t = self._table(shard)
        with t.lock:
            start, end = t.start, t.end
            if not start <= offset <= end:
                raise OffsetOutOfRange(offset, start, end, shard=shard)
            if max_bytes < 1:
                raise InvalidArgument("max_bytes must be >= 1")
            picked: list[tuple[FrameHeader, Any]] = []
            total = 0
            for h, extra in t.span(offset, end) if offset < end else []:
                if picked and total + h.size > max_bytes:
                    break
                picked.append((h, extra))
                total += h.size
        if not picked:
            return b""
        return b"".join(self._fetch(shard, picked))

    async def read_frames(self, shard: int, offset: int, max_bytes: int) -> bytes:
        """The stored frames of ``shard`` from the one holding ``offset``, byte for byte.

        At least one frame (if any lies at or after ``offset``), otherwise at most
        ``max_bytes``; only acknowledged frames.

        Raises:
            OffsetOutOfRange: ``offset`` is outside ``[start, end]``.
        """
        data: bytes = await self._run(self.read_frames_blocking, shard, offset, max_bytes)
        return data

    def _check_append_frames(self, shard: int, expected_base: int) -> None:
        """After parsing (it awaited): refuse a truncating shard or a base that is not the end."""
        self._check_not_truncating([shard])
        check_frames_continue(shard, expected_base, self._assigned_end(shard))

    async def truncate_to(self, shard: int, offset: int, *, force: bool = False) -> int:
        """Remove every record of ``shard`` at or after ``offset`` (a follower diverged).

        The cut is at a frame boundary: the new end is ``offset`` or the base of the frame
        holding it. The leader-epoch entries starting at or past the new end go, and a high
        watermark above it is reset to it. Appends to the shard are refused while it runs.

        Returns:
            The new end offset.

        Raises:
            OffsetOutOfRange: ``offset`` is below the log start or past the end.
            InvalidArgument: ``offset`` is below the high watermark and not ``force``.
            BusyResourceError: The shard is already being truncated.
            StorageError: The cut failed; nothing of it was done.
        """
        t = self._table(shard)
        self._check_writable(shard)
        if offset < t.hw and not force:
            raise InvalidArgument(
                f"shard {shard}: truncate_to({offset}) is below the high watermark {t.hw}; "
                "records below it may have been read (force=True to cut anyway)"
            )
        if shard in self._truncating:
            raise BusyResourceError(f"shard {shard} is already being truncated")
        end = self._assigned_end(shard)
        if not t.start <= offset <= end:
            raise OffsetOutOfRange(offset, t.start, end, shard=shard)
        self._truncating.add(shard)
        try:
            return await self._cut(shard, offset)
        finally:
            self._truncating.discard(shard)

    def end_offset_for_epoch(self, shard: int, epoch: int) -> tuple[int, int]:
        """Kafka's OffsetsForLeaderEpoch for ``shard``: the largest epoch at or below ``epoch``
        this log knows and the offset where it ends (``(-1, -1)`` when there is none)."""
        t = self._table(shard)
        with t.lock:
            return shard_end_offset_for_epoch(t.epochs, epoch, t.end)

    def leader_epochs(self, shard: int) -> list[tuple[int, int]]:
        """The shard's leader-epoch entries: ``(epoch, start offset)``, oldest first."""
        t = self._table(shard)
        with t.lock:
            return list(t.epochs)

    def high_watermark(self, shard: int) -> int:
        """The shard's high watermark."""
        return self._table(shard).hw

    def update_high_watermark(self, shard: int, hw: int) -> bool:
        """Move the high watermark up to ``hw`` (never down; at most the end offset).

        Returns:
            Whether it moved.

        Raises:
            OffsetOutOfRange: ``hw`` is past the end offset.
        """
        t = self._table(shard)
        with t.lock:
            if not 0 <= hw <= t.end:
                raise OffsetOutOfRange(hw, t.start, t.end, shard=shard)
            if hw <= t.hw:
                return False
            t.hw = hw
        self._hw_moved(shard)
        return True

    def reconfigure(self, *, segment_bytes: int, segment_ms: int) -> None:
        """No segments to roll: accepted and ignored."""
