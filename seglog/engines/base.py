"""The engine protocol: what the database layer needs from a storage engine.

An engine stores the shards of one database. It receives validated Arrow batches with
:data:`seglog.record.FRAME_SCHEMA`, assigns dense offsets, makes them durable according to
its own rules, and answers reads with Arrow tables that carry an ``offset`` column. The DB
layer never knows which engine it drives.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, NamedTuple, Protocol, TypeVar, runtime_checkable

import numpy as np
import pyarrow as pa

from seglog.record import DEFAULT_MAX_RECORD_BYTES, READ_SCHEMA, FrameHeader
from seglog.segment.producer_state import ProducerStamp

__all__ = [
    "DEFAULT_SEGMENT_BYTES",
    "DEFAULT_SEGMENT_MS",
    "READ_SCHEMA",
    "Engine",
    "EngineConfig",
    "EngineReader",
    "Fsync",
    "FsyncPolicy",
    "GenerationEngine",
    "GenerationInfo",
    "Quota",
    "ReadFrame",
    "ReadOnlyReason",
    "SegmentInfo",
    "SegmentedEngine",
    "ShardCursor",
    "ShardFiles",
    "ShardStats",
    "StreamBatch",
    "StreamEngine",
    "StreamRead",
    "empty_read_table",
    "retention_start",
    "with_offsets",
]

FsyncPolicy = Literal["always", "interval", "never"]
"""The ``fsync`` argument users pass (a plain string in the public API)."""


class Fsync(enum.StrEnum):
    """The fsync policies, for comparisons inside the engines (equal to the user's strings)."""

    ALWAYS = "always"
    INTERVAL = "interval"
    NEVER = "never"


class ReadOnlyReason(enum.StrEnum):
    """Why a shard or writer turned read-only; the value completes "read-only after …"."""

    FAILED_SYNC = "a failed sync (acknowledged writes since the last sync may be lost)"
    FAILED_FSYNC = "a failed fsync (acknowledged writes since the last sync may be lost)"
    UNDO_FAILED = "a write it could not undo"
    SEGMENT_UNDO_FAILED = "a segment write it could not undo"
    DURABLE_END_FAILED = "publishing a durable end failed"
    TRUNCATION_FAILED = "a truncation it could not finish (the next open completes it)"
    EPOCH_CACHE_FAILED = "writing a leader-epoch cache or high watermark failed"


DEFAULT_SEGMENT_BYTES: Final = 256 << 20
DEFAULT_SEGMENT_MS: Final = 7 * 24 * 3600 * 1000


_EMPTY_READ_TABLE: Final = READ_SCHEMA.empty_table()


def empty_read_table() -> pa.Table:
    """A table with :data:`READ_SCHEMA` and no rows (one shared table: tables are immutable,
    and building one costs ~25 µs, what an empty long-poll read costs in all otherwise)."""
    return _EMPTY_READ_TABLE


def with_offsets(batch: pa.RecordBatch, base: int, start_row: int, stop_row: int) -> pa.RecordBatch:
    """Rows ``start_row:stop_row`` of a frame batch with an ``offset`` column (:data:`READ_SCHEMA`)."""
    part = batch.slice(start_row, stop_row - start_row)
    offsets = pa.array(np.arange(base + start_row, base + stop_row, dtype=np.int64))
    return pa.RecordBatch.from_arrays([offsets, *part.columns], schema=READ_SCHEMA)


def retention_start(
    units: Iterable[tuple[int, int, int | None]],
    total_bytes: int,
    retention_bytes: int | None,
    retention_ms: int | None,
    now_us: int,
    floor: int | None,
) -> int | None:
    """The start offset retention allows, walking whole units oldest first; ``None``: no change.

    Args:
        units: ``(end_offset, size_bytes, max_ts)`` of each deletable unit (sealed segments,
            tiered objects), oldest first; consumed lazily, so ``max_ts`` may be computed on
            demand. A ``max_ts`` of ``None`` (empty unit) counts as expired by time.
        total_bytes: Bytes of the whole log, the units and the active segment.
        retention_bytes: A unit goes if the log stays at or above this without it.
        retention_ms: A unit goes if its newest record is older than this.
        now_us: The clock.
        floor: No unit ending past this offset goes (a group's committed offset).
    """
    new_start: int | None = None
    for end, size, max_ts in units:
        if floor is not None and end > floor:
            break
        by_bytes = retention_bytes is not None and total_bytes - size >= retention_bytes
        by_time = retention_ms is not None and (max_ts is None or now_us - max_ts > retention_ms * 1000)
        if not (by_bytes or by_time):
            break
        total_bytes -= size
        new_start = end
    return new_start


@dataclass(frozen=True)
class EngineConfig:
    """Settings an engine is opened with (a DB's persisted config plus store options)."""

    directory: Path
    shards: int
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    segment_ms: int = DEFAULT_SEGMENT_MS
    compression: int = 0
    index_interval_bytes: int = 4096
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    fsync: FsyncPolicy = "always"
    fsync_interval_ms: int = 1000
    # Segment engine: per-worker journal size before a checkpoint, and how long rows of a
    # multi-shard append may wait before they are written into their shards' segments.
    journal_bytes: int = 64 << 20
    buffer_ms: int = 1000
    clock_us: Callable[[], int] = field(default=lambda: 0)
    # Learned topic structure thresholds (``DbConfig.lts_thresholds``): appends stamp each
    # record's stream from its shard's LTS; ``None``: no streams (the column stays as given).
    lts_thresholds: tuple[int, ...] | None = None

    @property
    def fsync_policy(self) -> Fsync:
        """:attr:`fsync` as a :class:`Fsync` member, for comparisons."""
        return Fsync(self.fsync)


@dataclass(frozen=True)
class ShardStats:
    """Sizes and offsets of one shard, for ``stats`` and quotas."""

    shard: int
    start_offset: int
    end_offset: int
    segments: int
    bytes: int


_T = TypeVar("_T")


class Quota(Protocol):
    """The store's space accounting, as an append sees it."""

    def admit(self, nbytes: int) -> None:
        """Count ``nbytes`` about to be written, or raise to refuse the append."""

    def release(self, nbytes: int) -> None:
        """Give back bytes that were admitted but not written (or were freed)."""


class Engine(Protocol):
    """Storage for the shards of one database (see the module docstring)."""

    def start_offset(self, shard: int) -> int:
        """First readable offset of ``shard``."""

    def end_offset(self, shard: int) -> int:
        """Offset after the last durable record of ``shard``."""

    async def append(self, shard: int, batch: pa.RecordBatch) -> int:
        """Append a validated batch durably; return the offset of its first record."""

    async def append_many(
        self,
        parts: Sequence[tuple[int, pa.RecordBatch]],
        quota: Quota | None = None,
        *,
        leader_epoch: int = 0,
        producer: ProducerStamp | None = None,
    ) -> list[int]:
        """Append batches to distinct shards; return each one's base offset.

        ``quota.admit`` gets the bytes the append will write and may raise to reject it
        before any offset is assigned or anything is queued; the bytes of parts that fail
        are given back with ``quota.release``. Frames are stamped with ``leader_epoch`` (0 for
        a standalone store); a new epoch's first frame on a shard is recorded in its epochs.
        With ``producer`` (checked by the caller: :mod:`seglog.segment.producer_state`) each
        shard's frames hold only that part's rows and carry the producer id, epoch and the
        sequence of their first row (``producer.sequences[shard]`` for the part's first).

        Raises:
            InvalidArgument: ``leader_epoch`` is outside ``0..2**31-1``.
            BusyResourceError: A shard is being truncated (:meth:`truncate_to`).
            AppendFailed: Some parts failed; nothing of them is in the log.
        """

    async def append_routed(
        self,
        batch: pa.RecordBatch,
        routes: np.ndarray[Any, np.dtype[np.int32]],
        quota: Quota | None = None,
        *,
        leader_epoch: int = 0,
        producer: ProducerStamp | None = None,
    ) -> np.ndarray[Any, np.dtype[np.int64]]:
        """Append each row of ``batch`` to the shard ``routes`` names; return each row's offset.

        Same atomicity, epoch stamping and errors as :meth:`append_many` (per shard part).
        """

    listener: Callable[[int], None] | None
    """Called on the event loop with a shard number after an append to it completed."""

    listener_many: Callable[[np.ndarray[Any, Any]], None] | None
    """When set, an engine may call it once with the shard numbers an append completed on,
    instead of ``listener`` once per shard."""

    async def read_arrow(
        self, shard: int, offset: int, max_records: int, upper: int | None = None
    ) -> pa.Table:
        """Up to ``max_records`` records from ``offset``, none at or past ``upper`` (:data:`READ_SCHEMA`)."""

    async def read_arrow_then(
        self,
        shard: int,
        offset: int,
        max_records: int,
        then: Callable[[pa.Table], _T],
        upper: int | None = None,
    ) -> _T:
        """:meth:`read_arrow`, then ``then(table)`` on the thread that read the table (a read
        that converts its table pays one thread hand-off, not two)."""

    async def offset_for_time(self, shard: int, ts: int) -> int:
        """First offset whose record has ``ts >=`` the given one; the end offset if none."""

    async def read_key(self, shard: int, key: bytes) -> pa.Table:
        """Every record with ``key`` in offset order (:data:`READ_SCHEMA`)."""

    async def producer_headers(self, shard: int) -> list[FrameHeader]:
        """Headers of the durable frames of ``shard`` an idempotent producer wrote, oldest first."""

    def stats(self, shard: int) -> ShardStats:
        """Offsets and on-disk size of ``shard``."""

    async def truncate_before(self, shard: int, offset: int) -> int:
        """Move the start of ``shard`` up to ``offset``; return the bytes freed."""

    async def enforce_retention(
        self,
        retention_bytes: int | None,
        retention_ms: int | None,
        now_us: int,
        floors: Sequence[int | None],
    ) -> int:
        """Drop whole sealed segments past retention (below ``floors[shard]``); return bytes freed."""

    def reconfigure(self, *, segment_bytes: int, segment_ms: int) -> None:
        """Apply new rolling settings to segments created from now on."""

    # --- replica log (frames are the same bytes on every engine) ------------------------

    async def read_frames(self, shard: int, offset: int, max_bytes: int) -> bytes:
        """The stored frames from the one holding ``offset``, byte for byte: at least one
        (if any lies at or after ``offset``), else at most ``max_bytes``; acknowledged only.

        Raises:
            OffsetOutOfRange: ``offset`` is outside ``[start, end]``.
        """

    async def append_frames(self, shard: int, frames: Any, *, expected_base: int) -> int:
        """Store frames another log encoded (:meth:`read_frames`), byte for byte; return the new end.

        Verified with :func:`seglog.engines.frames.parse_frames`; each frame keeps its leader
        epoch (recorded like an append's); nothing is written when a check fails.

        Raises:
            OffsetMismatch: ``expected_base`` is not the end, or a gap or an overlap.
            CorruptFrame: A frame fails its magic, length or CRC check.
            BusyResourceError: The shard is being truncated.
        """

    async def truncate_to(self, shard: int, offset: int, *, force: bool = False) -> int:
        """Remove every record at or after ``offset``; return the new end (``offset`` or the
        base of the frame holding it). Epoch entries from the new end go; a high watermark
        above it is reset to it; appends are refused (``BusyResourceError``) while it runs.

        Raises:
            OffsetOutOfRange: ``offset`` is below the start or past the end.
            InvalidArgument: ``offset`` is below the high watermark and not ``force``.
            BusyResourceError: The shard is already being truncated.
        """

    def end_offset_for_epoch(self, shard: int, epoch: int) -> tuple[int, int]:
        """Kafka's OffsetsForLeaderEpoch: ``(largest known epoch <= epoch, its end offset)``,
        ``(-1, -1)`` when none; no entries means every frame has epoch 0."""

    def leader_epochs(self, shard: int) -> list[tuple[int, int]]:
        """The shard's leader-epoch entries, ``(epoch, start offset)`` oldest first."""

    def high_watermark(self, shard: int) -> int:
        """The shard's high watermark."""

    def update_high_watermark(self, shard: int, hw: int) -> bool:
        """Move the high watermark up to ``hw`` (never down); return whether it moved.

        Raises:
            OffsetOutOfRange: ``hw`` is past the end offset.
        """

    async def drain(self) -> None:
        """Wait for every append queued so far."""

    def disk_bytes(self) -> int:
        """Bytes the engine's data files take (from memory)."""

    async def close(self) -> None:
        """Flush and release everything; idempotent."""


# --- capabilities beyond Engine ---------------------------------------------------------
# The DB layer asks whether an engine has a capability (``isinstance`` on these
# runtime-checkable protocols, i.e. whether the engine has the methods) instead of asking
# which engine it is, so it never imports a concrete engine.


class SegmentInfo(Protocol):
    """One local segment of a shard, for tiering and retention: readable offsets ``[start, end)``."""

    @property
    def start(self) -> int: ...

    @property
    def end(self) -> int: ...

    @property
    def size(self) -> int:
        """Bytes of the segment file."""

    @property
    def sealed(self) -> bool:
        """Whether the segment is immutable (only sealed segments are tiered)."""

    @property
    def max_ts(self) -> int | None:
        """Largest record timestamp (``None``: empty, or not asked for)."""


@runtime_checkable
class SegmentedEngine(Engine, Protocol):
    """An engine that keeps each shard in segments that can be sealed: what tiering needs."""

    def segment_ranges(self, shard: int, *, with_ts: bool = False) -> Sequence[SegmentInfo]:
        """The local segments of ``shard``, oldest first (``max_ts`` only with ``with_ts``)."""

    async def seal(self, shard: int) -> bool:
        """Seal the active segment of ``shard`` if it holds data; whether it did."""

    async def restart_at(self, shard: int, offset: int) -> int:
        """Empty ``shard`` and start it over at ``offset`` (at or past its end), crash-safely;
        its epoch cache and index go, its high watermark becomes ``offset``. Returns ``offset``."""


class StreamRead(NamedTuple):
    """What one :meth:`StreamEngine.read_stream` asks for."""

    stream: int
    min_ts: int | None  # rows with a smaller ts are skipped (None: none are)
    pattern: str | None  # rows whose topic does not match this regex are skipped (None: none are)


class StreamBatch(NamedTuple):
    """The rows of one :meth:`StreamEngine.read_stream` call and where the next one goes on."""

    table: pa.Table  # READ_SCHEMA
    next_offset: int
    frames_read: int  # frames decoded (to show that stream reads skip frames)


@runtime_checkable
class StreamEngine(Engine, Protocol):
    """An engine that stamps records with their shard's learned topic structure (streams).

    Every engine is one; ``streams_enabled`` is false for a database created without
    ``lts_thresholds`` (the other methods then raise :class:`~seglog.errors.InvalidArgument`).
    """

    @property
    def streams_enabled(self) -> bool: ...

    def match_streams(self, shard: int, topic_filter: str) -> list[tuple[int, list[str | None]]]:
        """``shard``'s streams that may hold topics matching the filter, each with its
        varying filter (``None``: any token), in stream id order."""

    def stream_structure(self, shard: int, stream: int) -> tuple[tuple[str, ...], bool] | None:
        """``(learned structure, under the '$' root)`` of a stream; ``None``: no such stream."""

    def watch_stream(self, shard: int, stream: int, watch: bool) -> None:
        """Start (or stop) noting where appends stamp ``stream`` (for :meth:`stream_stamped_since`)."""

    def stream_stamped_since(self, shard: int, stream: int, offset: int) -> bool:
        """Whether a watched stream may hold a record at ``offset`` or later; ``False`` is a
        promise that it holds none (``True`` when unsure, e.g. not watched)."""

    async def read_stream(
        self, shard: int, offset: int, want: StreamRead, max_records: int, max_frames: int
    ) -> StreamBatch:
        """Up to ``max_records`` rows of ``want.stream`` at or after ``offset`` (local records),
        reading at most ``max_frames`` frames that may hold the stream; the result says where
        to go on. ``offset`` below the log start reads from the start."""


@dataclass(frozen=True)
class GenerationInfo:
    """One generation of a database with streams, as its manifest records it.

    Attributes:
        id: The generation (the first is 1).
        created_us: When it was added (µs since 1970; 0 for the first one).
        starts: Per shard, the first offset of the generation.
        dropped: Whether ``drop_slab`` dropped it.
    """

    id: int
    created_us: int
    starts: tuple[int, ...]
    dropped: bool = False


@runtime_checkable
class GenerationEngine(StreamEngine, Protocol):
    """An engine whose streams come in generations (the ``segment`` engine).

    A generation's records of a shard are the offsets from its start up to the next
    generation's start; its stream ids are its own trie's.
    """

    @property
    def generations_enabled(self) -> bool: ...

    def list_generations(self) -> list[GenerationInfo]:
        """Every generation (dropped ones too), oldest first; the last one is current."""

    def generation_streams(
        self, generation: int, shard: int, topic_filter: str
    ) -> list[tuple[int, tuple[str, ...], bool]]:
        """``(stream, structure, special)`` of a generation's streams of ``shard`` that may
        hold topics matching the filter."""

    def generation_stream_structure(
        self, generation: int, shard: int, stream: int
    ) -> tuple[tuple[str, ...], bool] | None:
        """:meth:`StreamEngine.stream_structure` in a generation (``None``: no such stream)."""

    async def add_generation(self, created_us: int) -> GenerationInfo:
        """Close the current generation and start the next one on every shard."""

    async def mark_generation_dropped(self, generation: int) -> None:
        """Record durably that a closed generation was dropped (the caller frees its records)."""


# --- reading a database another process owns ---------------------------------------------
# A follower or ``seglog stats`` must not open the engine (the owner holds the store lock,
# and opening would recover/modify files). They read through these instead, so they never
# learn an engine's file layout.


@dataclass(frozen=True)
class ShardFiles:
    """One shard as its files show it, read without opening the database.

    Attributes:
        start_offset: First local readable offset.
        end_offset: The owner's acknowledged end (the next offset to be assigned).
        segment_bytes: Sizes of the local segment files, oldest first (the last one is active).
        other_bytes: Data bytes not in segments (``lmdb``: its environment file, on shard 0).
    """

    start_offset: int
    end_offset: int
    segment_bytes: tuple[int, ...] = ()
    other_bytes: int = 0


class ReadFrame(Protocol):
    """A complete, CRC-checked stored frame: its header and its bytes (header first)."""

    @property
    def header(self) -> FrameHeader: ...

    @property
    def data(self) -> bytes: ...


class ShardCursor(Protocol):
    """A read-only position in one shard of a database another process may be appending to.

    Only frames below the owner's acknowledged (durable) end are returned: bytes past it may
    be a write the owner is about to roll back. Not thread-safe; one cursor per consumer.
    """

    @property
    def next_offset(self) -> int:
        """Base offset of the next frame :meth:`read` returns."""

    def start_offset(self) -> int:
        """The first local readable offset (re-read from the files on each call)."""

    def durable_end(self) -> int | None:
        """The owner's acknowledged end offset (``None``: the store does not record one)."""

    def seek(self, offset: int) -> None:
        """Position at the frame holding ``offset`` (or at the log end).

        Raises:
            OffsetOutOfRange: ``offset`` is below the local start or past the end.
        """

    def seek_time(self, ts_us: int) -> int:
        """Position at the first frame whose records may have ``ts >= ts_us``; return its base.

        The caller filters the rows of that frame.
        """

    def read(self, max_bytes: int) -> Sequence[ReadFrame]:
        """The acknowledged frames from the position, up to about ``max_bytes``.

        Empty when nothing new is readable yet: the log grows by calling again later (a
        follower polls; nothing here blocks).

        Raises:
            CorruptFrame: A frame the owner can no longer be writing is bad.
            OffsetOutOfRange: The next data was removed (retention) before it was read.
        """

    def close(self) -> None:
        """Release open files; idempotent."""


class EngineReader(Protocol):
    """Cross-process, read-only access to one database directory: takes no lock, writes nothing."""

    def open_shard(self, shard: int) -> ShardCursor:
        """A cursor on ``shard``, not yet positioned (call :meth:`ShardCursor.seek` first)."""

    def close(self) -> None:
        """Release everything the reader holds (cursors close on their own); idempotent."""
