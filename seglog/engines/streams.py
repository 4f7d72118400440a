"""What every engine shares for streams: stamping, LTS snapshots on disk, recovery, row filters.

The stamping itself (the tries, their origins and the topic cache) is
:class:`seglog.topics.streams.StreamStamper`; this module holds the storage side:

* :class:`SnapshotFiles` keeps one durable snapshot file per shard under ``<db>/lts/``
  (replaced atomically, fsynced). A snapshot covers the records below an offset no rollback
  goes below (see the stamper); the engines write one every :data:`SNAPSHOT_EVERY_RECORDS`
  records, before retention deletes records it does not cover yet, after a truncation, and
  at close.
* :func:`recover_shard` restores a shard's trie at open: the snapshot, then the topics of
  the log from there on, learned again in offset order (the log is the source of truth).
* :func:`stream_rows` picks a frame's rows of one stream (and start time, and topic regex).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from seglog._fs import atomic_write, makedirs_durable
from seglog.engines.base import READ_SCHEMA, StreamBatch, StreamRead
from seglog.errors import CorruptLTS, InvalidArgument
from seglog.record import FRAME_SCHEMA, EncodedFrame
from seglog.topics.lts import LTS
from seglog.topics.streams import StreamStamper

__all__ = [
    "CLOSE_SNAPSHOT_RECORDS",
    "LTS_DIR",
    "SNAPSHOT_EVERY_RECORDS",
    "STREAM_FIELD",
    "SnapshotFiles",
    "StreamCollector",
    "StreamLookups",
    "learn_frames",
    "picked_rows",
    "recover_shard",
    "snapshot_interval",
    "stamp_batch",
    "stream_rows",
]

log = logging.getLogger("seglog.engines.streams")

LTS_DIR: Final = "lts"
# Bounds what an open replays after a crash: a shard's snapshot is renewed once it is this
# many records behind the durable end (a small file and one fsync per that many records).
SNAPSHOT_EVERY_RECORDS: Final = 1 << 20
# At close a snapshot is written for shards at least this far behind (fewer records are
# replayed at the next open quickly; 10,000 idle shards cost no file writes).
CLOSE_SNAPSHOT_RECORDS: Final = 4096
STREAM_FIELD: Final = READ_SCHEMA.field("stream")
_STREAM_COLUMN: Final = FRAME_SCHEMA.get_field_index("stream")


def snapshot_interval() -> int:
    """:data:`SNAPSHOT_EVERY_RECORDS`, read when called (tests lower it)."""
    return SNAPSHOT_EVERY_RECORDS


def stamp_batch(batch: pa.RecordBatch, stamps: np.ndarray[Any, np.dtype[np.uint32]]) -> pa.RecordBatch:
    """``batch`` (:data:`~seglog.record.FRAME_SCHEMA`) with its ``stream`` column replaced."""
    return batch.set_column(_STREAM_COLUMN, STREAM_FIELD, pa.array(stamps, pa.uint32()))


class SnapshotFiles:
    """The LTS snapshot file of every shard of one database (``<db>/lts/shard-NNNN.lts``)."""

    def __init__(self, db_directory: Path, subdir: str | None = None) -> None:
        self.directory = db_directory / LTS_DIR
        if subdir is not None:  # a generation after the first (see seglog.engines.generations)
            self.directory = self.directory / subdir

    def path(self, shard: int) -> Path:
        return self.directory / f"shard-{shard:04d}.lts"

    def load(self, shard: int) -> bytes | None:
        """The shard's snapshot, or ``None`` when it has none."""
        try:
            return self.path(shard).read_bytes()
        except FileNotFoundError:
            return None

    def save(self, shard: int, data: bytes) -> None:
        """Replace the shard's snapshot durably (raises ``OSError``)."""
        if not self.directory.is_dir():
            makedirs_durable(self.directory)
        atomic_write(self.path(shard), data)


