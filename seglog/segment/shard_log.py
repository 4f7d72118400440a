"""The segments of one shard: append with rolling, recovery after a crash, checkpoints."""

from __future__ import annotations

import bisect
import itertools
import json
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, NamedTuple

from seglog._fs import atomic_write, fsync_dir
from seglog.errors import CorruptFrame, OffsetOutOfRange, StorageError
from seglog.record import EncodedFrame, FrameHeader, parse_header, verify_frame
from seglog.segment.durable_end import DurableEndMarker, fence_in_process, take_fence
from seglog.segment.log_segment import SEGMENT_SUFFIX, LogSegment

__all__ = ["CHECKPOINT_FILE", "AppendMark", "FramePosition", "RecoveryReport", "ShardLog", "read_checkpoint"]

log = logging.getLogger("seglog.segment")

CHECKPOINT_FILE: Final = "checkpoint.json"
_CHECKPOINT_VERSION: Final = 1


class AppendMark(NamedTuple):
    """The log end before an append, to roll back to if the append fails (see :meth:`ShardLog.mark`)."""

    snap: tuple[list[LogSegment], list[int]]
    size: int
    next_offset: int
    max_ts: int | None


class FramePosition(NamedTuple):
    """Where a frame lives: its segment, file position and header."""

    segment: LogSegment
    pos: int
    header: FrameHeader


@dataclass
class RecoveryReport:
    """What opening a shard found and cut."""

    scanned_frames: int = 0
    truncated_segment: str | None = None
    truncated_at: int | None = None
    bytes_cut: int = 0
    deleted_segments: list[str] = field(default_factory=list)
    reason: str | None = None

    @property
    def cut(self) -> bool:
        """True when recovery removed anything."""
        return self.truncated_segment is not None or bool(self.deleted_segments)


