"""The write-ahead journal of one I/O worker of one database: one fdatasync per drain.

A worker serves many shards. Syncing each touched shard's segment after every drain made
durable throughput fall with the number of shards (one ``fdatasync`` each). Instead the
worker appends everything a drain wrote to this one file and syncs it once; the shards'
segment files are written to the page cache and synced only at a checkpoint (when the
journal is full, at close, at a segment roll). This is BookKeeper's journal / RocksDB's WAL.

Layout: a header block, then entries back to back (each padded to 8 bytes)::

    block 0:  magic "SGLJ" | version u32 | cycle u64 | crc32c u32      (rest zero)
    entry:    crc32c u32 | body_bytes u32 | cycle u64 | shard u32 | kind u8 | 3 pad | body
              (``shard`` of a rows entry: the leader epoch its rows are stamped with)

The ``crc`` of an entry covers the rest of its header and its body. Recycling starts a new
``cycle`` by rewriting the header: entries of older cycles left beyond the write position no
longer match and end the replay, so the file is reused without truncating or zeroing it.

The file is zero-filled ahead of the write position in growing steps, so an
ordinary entry is an overwrite of allocated blocks and its ``fdatasync`` journals no size or
extent change; after the first cycle the whole file is allocated and writes never grow it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final, NamedTuple

import crc32c

from seglog._fs import fdatasync, fsync_dir, pwritev_all

__all__ = [
    "DEFAULT_JOURNAL_BYTES",
    "ENTRY_FRAME",
    "ENTRY_ROWS",
    "ENTRY_ROWS_PRODUCER",
    "Journal",
    "JournalEntry",
    "journal_name",
]

log = logging.getLogger("seglog.segment.journal")

DEFAULT_JOURNAL_BYTES: Final = 64 << 20
_MAGIC: Final = b"SGLJ"
_VERSION: Final = 1
_HEADER: Final = struct.Struct(
    "<"
    "4s"  # magic
    "I"  # version
    "Q"  # cycle: entries of other cycles are not part of this journal
    "I"  # crc32c of the fields before it
)
_HEADER_BLOCK_BYTES: Final = 4096
_ENTRY: Final = struct.Struct(
    "<"
    "I"  # crc32c of the fields after it and of the body
    "I"  # body_bytes
    "Q"  # cycle: must equal the header's
    "I"  # shard: the shard of a frame entry; the leader epoch of a rows entry
    "B"  # kind: ENTRY_FRAME, ENTRY_ROWS or ENTRY_ROWS_PRODUCER
    "3x"
)
_ENTRY_CRC_START: Final = struct.calcsize("<I")
ENTRY_FRAME: Final = 1  # body: one frame of ``shard``, exactly as its segment stores it
ENTRY_ROWS: Final = 2  # body: an Arrow batch of rows of several shards (with shard, offset)
ENTRY_ROWS_PRODUCER: Final = 3  # ENTRY_ROWS of an idempotent append: also producer id, epoch, sequence
# Zero-fill grows the file by its current size (at least _MIN_GROW_BYTES, at most _MAX_GROW_BYTES):
# a small first allocation for small disks, few size changes once the journal is busy.
_MIN_GROW_BYTES: Final = 1 << 20
_MAX_GROW_BYTES: Final = 16 << 20
_ZEROS: Final = bytes(1 << 20)
_PAD: Final = tuple(bytes(n) for n in range(8))


def journal_name(worker: int) -> str:
    """File name of worker ``worker``'s journal."""
    return f"worker-{worker:03d}.journal"


class JournalEntry(NamedTuple):
    """One replayed entry: its kind, shard (frame entries) and body."""

    kind: int
    shard: int
    body: memoryview


