"""The producer's queue of unacknowledged batches: on disk (replayq-style) or in memory.

One small interface, :class:`Buffer`: ``append(item) -> id`` (ids increase by one per item),
``pending()`` (every item not yet acknowledged, oldest first), ``ack(id)``, ``bytes``
(payload bytes not yet acknowledged). Items are opaque bytes, given whole or as a tuple of
parts (bytes-like) that the item is the concatenation of: the producer stores one shard's
batch per item as its 12-byte header and the Arrow IPC message, which are never copied into
one buffer (the disk buffer writes the parts with one ``pwritev`` and frames them as one
item; ``pending()`` of the disk buffer returns each item whole, as ``bytes``).

:class:`DiskBuffer` is EMQX's replayq (seed 004) with seglog's checks:

* **Segments.** Items are appended to the newest segment file, ``<first id:020d>.seg``; a
  new segment starts once the newest holds ``segment_bytes``. Each item is framed as
  ``magic b"SGLQ" | length u32 | crc32c(payload) u32 | payload`` (little-endian).
* **Commit file.** ``COMMIT`` records the acknowledged position: the first id not yet
  acknowledged (every id below it is). It is replaced atomically (temp file, fsync, rename,
  fsync of the directory) by :meth:`DiskBuffer.commit`, and only then are segments whose
  every item lies below it deleted. Acknowledgements above a gap (an older item still in
  flight) are kept in memory only: after a restart such items are pending again (at least
  once).
* **Recovery on open.** Every segment is scanned. A bad item (short header, bad magic or
  zero length, a length past the end of the file, or a CRC mismatch) at the end of the
  newest segment, with no good item anywhere after it, is a torn write: the file is
  truncated there (logged). Any other bad item (one followed by a good item, or one in an
  older segment) and a bad commit file raise :class:`~seglog.errors.CorruptBuffer`:
  damage is reported, never dropped silently.
* **fsync policy** (the producer's ``buffer_fsync``): ``"always"``: every append is
  fdatasync'ed (and the directory after a new segment) before it returns: an item appended
  survives a SIGKILL of the process *and* an OS crash or power loss. ``"interval"``: an
  append fdatasyncs only when the last sync is older than ``fsync_interval_s`` (the producer
  also syncs after that delay and on close): items are written to the OS at once, so a
  SIGKILL of the process loses nothing already appended, but an OS crash or power loss
  loses what was appended since the last sync (at most about the interval). ``"never"``: no
  fsync of items at all (close included): a process SIGKILL still loses nothing appended,
  an OS crash loses whatever the OS had not written back (tens of seconds with Linux
  defaults), and can damage an older segment, which then raises ``CorruptBuffer``. The
  commit file is always replaced with fsyncs (it is small and rare).
* One process at a time: the directory is locked (``flock`` on ``LOCK``); a second opener
  gets :class:`~seglog.errors.BusyResourceError`.

:class:`MemoryBuffer` keeps the same accounting in memory (nothing survives the process).
Overflow policy is the producer's business; the buffers only count.

Methods of :class:`DiskBuffer` block on file I/O; the producer calls them from one worker
thread. A lock makes them safe to call from several threads.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import struct
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final, Literal, Protocol

import crc32c

from seglog import _fs
from seglog.errors import BusyResourceError, ClosedResourceError, CorruptBuffer, InvalidArgument

__all__ = [
    "DEFAULT_FSYNC_INTERVAL_S",
    "DEFAULT_SEGMENT_BYTES",
    "FSYNC_POLICIES",
    "ITEM_HEADER_BYTES",
    "Buffer",
    "DiskBuffer",
    "FsyncPolicy",
    "MemoryBuffer",
    "Payload",
    "payload_size",
]

log = logging.getLogger("seglog.client")

FsyncPolicy = Literal["always", "interval", "never"]
FSYNC_POLICIES: Final = ("always", "interval", "never")

ITEM_MAGIC: Final = b"SGLQ"
_ITEM = struct.Struct("<4sII")
ITEM_HEADER_BYTES: Final = _ITEM.size
COMMIT_MAGIC: Final = b"SGLC"
COMMIT_VERSION: Final = 1
_COMMIT = struct.Struct("<4sHQ")  # magic, version, first id not acknowledged; then crc32c u32
_CRC = struct.Struct("<I")
COMMIT_NAME: Final = "COMMIT"
LOCK_NAME: Final = "LOCK"
# An item: whole, or the parts it is the concatenation of (the name ``bytes`` is a property
# of the buffers).
Payload = bytes | tuple[bytes | memoryview, ...]
SEGMENT_SUFFIX: Final = ".seg"
DEFAULT_SEGMENT_BYTES: Final = 8 << 20
DEFAULT_FSYNC_INTERVAL_S: Final = 1.0


class Buffer(Protocol):
    """What the producer needs of a buffer."""

    max_bytes: int

    @property
    def bytes(self) -> int:
        """Payload bytes of the items not yet acknowledged."""
        ...

    def append(self, item: Payload) -> int:
        """Store one item; return its id."""
        ...

    def append_many(self, items: Sequence[Payload]) -> list[int]:
        """Store items in order (one write, one sync); return their ids."""
        ...

    def pending(self) -> list[tuple[int, Payload]]:
        """Every item not yet acknowledged, oldest first."""
        ...

    def ack(self, item_id: int) -> None:
        """Acknowledge one item (any order); unknown or already acknowledged ids are ignored."""
        ...

    def commit(self) -> None:
        """Make the acknowledgements durable (the disk buffer's commit file) and free space."""
        ...

    def sync(self) -> None:
        """Make every appended item durable (whatever the fsync policy)."""
        ...

    def close(self) -> None:
        """Commit and release; idempotent."""
        ...


class MemoryBuffer:
    """The buffer without a directory: items live in this process only."""

    def __init__(self, max_bytes: int) -> None:
        _check_positive("max_bytes", max_bytes)
        self.max_bytes = max_bytes
        self._items: dict[int, Payload] = {}
        self._next_id = 0
        self._bytes = 0

    @property
    def bytes(self) -> int:
        return self._bytes

    def append(self, item: Payload) -> int:
        return self.append_many([item])[0]

    def append_many(self, items: Sequence[Payload]) -> list[int]:
        ids = list(range(self._next_id, self._next_id + len(items)))
        for item_id, item in zip(ids, items, strict=True):
            self._items[item_id] = item
            self._bytes += payload_size(item)
        self._next_id += len(items)
        return ids

    def pending(self) -> list[tuple[int, Payload]]:
        return sorted(self._items.items())

    def ack(self, item_id: int) -> None:
        item = self._items.pop(item_id, None)
        if item is not None:
            self._bytes -= payload_size(item)

    def commit(self) -> None:
        pass

    def sync(self) -> None:
        pass

    def close(self) -> None:
        pass


class _Segment:
    __slots__ = ("count", "first_id", "path", "size")

    def __init__(self, path: Path, first_id: int, count: int, size: int) -> None:
        self.path = path
        self.first_id = first_id
        self.count = count
        self.size = size

    @property
    def end_id(self) -> int:
        return self.first_id + self.count


class DiskBuffer:
    """A directory of segment files and a commit file (see the module docstring).

    Args:
        dir: The directory (created if missing).
        max_bytes: The producer's ``buffer_max_bytes`` (kept for it; the buffer only counts).
        fsync: ``"always"``, ``"interval"`` or ``"never"``.
        segment_bytes: Size at which a new segment file starts.
        fsync_interval_s: The ``"interval"`` policy's longest time between syncs.

    Raises:
        CorruptBuffer: Damage a torn write cannot explain (see the module docstring).
        BusyResourceError: Another process has the directory open.
    """

    def __init__(
        self,
        dir: str | os.PathLike[str],
        *,
        max_bytes: int,
        fsync: FsyncPolicy = "always",
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        fsync_interval_s: float = DEFAULT_FSYNC_INTERVAL_S,
    ) -> None:
        _check_positive("max_bytes", max_bytes)
        _check_positive("segment_bytes", segment_bytes)
        if fsync not in FSYNC_POLICIES:
            raise InvalidArgument(f"fsync must be one of {FSYNC_POLICIES}, not {fsync!r}")
        self.dir = Path(dir)
        self.max_bytes = max_bytes
        self.fsync: FsyncPolicy = fsync
        self.segment_bytes = segment_bytes
        self.fsync_interval_s = fsync_interval_s
        self._lock = threading.RLock()
        self._segments: list[_Segment] = []
        # Unacknowledged items: id -> (segment, position of the payload, payload length).
        self._index: dict[int, tuple[_Segment, int, int]] = {}
        self._bytes = 0
        self._next_id = 0
        self._acked_below = 0  # every id below this is acknowledged
        self._committed = 0  # the position the commit file holds
        self._fd = -1  # the newest segment, open for appending
        self._dirty = False  # written since the last sync
        self._last_sync = time.monotonic()
        self._closed = False
        _fs.makedirs_durable(self.dir)
        self._lock_fd = os.open(self.dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise BusyResourceError(f"buffer directory {self.dir} is in use by another producer") from None
        try:
            self._recover()
        except BaseException:
            self._release()
            raise

    # --- open ----------------------------------------------------------------------------

    def _recover(self) -> None:
        for tmp in self.dir.glob(_fs.TMP_PREFIX + "*"):
            tmp.unlink()
        self._acked_below = self._committed = self._read_commit()
        files = sorted(p for p in self.dir.iterdir() if p.suffix == SEGMENT_SUFFIX)
        for i, path in enumerate(files):
            stem = path.name[: -len(SEGMENT_SUFFIX)]
            if not (stem.isdigit() and len(stem) == 20):
                raise CorruptBuffer(f"unexpected segment file name {path.name}", path=str(path))
            first = int(stem)
            data = path.read_bytes()
            items, end = _scan(data, path, last=i == len(files) - 1)
            if end < len(data):
                log.warning(
                    "producer buffer %s: torn tail, truncated %d bytes after %d good items",
                    path,
                    len(data) - end,
                    len(items),
                )
                with open(path, "r+b") as f:
                    f.truncate(end)
                    os.fsync(f.fileno())
            seg = _Segment(path, first, len(items), end)
            if self._segments and self._segments[-1].end_id != first:
                raise CorruptBuffer(
                    f"segment {path.name} does not continue {self._segments[-1].path.name}"
                    f" (items {self._segments[-1].first_id}..{self._segments[-1].end_id - 1})",
                    path=str(path),
                )
            self._segments.append(seg)
            for k, (pos, length) in enumerate(items):
                item_id = first + k
                if item_id >= self._acked_below:
                    self._index[item_id] = (seg, pos, length)
                    self._bytes += length
        if self._segments:
            self._next_id = self._segments[-1].end_id
            if self._segments[0].first_id > self._acked_below:
                # Segments deleted but the commit file older (cannot happen: the commit is
                # made durable before deleting); whatever is missing was acknowledged.
                self._acked_below = self._segments[0].first_id
        self._next_id = max(self._next_id, self._acked_below)
        self._delete_acked_segments()
        if self._segments:
            self._fd = os.open(self._segments[-1].path, os.O_WRONLY | os.O_APPEND)

    def _read_commit(self) -> int:
        path = self.dir / COMMIT_NAME
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return 0
        if len(raw) != _COMMIT.size + _CRC.size:
            raise CorruptBuffer(f"commit file {path} has {len(raw)} bytes", path=str(path))
        magic, version, position = _COMMIT.unpack_from(raw)
        (crc,) = _CRC.unpack_from(raw, _COMMIT.size)
        if magic != COMMIT_MAGIC or crc != crc32c.crc32c(raw[: _COMMIT.size]):
            raise CorruptBuffer(f"commit file {path} failed its magic or CRC check", path=str(path))
        if version != COMMIT_VERSION:
            raise CorruptBuffer(f"commit file {path} has unknown version {version}", path=str(path))
        return int(position)

    # --- the interface -------------------------------------------------------------------

    @property
    def bytes(self) -> int:
        return self._bytes

    @property
    def acked_position(self) -> int:
        """The first id not acknowledged (every id below it is), as held in memory."""
        return self._acked_below

    def append(self, item: Payload) -> int:
        return self.append_many([item])[0]

    def append_many(self, items: Sequence[Payload]) -> list[int]:
        if not items:
            return []
        with self._lock:
            self._check_open()
            if not self._segments or self._segments[-1].size >= self.segment_bytes:
                self._roll()
            seg = self._segments[-1]
            parts: list[bytes | memoryview] = []
            positions: list[tuple[int, int]] = []
            pos = seg.size
            for item in items:
                pieces = (item,) if isinstance(item, bytes) else item
                size = payload_size(item)
                if not size:
                    raise InvalidArgument("a buffer item must not be empty")
                crc = 0
                for piece in pieces:  # the CRC of the concatenation, without making it
                    crc = crc32c.crc32c(piece, crc)
                parts.append(_ITEM.pack(ITEM_MAGIC, size, crc))
                parts.extend(pieces)
                positions.append((pos + ITEM_HEADER_BYTES, size))
                pos += ITEM_HEADER_BYTES + size
            try:
                _fs.pwritev_all(self._fd, parts, seg.size)
            except OSError:
                # Cut back whatever part of this write landed: the items were not appended.
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, seg.size)
                raise
            ids = list(range(self._next_id, self._next_id + len(items)))
            for item_id, (p, n) in zip(ids, positions, strict=True):
                self._index[item_id] = (seg, p, n)
                self._bytes += n
            seg.size = pos
            seg.count += len(items)
            self._next_id += len(items)
            self._dirty = True
            if self.fsync == "always" or (
                self.fsync == "interval" and time.monotonic() - self._last_sync >= self.fsync_interval_s
            ):
                self._sync_locked()
            return ids

    def _roll(self) -> None:
        if self._fd >= 0:
            if self.fsync != "never" and self._dirty:
                _fs.fdatasync(self._fd)
                self._dirty = False
            os.close(self._fd)
            self._fd = -1
        path = self.dir / f"{self._next_id:020d}{SEGMENT_SUFFIX}"
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o644)
        if self.fsync != "never":
            _fs.fsync_dir(self.dir)
        self._segments.append(_Segment(path, self._next_id, 0, 0))

    def pending(self) -> list[tuple[int, Payload]]:
        with self._lock:
            self._check_open()
            out: list[tuple[int, Payload]] = []
            cache: dict[Path, bytes] = {}
            for item_id in sorted(self._index):
                seg, pos, length = self._index[item_id]
                data = cache.get(seg.path)
                if data is None:
                    cache.clear()
                    data = cache[seg.path] = seg.path.read_bytes()
                out.append((item_id, data[pos : pos + length]))
            return out

    def ack(self, item_id: int) -> None:
        with self._lock:
            entry = self._index.pop(item_id, None)
            if entry is None:
                return
            self._bytes -= entry[2]
            while self._acked_below < self._next_id and self._acked_below not in self._index:
                self._acked_below += 1

    def commit(self) -> None:
        with self._lock:
            self._check_open()
            position = self._acked_below
            if position != self._committed:
                raw = _COMMIT.pack(COMMIT_MAGIC, COMMIT_VERSION, position)
                _fs.atomic_write(self.dir / COMMIT_NAME, raw + _CRC.pack(crc32c.crc32c(raw)))
                self._committed = position
            self._delete_acked_segments()

    def _delete_acked_segments(self) -> None:
        # Only segments below the durable commit position; the newest stays (it is appended to).
        while len(self._segments) > 1 and self._segments[0].end_id <= self._committed:
            seg = self._segments.pop(0)
            seg.path.unlink()
        if len(self._segments) == 1 and self._segments[0].end_id <= self._committed and self._fd < 0:
            # On open: a fully acknowledged newest segment is not needed either.
            self._segments.pop().path.unlink()

    def sync(self) -> None:
        with self._lock:
            if not self._closed and self._dirty:
                self._sync_locked()

    def _sync_locked(self) -> None:
        _fs.fdatasync(self._fd)
        self._dirty = False
        self._last_sync = time.monotonic()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            try:
                if self.fsync != "never" and self._dirty:
                    self._sync_locked()
                self.commit()
            finally:
                self._closed = True
                self._release()

    def _release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = -1

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedResourceError(f"buffer {self.dir} is closed")


