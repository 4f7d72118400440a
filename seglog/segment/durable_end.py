"""The durable-end marker of a shard: how far its log is acknowledged, for other readers.

The owner rewrites one small record in ``<shard>/durable-end`` after every batch it has made
durable under the fsync policy and before it acknowledges the batch. It is a ``pwrite`` into
an allocated block (no fsync, no allocation, so it cannot fail for lack of space), which makes
it visible at once to every process on the machine:

* Followers in other processes read frames only below it, so they never deliver bytes that a
  failed write is about to remove.
* Recovery trusts it only when it is *fenced*: written and fsynced by an owner that could not
  roll a failed write back itself; the next open cuts the log back to it. An ordinary record
  is never used to cut the log: after a machine restart (or a filesystem that lost its page
  cache) it can be older than data that was fsynced and acknowledged.
"""

from __future__ import annotations

import contextlib
import os
import struct
import zlib
from pathlib import Path
from typing import Final, NamedTuple

from seglog._fs import fsync_dir
from seglog.segment.fd_cache import CachedFile

__all__ = [
    "DURABLE_END_FILE",
    "DurableEnd",
    "DurableEndMarker",
    "fence_in_process",
    "read_durable_end",
    "take_fence",
]

DURABLE_END_FILE: Final = "durable-end"

# The record: a crc32 of the body, then the body.
_CRC: Final = struct.Struct("<I")
_BODY: Final = struct.Struct(
    "<"
    "I"  # flags: _FENCED
    "Q"  # next_offset: every record below it is acknowledged
    "Q"  # segment_base: base offset of the segment holding the end
    "Q"  # segment_bytes: valid bytes of that segment (a frame boundary)
    "Q"  # reserved: zero
)
_RECORD_BYTES: Final = _CRC.size + _BODY.size
_FENCED: Final = 1
# The file is created at this size so later rewrites never allocate.
_FILE_BYTES: Final = 4096


class DurableEnd(NamedTuple):
    """One marker record."""

    next_offset: int
    segment_base: int
    segment_bytes: int
    fenced: bool


def _decode(raw: bytes) -> DurableEnd | None:
    if len(raw) < _RECORD_BYTES:
        return None
    body = raw[_CRC.size : _RECORD_BYTES]
    if _CRC.unpack_from(raw)[0] != zlib.crc32(body):
        return None
    flags, next_offset, base, size, _reserved = _BODY.unpack(body)
    return DurableEnd(next_offset, base, size, bool(flags & _FENCED))


# Fences of this process, by shard directory: a disk that refuses the fenced record (EIO)
# still lets a reopen in this process cut the tail that was reported as failed.
_PROCESS_FENCES: dict[Path, DurableEnd] = {}


def fence_in_process(directory: Path, next_offset: int, segment_base: int, segment_bytes: int) -> None:
    """Remember, for reopens in this process, that the log of ``directory`` ends here."""
    _PROCESS_FENCES[directory.absolute()] = DurableEnd(next_offset, segment_base, segment_bytes, True)


def take_fence(directory: Path) -> DurableEnd | None:
    """The fence recovery must cut to: this process's, else a fenced record on disk."""
    mine = _PROCESS_FENCES.pop(directory.absolute(), None)
    if mine is not None:
        return mine
    on_disk = read_durable_end(directory)
    return on_disk if on_disk is not None and on_disk.fenced else None


def read_durable_end(directory: Path) -> DurableEnd | None:
    """The marker of the shard in ``directory``; ``None`` when absent, torn or never written."""
    try:
        with open(directory / DURABLE_END_FILE, "rb") as f:
            return _decode(f.read(_RECORD_BYTES))
    except OSError:
        return None


class DurableEndMarker:
    """The owner's handle on the marker file (one writer thread)."""

    def __init__(self, directory: Path) -> None:
        path = directory / DURABLE_END_FILE
        created = not path.exists()
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if created or os.fstat(fd).st_size < _FILE_BYTES:
                os.pwrite(fd, b"\0" * _FILE_BYTES, 0)
                os.fsync(fd)
                fsync_dir(directory)
        except OSError:
            os.close(fd)
            raise
        # Idle shards keep no descriptor open (see fd_cache).
        self._file = CachedFile(path, os.O_RDWR, fd=fd)

    def publish(
        self,
        next_offset: int,
        segment_base: int,
        segment_bytes: int,
        *,
        fenced: bool = False,
        sync: bool = False,
    ) -> None:
        """Record the acknowledged end; with ``fenced`` or ``sync`` also fsync it (the slow, rare path).

        ``sync`` without ``fenced`` durably clears a fence written on purpose (a truncation):
        a fenced record left on disk would cut later acknowledged appends at the next open.

        Raises:
            OSError: The write (or the fsync) failed.
        """
        body = _BODY.pack(_FENCED if fenced else 0, next_offset, segment_base, segment_bytes, 0)
        record = _CRC.pack(zlib.crc32(body)) + body
        with self._file.fd() as fd:
            if os.pwrite(fd, record, 0) != len(record):
                raise OSError("short write of the durable-end marker")
            if fenced or sync:
                os.fsync(fd)

    def close(self) -> None:
        """Close the file; idempotent."""
        with contextlib.suppress(OSError):
            self._file.close()
