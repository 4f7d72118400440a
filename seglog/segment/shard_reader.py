"""Read-only access to a shard directory that another process may be appending to.

A :class:`ShardReader` takes no lock and writes nothing. It reads with ``pread`` rather than
``mmap`` because the owning process may truncate the active segment (crash recovery cuts a
torn tail): a mapping past the new end would fault with SIGBUS, a ``pread`` just comes back
short.

What it trusts, and why that is safe without coordination with the writer:

- The writer publishes the acknowledged end of the log in the durable-end marker
  (:mod:`seglog.segment.durable_end`) after each batch is durable under its fsync policy.
  Only frames below it are read: bytes past it may be a write in progress or a failed write
  the owner is about to roll back, and must never reach a consumer.
- A segment is final once the marker's end lies in a later segment; a bad frame in it is
  corruption. (Stores written before the marker existed fall back to: a later segment file
  proves the earlier one final, and a frame is readable once complete with a good CRC.)
- Retention and ``truncate_before`` unlink whole segments; a segment the reader has open stays
  readable through its descriptor.
"""

from __future__ import annotations

import bisect
import contextlib
import os
from pathlib import Path
from typing import Final, NamedTuple

from seglog.errors import CorruptFrame, OffsetOutOfRange, StorageError
from seglog.record import FRAME_HEADER_BYTES, FrameHeader, parse_header, verify_frame
from seglog.segment.durable_end import DurableEnd, read_durable_end
from seglog.segment.log_segment import SEGMENT_SUFFIX, segment_name
from seglog.segment.shard_log import read_checkpoint

__all__ = ["RawFrame", "ShardReader"]

# Bytes read ahead per pread: several typical frames per syscall, small enough to stay cheap.
_READ_AHEAD_BYTES: Final = 1 << 20


class RawFrame(NamedTuple):
    """A complete, CRC-checked frame: its header and its bytes (header first)."""

    header: FrameHeader
    data: bytes


def list_segment_bases(directory: Path) -> list[int]:
    """Base offsets of the segment files in ``directory``, ascending.

    Raises:
        StorageError: The directory cannot be listed (e.g. the database was dropped).
    """
    try:
        names = os.listdir(directory)
    except OSError as exc:
        raise StorageError(f"cannot list shard directory {directory}") from exc
    bases = []
    for name in names:
        if name.endswith(SEGMENT_SUFFIX) and name[: -len(SEGMENT_SUFFIX)].isdigit():
            bases.append(int(name[: -len(SEGMENT_SUFFIX)]))
    return sorted(bases)