def recover_shard(
    stamper: StreamStamper,
    files: SnapshotFiles,
    shard: int,
    log_start: int,
    log_end: int,
    batches_from: Callable[[int], Iterable[tuple[int, pa.RecordBatch]]],
    generation_base: tuple[LTS, int] | None = None,
) -> int:
    """Rebuild ``shard``'s trie at open: its snapshot, then the log's topics from there on.

    Args:
        stamper: The database's stamper.
        files: Where the snapshots are.
        shard: The shard.
        log_start: Its first readable offset.
        log_end: Its end offset.
        batches_from: ``(base offset, frame batch)`` of every frame holding an offset at
            or after the given one, in offset order.
        generation_base: For a generation after the first, its inherited trie and its start offset in
            this shard: used (and the log learned again from the start) when the snapshot
            is missing or covers no more than the start (it may be the old generation's).

    Returns:
        The offset the snapshot covered up to (what the log was replayed from).

    A stamped stream that disagrees with the trie (frames another log stamped, see
    ``append_frames``) is logged, not fatal: those records keep their stamps.
    """
    data = files.load(shard)
    upto = 0
    if data is not None:
        try:
            upto = stamper.restore(shard, data, log_end)
        except CorruptLTS as exc:
            log.error("shard %d: LTS snapshot %s unusable (%s)", shard, files.path(shard), exc)
            data = None
    if generation_base is not None and (data is None or upto <= generation_base[1]):
        stamper.set_base(shard, generation_base[0])
        upto = generation_base[1]
        data = b""
    if data is None:
        stamper.reset(shard)
        upto = 0
    if upto < log_start:
        # Retention writes a snapshot before it deletes records, so only a lost or damaged
        # snapshot gets here: learning restarts at the start, and older stamps may disagree.
        log.error(
            "shard %d: the LTS snapshot covers offsets below %d only and the log starts at %d; "
            "learning topics again from there (streams of older records may be misnumbered)",
            shard,
            upto,
            log_start,
        )
        if generation_base is not None:
            stamper.set_base(shard, generation_base[0])
        else:
            stamper.reset(shard)
        upto = log_start
    mismatched = 0
    replayed = 0
    for base, batch in batches_from(upto):
        first = max(upto, base) - base
        if first >= batch.num_rows:
            continue
        part = batch.slice(first)
        learned = stamper.stamp(part.column("topic"), shard, base + first)
        stamped = part.column("stream").to_numpy()
        mismatched += int(np.count_nonzero(learned != stamped))
        replayed += part.num_rows
    if replayed:
        log.info("shard %d: learned the topics of %d records again (LTS recovery)", shard, replayed)
    if mismatched:
        log.warning(
            "shard %d: %d records carry stream ids this log's LTS does not give them (frames "
            "stamped elsewhere); reads through streams may miss them",
            shard,
            mismatched,
        )
    return upto


def stream_rows(batch: pa.RecordBatch | pa.Table, lo: int, hi: int, want: StreamRead) -> np.ndarray[Any, Any]:
    """Row numbers in ``[lo, hi)`` of a frame batch (or a table with its ``stream``, ``ts`` and
    ``topic`` columns: a tier read's) that belong to ``want.stream`` and match."""
    streams = batch.column("stream").to_numpy()
    mask = streams[lo:hi] == want.stream
    if want.min_ts is not None:
        mask &= batch.column("ts").to_numpy()[lo:hi] >= want.min_ts
    rows = np.flatnonzero(mask) + lo
    if want.pattern is not None and len(rows):
        topics = batch.column("topic").take(pa.array(rows))
        ok = pc.match_substring_regex(topics, want.pattern).to_numpy(zero_copy_only=False)
        rows = rows[ok]
    return rows


def picked_rows(batch: pa.RecordBatch, base: int, rows: np.ndarray[Any, Any]) -> pa.RecordBatch:
    """Rows of a frame batch (its first row at offset ``base``) with :data:`READ_SCHEMA`."""
    part = batch.take(pa.array(rows))
    offsets = pa.array(rows.astype(np.int64) + base)
    return pa.RecordBatch.from_arrays([offsets, *part.columns], schema=READ_SCHEMA)