def payload_size(item: Payload) -> int:
    """The bytes of an item, whole or in parts."""
    if isinstance(item, bytes):
        return len(item)
    return sum(memoryview(p).nbytes for p in item)


def _item_at(data: bytes, pos: int) -> int | None:
    """The length of a good item at ``pos`` (magic, length, CRC all check), else None."""
    if len(data) - pos < ITEM_HEADER_BYTES:
        return None
    magic, length, crc = _ITEM.unpack_from(data, pos)
    start = pos + ITEM_HEADER_BYTES
    if magic != ITEM_MAGIC or length == 0 or start + length > len(data):
        return None
    if crc32c.crc32c(memoryview(data)[start : start + length]) != crc:
        return None
    return int(length)


def _scan(data: bytes, path: Path, *, last: bool) -> tuple[list[tuple[int, int]], int]:
    """Good items (payload position, length) from the start, and where they end.

    Raises:
        CorruptBuffer: A bad item that is not a torn tail of the newest segment.
    """
    items: list[tuple[int, int]] = []
    pos = 0
    while pos < len(data):
        length = _item_at(data, pos)
        if length is None:
            after = data.find(ITEM_MAGIC, pos + 1)
            while after >= 0:
                if _item_at(data, after) is not None:
                    raise CorruptBuffer(
                        f"{path}: bad item at byte {pos} followed by a good one at byte {after}",
                        path=str(path),
                        position=pos,
                    )
                after = data.find(ITEM_MAGIC, after + 1)
            if not last:
                raise CorruptBuffer(
                    f"{path}: bad item at byte {pos} in a segment older than the newest",
                    path=str(path),
                    position=pos,
                )
            return items, pos
        items.append((pos + ITEM_HEADER_BYTES, length))
        pos += ITEM_HEADER_BYTES + length
    return items, pos


def _check_positive(name: str, value: object) -> None:
    if type(value) is not int or value < 1:
        raise InvalidArgument(f"{name} must be an int >= 1, not {value!r}")
