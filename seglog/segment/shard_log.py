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
from seglog.segment.log_segment import SEGMENT_SUFFIX, LogSegment

__all__ = ["CHECKPOINT_FILE", "FramePosition", "RecoveryReport", "ShardLog", "read_checkpoint"]

log = logging.getLogger("seglog.segment")

CHECKPOINT_FILE: Final = "checkpoint.json"
_CHECKPOINT_VERSION: Final = 1


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
    ) -> None:
        self.directory = directory
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
        directory.mkdir(parents=True, exist_ok=True)
        report = RecoveryReport()
        checkpoint = read_checkpoint(directory)
        paths = sorted(p for p in directory.iterdir() if p.name.endswith(SEGMENT_SUFFIX))
        for stale in directory.glob("*.tmp"):
            stale.unlink()
        log_start = int(checkpoint.get("log_start_offset", 0))
        if not paths:
            seg = LogSegment.create(directory, log_start)
            return cls(
                directory,
                [seg],
                log_start_offset=log_start,
                segment_bytes=segment_bytes,
                segment_ms=segment_ms,
                clock_ms=clock_ms,
            ), report
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
        if segments[-1].sealed:
            segments[-1].close()
            segments[-1] = LogSegment.open(segments[-1].path, sealed=False)
        segments[-1].next_offset = expected
        log_start = max(log_start, segments[0].base_offset)
        while len(segments) > 1 and segments[0].next_offset <= log_start:
            segments.pop(0).delete()  # retention checkpointed the start, then crashed
        shard = cls(
            directory,
            segments,
            log_start_offset=log_start,
            segment_bytes=segment_bytes,
            segment_ms=segment_ms,
            clock_ms=clock_ms,
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
        return shard, report

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
            OSError: A write failed; the segment was cut back to before the failed run
                (frames written to earlier segments of this call stay).
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