class ShardLog:
    """The ordered segments of one shard directory.

    Not thread-safe for writers: exactly one I/O worker appends. Readers in other threads use
    :meth:`segments_snapshot` and segment views, which stay valid while segments roll.
    """

    def __init__(
        self,
        directory: Path,
        segments: list[LogSegment],
        *,
        log_start_offset: int,
        segment_bytes: int,
        segment_ms: int,
        clock_ms: Callable[[], int],
        marker: DurableEndMarker,
    ) -> None:
        self.directory = directory
        self.marker = marker
        # One attribute, swapped whole, so readers never see segments and bases disagree.
        self._snap: tuple[list[LogSegment], list[int]] = (segments, [s.base_offset for s in segments])
        self.log_start_offset = log_start_offset
        self.segment_bytes = segment_bytes
        self.segment_ms = segment_ms
        self._clock_ms = clock_ms
        now = clock_ms()
        for s in segments:
            s.created_ms = now

    # --- opening and recovery ----------------------------------------------------------

    @classmethod
    def open(
        cls,
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
            shard = cls(
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
                cls._cut(report, segments, index - 1, prev, prev.size, reason)
                break
            if seg.base_offset < recovery_base and index + 1 < len(segments):
                expected = segments[index + 1].base_offset
                continue  # fully before the checkpoint: trusted
            pos, next_offset, error = _scan(seg, 0, seg.base_offset, report)
            seg.next_offset = next_offset
            expected = next_offset
            if error is not None:
                cls._cut(report, segments, index, seg, pos, error)
                break
        segments = [s for s in segments if s.path.name not in report.deleted_segments]
        expected = cls._cut_to_durable_end(directory, report, segments, expected)
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
        shard = cls(
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

    @classmethod
    def _cut_to_durable_end(
        cls, directory: Path, report: RecoveryReport, segments: list[LogSegment], end: int
    ) -> int:
        """Cut valid frames past a fenced durable-end marker (reported failed); return the new end."""
        marker = take_fence(directory)
        if marker is None:
            return end
        if marker.next_offset > end:
            log.error(
                "%s: the log ends at %d but offsets up to %d were acknowledged; they were lost",
                directory, end, marker.next_offset,
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
            cls._cut(report, segments, index, segments[index], marker.segment_bytes,
                     f"offsets {marker.next_offset}..{end} were written but never acknowledged")
            segments[index].next_offset = marker.next_offset
            return marker.next_offset
        log.warning("%s: durable-end marker (%d) does not match the segments; ignored", directory, marker.next_offset)
        return end

    @staticmethod
    def _cut(
        report: RecoveryReport,
        segments: list[LogSegment],
        index: int,
        seg: LogSegment,
        pos: int,
        reason: str,
    ) -> None:
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

    # --- state -------------------------------------------------------------------------

    @property
    def _segments(self) -> list[LogSegment]:
        return self._snap[0]

    @property
    def active(self) -> LogSegment:
        """The segment being appended."""
        return self._segments[-1]

    @property
    def next_offset(self) -> int:
        """The offset the next appended record gets (the log end)."""
        return self._segments[-1].next_offset

    def last_header(self) -> FrameHeader | None:
        """The header of the last frame of the log (``None`` when it holds none)."""
        for seg in reversed(self._segments):
            last = None
            for _pos, header in seg.headers(0, seg.size):
                last = header
            if last is not None:
                return last
        return None

    def segments_snapshot(self) -> list[LogSegment]:
        """The current segments, oldest first (a copy; safe to iterate while rolling)."""
        return list(self._segments)

    def segment_for(self, offset: int) -> LogSegment:
        """The segment holding ``offset``.

        Raises:
            OffsetOutOfRange: ``offset`` is below the first segment or at/after the end.
        """
        segments, bases = self._snap
        i = bisect.bisect_right(bases, offset) - 1
        if i < 0 or offset >= segments[-1].next_offset:
            raise OffsetOutOfRange(offset, self.log_start_offset, self.next_offset)
        return segments[i]

    def size_bytes(self) -> int:
        """Bytes of all segment files."""
        return sum(s.size for s in self._segments)

    # --- writing (one I/O worker only) -------------------------------------------------

    def append(self, frames: list[EncodedFrame]) -> list[FramePosition]:
        """Write frames in order, rolling segments as needed; one ``pwritev`` per segment run.

        Raises:
            OSError: A write failed. Frames of this call may remain (also in segments it
                rolled to): the caller undoes the call with :meth:`rollback`.
        """
        positions: list[FramePosition] = []
        run: list[EncodedFrame] = []
        run_bytes = 0
        seg = self.active
        for frame in frames:
            projected = seg.size + run_bytes
            if projected > 0 and (
                projected + frame.size > self.segment_bytes
                or self._clock_ms() - seg.created_ms >= self.segment_ms
            ):
                positions.extend(self._write_run(seg, run))
                run, run_bytes = [], 0
                seg = self.roll()
            run.append(frame)
            run_bytes += frame.size
        positions.extend(self._write_run(seg, run))
        return positions

    def _write_run(self, seg: LogSegment, run: list[EncodedFrame]) -> list[FramePosition]:
        if not run:
            return []
        buffers: list[object] = []
        for frame in run:
            buffers.extend(frame.buffers)
        pos = seg.append(buffers)
        out = []
        for frame in run:
            out.append(FramePosition(seg, pos, frame.header))
            pos += frame.size
            header = frame.header
            if seg.max_ts is None or header.max_ts > seg.max_ts:
                seg.max_ts = header.max_ts
        seg.next_offset = run[-1].header.next_offset
        return out

    def roll(self) -> LogSegment:
        """Seal the active segment and start a new one at the log end."""
        old = self.active
        old.seal()
        new = LogSegment.create(self.directory, old.next_offset)
        new.created_ms = self._clock_ms()
        segments, bases = self._snap
        self._snap = ([*segments, new], [*bases, new.base_offset])
        self.write_checkpoint()
        return new

    def sync(self) -> None:
        """fdatasync the active segment."""
        self.active.sync()

    def mark(self) -> AppendMark:
        """The current end, for :meth:`rollback`."""
        active = self.active
        return AppendMark(self._snap, active.size, active.next_offset, active.max_ts)

    def rollback(self, mark: AppendMark) -> None:
        """Undo every append and roll since ``mark``, durably (the failed batch leaves no trace).

        Segments created since are deleted, the segment active at ``mark`` is unsealed and cut
        back to its size then, and the directory and file are fsynced.

        Raises:
            OSError: The undo failed; the caller must stop writing and fence the marker.
        """
        segments, _bases = mark.snap
        keep = segments[-1]
        created = self._segments[len(segments) :]
        # Readers must not find a segment about to be deleted.
        self._snap = mark.snap
        for seg in created:
            seg.delete()
        if created:
            fsync_dir(self.directory)
        if keep.sealed:
            keep.unseal()
        if keep.size != mark.size or created:
            keep.truncate(mark.size)
        keep.next_offset = mark.next_offset
        keep.max_ts = mark.max_ts

    def fence(self, mark: AppendMark) -> None:
        """After a failed :meth:`rollback`: make the next open cut the log back to ``mark``.

        Remembered in this process first, then written and fsynced as a fenced marker.

        Raises:
            OSError: The fenced marker could not be written (a reopen in this process still cuts).
        """
        base = mark.snap[0][-1].base_offset
        fence_in_process(self.directory, mark.next_offset, base, mark.size)
        self.marker.publish(mark.next_offset, base, mark.size, fenced=True)

    def publish_durable_end(self, *, fenced: bool = False, sync: bool = False) -> None:
        """Publish the current end as acknowledged (see :mod:`seglog.segment.durable_end`)."""
        active = self.active
        self.marker.publish(active.next_offset, active.base_offset, active.size, fenced=fenced, sync=sync)

    def truncate_point(self, offset: int) -> tuple[int, int, int]:
        """Where :meth:`truncate_to` ``offset`` cuts: ``(segment index, file position, new end)``.

        The cut is at the start of the frame holding ``offset``: frames are shipped and
        checksummed whole, so the new end is ``offset`` or the base of that frame (as Kafka
        truncates to a batch boundary).

        Raises:
            OffsetOutOfRange: ``offset`` is below the log start or past the end.
        """
        segments, bases = self._snap
        end = segments[-1].next_offset
        if not self.log_start_offset <= offset <= end:
            raise OffsetOutOfRange(offset, self.log_start_offset, end)
        if offset == end:
            return len(segments) - 1, segments[-1].size, end
        i = bisect.bisect_right(bases, offset) - 1
        seg = segments[i]
        for pos, header in seg.headers(0, seg.size):
            if header.next_offset > offset:
                return i, pos, header.base_offset
        return i, seg.size, seg.next_offset

    def truncate_to(self, offset: int) -> int:
        """Remove every frame holding an offset at or after ``offset``, durably and crash-safely.

        Steps: a fenced durable-end marker at the cut is fsynced first, so a crash at any
        later step makes the next open finish the cut (:meth:`open`); then later segments are
        deleted (newest first), the segment holding the cut becomes the active one and is cut
        and synced, the checkpoint is rewritten, and the marker is cleared (fsynced).
        The caller must have synced the journal's entries for this shard into the segments
        (a replay must not bring truncated frames back).

        Returns:
            The new log end (``offset``, or the base of the frame holding it).

        Raises:
            OffsetOutOfRange: ``offset`` is below the log start or past the end.
            OSError: A step failed; the fence makes the next open complete the cut.
        """
        i, pos, new_end = self.truncate_point(offset)
        segments, bases = self._snap
        if new_end == segments[-1].next_offset and i == len(segments) - 1:
            return new_end
        seg = segments[i]
        self.marker.publish(new_end, seg.base_offset, pos, fenced=True)
        later = segments[i + 1 :]
        self._snap = (segments[: i + 1], bases[: i + 1])
        for doomed in reversed(later):
            doomed.retire()  # readers holding it keep reading through its mapping
        if later:
            fsync_dir(self.directory)
        if pos < seg.size:
            seg = seg.replace_with_prefix(pos)
            self._snap = ([*segments[:i], seg], bases[: i + 1])
        elif seg.sealed:
            seg.unseal()
        seg.next_offset = new_end
        seg.max_ts = None  # recomputed from the remaining headers when asked
        seg.created_ms = self._clock_ms()
        if new_end < self.log_start_offset:  # the start was inside the frame that went
            self.log_start_offset = new_end
        self.write_checkpoint()
        self.publish_durable_end(sync=True)
        return new_end

    def write_checkpoint(self) -> None:
        """Record durably the log start and that every segment before the active one is sealed."""
        active = self.active
        active.sync()
        data = {
            "version": _CHECKPOINT_VERSION,
            "log_start_offset": self.log_start_offset,
            "recovery_base": active.base_offset,
        }
        atomic_write(self.directory / CHECKPOINT_FILE, json.dumps(data).encode())

    def drop_before(self, start: int) -> list[LogSegment]:
        """Move the log start up to ``start`` and delete sealed segments wholly below it.

        The new start is checkpointed before any file is removed. Readers holding a removed
        segment keep reading it through its mapping. Run on the shard's writer thread.

        Returns:
            The removed segments.
        """
        start = min(start, self.next_offset)
        if start > self.log_start_offset:
            self.log_start_offset = start
            self.write_checkpoint()
        segments, bases = self._snap
        k = 0
        while k < len(segments) - 1 and segments[k].next_offset <= self.log_start_offset:
            k += 1
        if not k:
            return []
        doomed = segments[:k]
        self._snap = (segments[k:], bases[k:])
        for seg in doomed:
            seg.retire()
        fsync_dir(self.directory)
        return doomed

    def close(self) -> None:
        """Sync, checkpoint and close every segment."""
        try:
            self.write_checkpoint()
        finally:
            for seg in self._segments:
                seg.close()
            self.marker.close()

    # --- reading -----------------------------------------------------------------------

    def frames_from(self, seg: LogSegment, pos: int, end_offset: int) -> Iterator[FramePosition]:
        """Yield frames from ``seg`` at ``pos`` onwards, across later segments, below ``end_offset``."""
        segments, bases = self._snap
        i = bisect.bisect_left(bases, seg.base_offset)
        while i < len(segments):
            current = segments[i]
            limit = current.size
            for p, header in current.headers(pos, limit):
                if header.base_offset >= end_offset:
                    return
                yield FramePosition(current, p, header)
            i += 1
            pos = 0


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
            return pos, next_offset, (
                f"frame at position {pos} has base offset {header.base_offset}, expected {next_offset}"
            )
        if pos + header.size > seg.size:
            return pos, next_offset, f"frame padding at position {pos} is truncated"
        if seg.max_ts is None or header.max_ts > seg.max_ts:
            seg.max_ts = header.max_ts
        next_offset = header.next_offset
        pos += header.size
        report.scanned_frames += 1
    return pos, next_offset, None


def read_checkpoint(directory: Path) -> dict[str, int]:
    """The shard's checkpoint (``log_start_offset``, ``recovery_base``); ``{}`` when absent or unreadable."""
    path = directory / CHECKPOINT_FILE
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("%s: unreadable checkpoint (%s); scanning every segment", directory, exc)
        return {}
    if not isinstance(data, dict) or data.get("version") != _CHECKPOINT_VERSION:
        log.warning("%s: checkpoint of unknown version; scanning every segment", directory)
        return {}
    return {k: int(v) for k, v in data.items()}