class Journal:
    """One journal file, written by one I/O worker thread (see the module docstring).

    Args:
        path: The file; created (with its directory) if missing.
        journal_bytes: Recycle when an entry would end past this; an entry larger than the
            whole journal is still written (the file grows for it).
    """

    def __init__(self, path: Path, *, journal_bytes: int = DEFAULT_JOURNAL_BYTES) -> None:
        self.path = path
        self.journal_bytes = journal_bytes
        created = not path.exists()
        if created and not path.parent.is_dir():
            path.parent.mkdir(parents=True)
            fsync_dir(path.parent.parent)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            self.cycle = 0
            self.allocated = os.fstat(self._fd).st_size
            header = self._read_header()
            if header is None:
                self._write_header(1)
                if created:
                    fsync_dir(path.parent)
            else:
                self.cycle = header
            self.write_pos = _HEADER_BLOCK_BYTES
            self._scan_end: int | None = None
        except BaseException:
            os.close(self._fd)
            raise

    # --- header ------------------------------------------------------------------------

    def _read_header(self) -> int | None:
        raw = os.pread(self._fd, _HEADER.size, 0)
        if len(raw) < _HEADER.size:
            return None
        magic, version, cycle, crc = _HEADER.unpack(raw)
        if magic != _MAGIC or version != _VERSION or crc != crc32c.crc32c(raw[: _HEADER.size - 4]):
            if raw.strip(b"\0"):
                log.warning("%s: unreadable journal header; starting a new journal", self.path)
            return None
        return int(cycle)

    def _write_header(self, cycle: int) -> None:
        body = struct.pack("<4sIQ", _MAGIC, _VERSION, cycle)
        block = body + struct.pack("<I", crc32c.crc32c(body))
        self._ensure_allocated(_HEADER_BLOCK_BYTES)
        if os.pwrite(self._fd, block, 0) != len(block):
            raise OSError("short write of the journal header")
        os.fdatasync(self._fd)
        self.cycle = cycle

    # --- replay ------------------------------------------------------------------------

    def entries(self) -> Iterator[JournalEntry]:
        """The entries of the current cycle, in write order, up to the first invalid one.

        Leaves :attr:`write_pos` after the last valid entry, so appends continue there.
        """
        size = os.fstat(self._fd).st_size
        pos = _HEADER_BLOCK_BYTES
        while pos + _ENTRY.size <= size:
            head = os.pread(self._fd, _ENTRY.size, pos)
            crc, body_bytes, cycle, shard, kind = _ENTRY.unpack(head)
            if cycle != self.cycle or kind not in (ENTRY_FRAME, ENTRY_ROWS, ENTRY_ROWS_PRODUCER):
                break
            end = pos + _ENTRY.size + body_bytes
            if end > size:
                break
            body = os.pread(self._fd, body_bytes, pos + _ENTRY.size)
            if crc32c.crc32c(body, crc32c.crc32c(head[_ENTRY_CRC_START:])) != crc:
                break
            pos = end + (-end & 7)
            self.write_pos = pos
            yield JournalEntry(kind, shard, memoryview(body))

    # --- writing -----------------------------------------------------------------------

    def fits(self, nbytes: int) -> bool:
        """Whether entries of ``nbytes`` (from :meth:`entry_bytes`) fit before recycling."""
        return self.write_pos + nbytes <= self.journal_bytes or self.write_pos == _HEADER_BLOCK_BYTES

    @staticmethod
    def entry_bytes(body_bytes: int) -> int:
        """Bytes an entry with a body of ``body_bytes`` takes, padding included."""
        n = _ENTRY.size + body_bytes
        return n + (-n & 7)

    def append(self, entries: Sequence[tuple[int, int, Sequence[Any]]]) -> int:
        """Write entries ``(kind, shard, body buffers)`` at the write position (no sync).

        Returns:
            The write position before them, for :meth:`discard_from`.

        Raises:
            OSError: The write failed; the caller discards from the returned position.
        """
        start = self.write_pos
        buffers: list[Any] = []
        pos = start
        for kind, shard, body in entries:
            views = [memoryview(b).cast("B") for b in body]
            body_bytes = sum(len(v) for v in views)
            head_rest = _ENTRY.pack(0, body_bytes, self.cycle, shard, kind)[_ENTRY_CRC_START:]
            crc = crc32c.crc32c(head_rest)
            for v in views:
                crc = crc32c.crc32c(v, crc)
            buffers.append(struct.pack("<I", crc) + head_rest)
            buffers.extend(views)
            n = _ENTRY.size + body_bytes
            if -n & 7:
                buffers.append(_PAD[-n & 7])
            pos += n + (-n & 7)
        self._ensure_allocated(pos)
        pwritev_all(self._fd, buffers, start)
        self.write_pos = pos
        return start

    def discard_from(self, pos: int) -> None:
        """Forget entries written at ``pos`` and after (their write or sync failed).

        The entry header at ``pos`` is zeroed and synced so a replay never finds them.

        Raises:
            OSError: The zeroing failed; entries past ``pos`` may still replay.
        """
        self.write_pos = pos
        os.pwrite(self._fd, bytes(_ENTRY.size), pos)
        os.fdatasync(self._fd)

    def sync(self) -> None:
        """fdatasync the journal (timed for the fsync observers: the drain's one sync)."""
        fdatasync(self._fd)

    def recycle(self) -> None:
        """Start a new cycle: every entry so far is checkpointed and will not be replayed.

        The caller has made every shard's segment durable first.
        """
        self._write_header(self.cycle + 1)
        self.write_pos = _HEADER_BLOCK_BYTES

    @property
    def empty(self) -> bool:
        """Whether the current cycle has no entries."""
        return self.write_pos == _HEADER_BLOCK_BYTES

    def _ensure_allocated(self, end: int) -> None:
        # Zeros written (not fallocate's unwritten extents): an overwrite then changes no metadata.
        if end <= self.allocated:
            return
        step = min(max(self.allocated, _MIN_GROW_BYTES), _MAX_GROW_BYTES)
        target = max(end, min(self.allocated + step, max(self.journal_bytes, end)))
        target += -target & 4095
        pos = self.allocated
        while pos < target:
            n = os.pwrite(self._fd, _ZEROS[: min(len(_ZEROS), target - pos)], pos)
            pos += n
        os.fdatasync(self._fd)
        self.allocated = target

    def close(self) -> None:
        """Close the file; idempotent."""
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