class ShardReader:
    """Reads the frames of one shard from a position on, following the log as it grows.

    Not thread-safe; one reader per consumer. Call :meth:`close` when done.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._fd = -1
        self._base = -1  # base offset of the open segment
        self._pos = 0  # file position of the next frame
        self.next_offset = 0  # offset of the first record of the next frame
        self._buf = b""  # read-ahead: bytes of the open segment from _buf_pos
        self._buf_pos = 0
        self._end: DurableEnd | None = None  # the owner's acknowledged end, read per call

    def _refresh_end(self) -> None:
        self._end = read_durable_end(self.directory)

    def acknowledged_end(self) -> int | None:
        """The owner's acknowledged end offset (``None``: a store without the marker)."""
        self._refresh_end()
        return None if self._end is None else self._end.next_offset

    # --- positioning -------------------------------------------------------------------

    def start_offset(self) -> int:
        """The first readable offset: the checkpointed start or the first segment's base."""
        bases = list_segment_bases(self.directory)
        start = int(read_checkpoint(self.directory).get("log_start_offset", 0))
        return max(start, bases[0]) if bases else start

    def seek(self, offset: int) -> None:
        """Position the reader at the frame holding ``offset`` (or at the log end).

        Raises:
            OffsetOutOfRange: ``offset`` is below the first local segment or past the end.
        """
        self._refresh_end()
        bases = list_segment_bases(self.directory)
        start = self.start_offset()
        if not bases or offset < start:
            raise OffsetOutOfRange(offset, start, bases[-1] if bases else start)
        i = bisect.bisect_right(bases, offset) - 1
        self._open(bases[i])
        while True:
            header = self._peek_header(final=i + 1 < len(bases))
            if header is None:
                if i + 1 < len(bases) and bases[i + 1] <= offset:
                    i += 1
                    self._open(bases[i])
                    continue
                if offset > self.next_offset:
                    raise OffsetOutOfRange(offset, start, self.next_offset)
                return
            if header.next_offset > offset:
                return
            self._skip(header)

    def seek_time(self, ts_us: int) -> int:
        """Position at the first frame whose records may have ``ts >= ts_us``; return its base.

        Only frame headers are read (``max_ts`` per frame); the caller filters rows.
        """
        self.seek(self.start_offset())
        while True:
            header = self._peek_header(final=False)
            if header is None:
                if not self._advance_segment():
                    return self.next_offset
                continue
            if header.max_ts >= ts_us:
                return header.base_offset
            self._skip(header)

    # --- reading -----------------------------------------------------------------------

    def read(self, max_bytes: int) -> list[RawFrame]:
        """The complete frames from the current position, up to about ``max_bytes``.

        Returns an empty list when nothing new is readable yet; call again later.

        Raises:
            CorruptFrame: A frame of a segment that is no longer being written is bad.
            OffsetOutOfRange: The next segment was deleted (retention) before it was read.
        """
        if self._fd < 0:
            raise StorageError("ShardReader.seek() was not called")
        self._refresh_end()
        out: list[RawFrame] = []
        total = 0
        while total < max_bytes:
            frame = self._next_frame()
            if frame is None:
                if out or not self._advance_segment():
                    break
                continue
            out.append(frame)
            total += len(frame.data)
        return out

    def close(self) -> None:
        """Close the open segment; idempotent."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    # --- internals ---------------------------------------------------------------------

    def _open(self, base: int) -> None:
        path = self.directory / segment_name(base)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            # Retention removed it between the listing and the open.
            raise OffsetOutOfRange(base, self.start_offset(), base) from None
        except OSError as exc:
            raise StorageError(f"cannot open segment {path}") from exc
        self.close()
        self._fd = fd
        self._base = base
        self._pos = 0
        self.next_offset = base
        self._buf = b""
        self._buf_pos = 0

    def _advance_segment(self) -> bool:
        """Move to the next segment if the current one is final and fully read."""
        if self._end is not None and self._end.segment_base <= self._base:
            return False  # the acknowledged end is in this segment: it is not final
        bases = list_segment_bases(self.directory)
        later = [b for b in bases if b > self._base]
        if not later:
            return False
        # The listing came first: a later file proves the current one is final, so one more
        # look at it decides whether frames are left.
        header = self._peek_header(final=True)
        if header is not None:
            data = self._bytes(self._pos, header.size)
            try:
                verify_frame(data, 0, header)
            except CorruptFrame as exc:
                raise CorruptFrame(f"{self._where()}: {exc}") from None
            return True  # frames left here after all; the caller reads them
        if later[0] != self.next_offset:
            start = self.start_offset()
            raise OffsetOutOfRange(self.next_offset, start, bases[-1])
        self._open(later[0])
        return True

    def _bytes(self, pos: int, length: int) -> bytes:
        """``length`` bytes at ``pos`` (fewer at the end of the file), through the read-ahead."""
        rel = pos - self._buf_pos
        if rel < 0 or rel + length > len(self._buf):
            try:
                self._buf = os.pread(self._fd, max(length, _READ_AHEAD_BYTES), pos)
            except OSError as exc:
                raise StorageError(f"cannot read segment {segment_name(self._base)}") from exc
            self._buf_pos = pos
            rel = 0
        return self._buf[rel : rel + length]

    def _peek_header(self, *, final: bool) -> FrameHeader | None:
        """The header at the current position; ``None`` at the end of the written data.

        ``final``: the segment is known to be complete, so a bad header is corruption.
        """
        raw = self._bytes(self._pos, FRAME_HEADER_BYTES)
        if len(raw) < FRAME_HEADER_BYTES:
            if final and raw:
                raise CorruptFrame(f"{self._where()}: truncated frame header")
            self._buf = b""  # re-read next time: the writer may be extending the file
            return None
        try:
            header = parse_header(raw, 0)
        except CorruptFrame:
            if final:
                raise CorruptFrame(f"{self._where()}: bad frame header") from None
            self._buf = b""
            return None
        if header.base_offset != self.next_offset:
            if final:
                raise CorruptFrame(
                    f"{self._where()}: frame has base offset {header.base_offset}, expected {self.next_offset}"
                )
            self._buf = b""
            return None
        return header

    def _skip(self, header: FrameHeader) -> None:
        self._pos += header.size
        self.next_offset = header.next_offset

    def _next_frame(self) -> RawFrame | None:
        header = self._peek_header(final=False)
        if header is None:
            return None
        if self._end is not None and header.next_offset > self._end.next_offset:
            return None  # not acknowledged (yet): maybe a write the owner rolls back
        data = self._bytes(self._pos, header.size)
        try:
            verify_frame(data, 0, header)
        except CorruptFrame:
            # Still being written, or a torn tail the writer's recovery will cut. Whether the
            # segment is final is decided by _advance_segment, which re-checks strictly.
            self._buf = b""
            return None
        self._skip(header)
        return RawFrame(header, data)

    def _where(self) -> str:
        return f"{self.directory / segment_name(self._base)} position {self._pos}"

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
