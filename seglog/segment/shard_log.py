"""The segments of one open shard: append with rolling, rollback, truncation, checkpoints.

Opening a shard directory (recovery after a crash) is :mod:`seglog.segment.log_loader`.
"""

from __future__ import annotations

import bisect
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final, NamedTuple

from seglog._fs import atomic_write, fsync_dir
from seglog.errors import OffsetOutOfRange
from seglog.record import EncodedFrame, FrameHeader
from seglog.segment.durable_end import DurableEndMarker, fence_in_process
from seglog.segment.log_segment import LogSegment

__all__ = ["CHECKPOINT_FILE", "AppendMark", "FramePosition", "ShardLog", "read_checkpoint"]

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
        later step makes the next open finish the cut (:func:`~seglog.segment.log_loader.open_shard_log`); then later segments are
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

    def restart_at(self, offset: int) -> None:
        """Drop every record and start the log over, empty, at ``offset`` (past the end):
        Kafka's ``truncateFullyAndStartAt``, for a follower whose log ends below its leader's
        start. Durable and crash-safe at every step: a crash leaves the whole log, the log
        emptied at its old start, or the empty log at ``offset``.

        Steps: :meth:`truncate_to` the log start (crash-safe on its own: a fenced marker
        first); the one segment left is removed and the directory fsynced (a crash here opens
        as an empty log at the old start, which the next fetch restarts again); the new empty
        segment at ``offset`` is created (a crash here opens as an empty log there: the
        loader starts the log at its first segment's base); the checkpoint records the start
        and the durable end is published. The caller must have synced the journal's entries
        for this shard into the segments first.

        Raises:
            ValueError: ``offset`` is below the log end.
            OSError: A step failed; the next open finds one of the states above.
        """
        if offset < self.next_offset:
            raise ValueError(f"restart_at({offset}) is below the log end {self.next_offset}")
        self.truncate_to(self.log_start_offset)
        segments, _bases = self._snap
        for doomed in reversed(segments):
            doomed.retire()  # readers holding it keep reading through its mapping
        fsync_dir(self.directory)
        new = LogSegment.create(self.directory, offset)
        new.created_ms = self._clock_ms()
        self._snap = ([new], [offset])
        self.log_start_offset = offset
        self.write_checkpoint()
        self.publish_durable_end(sync=True)

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
