"""Opening a shard directory after a crash: validate, cut and checkpoint (Kafka's LogLoader).

Recovery lives apart from :class:`~seglog.segment.shard_log.ShardLog`, which owns appending,
rolling and truncation of an open log: this module decides what of the files on disk is the
log. Sealed segments below the checkpoint are trusted; everything from it on is validated
frame by frame (magic, version, lengths, offset continuity, CRC); the first bad frame and
everything after it is cut; a fenced durable-end marker (a failed rollback, or a truncation
that was interrupted) cuts the log back to it.
"""

from __future__ import annotations

import enum
import itertools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from seglog._fs import fsync_dir
from seglog.errors import CorruptFrame, StorageError
from seglog.record import parse_header, verify_frame
from seglog.segment.durable_end import DurableEndMarker, take_fence
from seglog.segment.log_segment import SEGMENT_SUFFIX, LogSegment
from seglog.segment.shard_log import ShardLog, read_checkpoint

__all__ = ["RecoveryCause", "RecoveryReport", "open_shard_log"]

log = logging.getLogger("seglog.segment")


class RecoveryCause(enum.Enum):
    """Why recovery cut a shard's log (``RecoveryReport.reason`` says where and what)."""

    OFFSET_GAP = "a segment file does not continue the offsets of the one before"
    BAD_FRAME = "a frame failed its magic, length, offset or CRC check"
    FENCED = "a fenced durable end: a failed write that could not be undone, or an interrupted truncation"


@dataclass
class RecoveryReport:
    """What opening a shard found and cut."""

    scanned_frames: int = 0
    truncated_segment: str | None = None
    truncated_at: int | None = None
    bytes_cut: int = 0
    deleted_segments: list[str] = field(default_factory=list)
    cause: RecoveryCause | None = None
    reason: str | None = None  # the details, for the log

    @property
    def cut(self) -> bool:
        """True when recovery removed anything."""
        return self.truncated_segment is not None or bool(self.deleted_segments)


def open_shard_log(
    directory: Path,
    *,
    segment_bytes: int,
    segment_ms: int,
    clock_ms: Callable[[], int],
) -> tuple[ShardLog, RecoveryReport]:
    """Open (creating if needed) a shard directory, validating frames past the checkpoint.

    The first frame that fails its magic, length, offset-continuity or CRC check is cut
    off with everything after it, including later segment files; this is logged.
    """
    if not directory.is_dir():
        directory.mkdir(parents=True)
        fsync_dir(directory.parent)
    report = RecoveryReport()
    checkpoint = read_checkpoint(directory)
    paths = sorted(p for p in directory.iterdir() if p.name.endswith(SEGMENT_SUFFIX))
    stale_tmp = list(directory.glob("*.tmp"))
    for stale in stale_tmp:
        stale.unlink()
    if stale_tmp:
        fsync_dir(directory)
    log_start = int(checkpoint.get("log_start_offset", 0))
    marker = DurableEndMarker(directory)
    if not paths:
        seg = LogSegment.create(directory, log_start)
        shard = ShardLog(
            directory,
            [seg],
            log_start_offset=log_start,
            segment_bytes=segment_bytes,
            segment_ms=segment_ms,
            clock_ms=clock_ms,
            marker=marker,
        )
        shard.publish_durable_end()
        return shard, report
    # Sealed segments below the checkpoint were fsynced before it was written: trusted.
    # Everything from it on, the active segment always included, is validated frame by frame.
    recovery_base = int(checkpoint.get("recovery_base", -1))
    segments: list[LogSegment] = []
    for i, path in enumerate(paths):
        last = i == len(paths) - 1
        segments.append(LogSegment.open(path, sealed=not last))
    for before, after in itertools.pairwise(segments):
        before.next_offset = after.base_offset
    expected = segments[0].base_offset
    for index, seg in enumerate(segments):
        if seg.base_offset != expected:
            # A gap in the offset sequence: this file cannot follow the one before.
            prev = segments[index - 1]
            reason = f"segment {seg.path.name} does not continue offset {expected}"
            _cut(report, segments, index - 1, prev, prev.size, RecoveryCause.OFFSET_GAP, reason)
            break
        if seg.base_offset < recovery_base and index + 1 < len(segments):
            expected = segments[index + 1].base_offset
            continue  # fully before the checkpoint: trusted
        pos, next_offset, error = _scan(seg, 0, seg.base_offset, report)
        seg.next_offset = next_offset
        expected = next_offset
        if error is not None:
            _cut(report, segments, index, seg, pos, RecoveryCause.BAD_FRAME, error)
            break
    segments = [s for s in segments if s.path.name not in report.deleted_segments]
    expected = _cut_to_durable_end(directory, report, segments, expected)
    segments = [s for s in segments if s.path.name not in report.deleted_segments]
    if segments[-1].sealed:
        segments[-1].close()
        segments[-1] = LogSegment.open(segments[-1].path, sealed=False)
    segments[-1].next_offset = expected
    log_start = max(log_start, segments[0].base_offset)
    dropped = False
    while len(segments) > 1 and segments[0].next_offset <= log_start:
        segments.pop(0).delete()  # retention checkpointed the start, then crashed
        dropped = True
    if dropped:
        fsync_dir(directory)
    shard = ShardLog(
        directory,
        segments,
        log_start_offset=log_start,
        segment_bytes=segment_bytes,
        segment_ms=segment_ms,
        clock_ms=clock_ms,
        marker=marker,
    )
    if report.cut:
        log.warning(
            "%s: recovery cut %d bytes at %s position %s and deleted %d later segment(s): %s",
            directory,
            report.bytes_cut,
            report.truncated_segment,
            report.truncated_at,
            len(report.deleted_segments),
            report.reason,
        )
        shard.write_checkpoint()
    shard.publish_durable_end()
    return shard, report