def learn_frames(
    stamper: StreamStamper, shard: int, frames: Sequence[EncodedFrame], batches: Sequence[pa.RecordBatch]
) -> None:
    """Learn the topics of frames another log stamped (``append_frames``), in offset order.

    A replica learns what its leader learned, so the ids agree; frames stamped by a log with
    other thresholds (or none) keep their stamps, which is logged once per call.
    """
    mismatched = 0
    for frame, batch in zip(frames, batches, strict=True):
        learned = stamper.stamp(batch.column("topic"), shard, frame.header.base_offset)
        mismatched += int(np.count_nonzero(learned != batch.column("stream").to_numpy()))
    if mismatched:
        log.warning(
            "shard %d: %d appended records carry stream ids this log's LTS does not give them; "
            "reads through streams may miss them",
            shard,
            mismatched,
        )


class StreamCollector:
    """Gathers one ``read_stream`` call's rows frame by frame, up to ``max_records``."""

    def __init__(self, want: StreamRead, max_records: int, max_frames: int) -> None:
        self.want = want
        self.max_records = max_records
        self.max_frames = max_frames
        self.batches: list[pa.RecordBatch] = []
        self.got = 0
        self.frames = 0
        self.stop_at: int | None = None  # set when full: the offset after the last row taken

    @property
    def done(self) -> bool:
        """Whether no more frames should be read (full, or the frame budget is spent)."""
        return self.stop_at is not None or self.frames >= self.max_frames

    def add(self, batch: pa.RecordBatch, base: int, lo: int, hi: int) -> None:
        """Take the wanted rows ``[lo, hi)`` of a frame batch whose first row is at ``base``."""
        self.frames += 1
        rows = stream_rows(batch, lo, hi, self.want)
        if not len(rows):
            return
        room = self.max_records - self.got
        if len(rows) >= room:
            rows = rows[:room]
            self.stop_at = base + int(rows[-1]) + 1
        self.batches.append(picked_rows(batch, base, rows))
        self.got += len(rows)

    def result(self, scanned_to: int) -> StreamBatch:
        """The batch, continuing at ``stop_at`` when full, else after what was scanned."""
        table = pa.Table.from_batches(self.batches, schema=READ_SCHEMA)
        return StreamBatch(table, self.stop_at if self.stop_at is not None else scanned_to, self.frames)


class StreamLookups:
    """The stream questions every engine answers alike, from its :class:`StreamStamper`.

    An engine sets ``_streams`` and implements ``_check_shard_number`` (its own check
    that ``shard`` exists, raising as its other methods do).
    """

    _streams: StreamStamper | None

    def _check_shard_number(self, shard: int) -> None:
        raise NotImplementedError

    @property
    def streams_enabled(self) -> bool:
        """Whether appends stamp streams (the database has LTS thresholds)."""
        return self._streams is not None

    def _stamper(self) -> StreamStamper:
        if self._streams is None:
            raise InvalidArgument("this database has no streams (created with lts_thresholds=None)")
        return self._streams

    def match_streams(self, shard: int, topic_filter: str) -> list[tuple[int, list[str | None]]]:
        self._check_shard_number(shard)
        return self._stamper().match(shard, topic_filter)

    def stream_structure(self, shard: int, stream: int) -> tuple[tuple[str, ...], bool] | None:
        self._check_shard_number(shard)
        return self._stamper().structure(shard, stream)

    def watch_stream(self, shard: int, stream: int, watch: bool) -> None:
        self._check_shard_number(shard)
        if watch:
            self._stamper().watch(shard, stream)
        else:
            self._stamper().unwatch(shard, stream)

    def stream_stamped_since(self, shard: int, stream: int, offset: int) -> bool:
        self._check_shard_number(shard)
        return self._stamper().stamped_since(shard, stream, offset)