def _cut_to_durable_end(directory: Path, report: RecoveryReport, segments: list[LogSegment], end: int) -> int:
    """Cut valid frames past a fenced durable-end marker (reported failed); return the new end."""
    marker = take_fence(directory)
    if marker is None:
        return end
    if marker.next_offset > end:
        log.error(
            "%s: the log ends at %d but offsets up to %d were acknowledged; they were lost",
            directory,
            end,
            marker.next_offset,
        )
        return end
    if marker.next_offset == end:
        return end
    for index, seg in enumerate(segments):
        if seg.base_offset != marker.segment_base or marker.segment_bytes > seg.size:
            continue
        # The marker must sit on a frame boundary at its offset, or it is not this log's.
        boundary = seg.base_offset
        try:
            for _pos, header in seg.headers(0, marker.segment_bytes):
                boundary = header.next_offset
        except CorruptFrame:
            break
        if boundary != marker.next_offset:
            break
        _cut(
            report,
            segments,
            index,
            segments[index],
            marker.segment_bytes,
            RecoveryCause.FENCED,
            f"offsets {marker.next_offset}..{end} were written but never acknowledged",
        )
        segments[index].next_offset = marker.next_offset
        return marker.next_offset
    log.warning(
        "%s: durable-end marker (%d) does not match the segments; ignored", directory, marker.next_offset
    )
    return end


def _cut(
    report: RecoveryReport,
    segments: list[LogSegment],
    index: int,
    seg: LogSegment,
    pos: int,
    cause: RecoveryCause,
    reason: str,
) -> None:
    report.cause = cause
    report.reason = reason
    if pos < seg.size:
        report.truncated_segment = seg.path.name
        report.truncated_at = pos
        report.bytes_cut += seg.size - pos
        if seg.sealed:
            os.chmod(seg.path, 0o644)
            seg.close()
            reopened = LogSegment.open(seg.path, sealed=False)
            segments[index] = seg = reopened
        seg.truncate(pos)
    for later in segments[index + 1 :]:
        report.bytes_cut += later.size
        report.deleted_segments.append(later.path.name)
        later.delete()
    if report.deleted_segments:
        fsync_dir(seg.path.parent)


def _scan(
    seg: LogSegment, start: int, next_offset: int, report: RecoveryReport
) -> tuple[int, int, str | None]:
    """Validate frames of ``seg`` from ``start``; return (valid end, next offset, error)."""
    if seg.size == start:
        return start, next_offset, None
    try:
        buf = seg.view(0, seg.size)
    except (OSError, ValueError) as exc:
        raise StorageError(f"cannot map {seg.path}") from exc
    pos = start

    while pos < seg.size:
        try:
            header = parse_header(buf, pos)
            verify_frame(buf, pos, header)
        except CorruptFrame as exc:
            return pos, next_offset, str(exc)
        if header.base_offset != next_offset:
            return (
                pos,
                next_offset,
                (f"frame at position {pos} has base offset {header.base_offset}, expected {next_offset}"),
            )
        if pos + header.size > seg.size:
            return pos, next_offset, f"frame padding at position {pos} is truncated"
        if seg.max_ts is None or header.max_ts > seg.max_ts:
            seg.max_ts = header.max_ts
        next_offset = header.next_offset
        pos += header.size
        report.scanned_frames += 1
    return pos, next_offset, None
