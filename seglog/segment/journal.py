"""The write-ahead journal of one I/O worker of one database: one fdatasync per drain.

A worker serves many shards. Syncing each touched shard's segment after every drain made
durable throughput fall with the number of shards (one ``fdatasync`` each). Instead the
worker appends everything a drain wrote to this one file and syncs it once; the shards'
segment files are written to the page cache and synced at a checkpoint (when the journal is
full, at close, at a segment roll; :mod:`seglog.segment.writeback` syncs them in the background
ahead of it, so the checkpoint finds little left to write). This is BookKeeper's journal /
RocksDB's WAL.

Layout: a header block, then entries back to back (each padded to 8 bytes)::

    block 0:  magic "SGLJ" | version u32 | cycle u64 | crc32c u32      (rest zero)
    entry:    crc32c u32 | body_bytes u32 | cycle u64 | shard u32 | kind u8 | 3 pad | body
              (``shard`` of a rows entry: the leader epoch its rows are stamped with)

The ``crc`` of an entry covers the rest of its header and its body. Recycling starts a new
``cycle`` by rewriting the header: entries of older cycles left beyond the write position no
longer match and end the replay, so the file is reused without truncating or zeroing it.

The file is zero-filled ahead of the write position, so an ordinary entry is an overwrite of
allocated blocks and its ``fdatasync`` journals no size or extent change; after the first cycle
the whole file is allocated and writes never grow it. The zero-fill runs off the drain: after
a drain, :meth:`Journal.grow_ahead` hands the journal to its :class:`JournalGrower` when the
room ahead falls below half of what it should be (the bytes written this cycle, 1-16 MiB: the
doubling of the old in-drain steps); the grower's thread writes zeros in 1 MiB chunks, each
followed by an fdatasync, on a descriptor of its own (a sync error it consumes must not hide
one from the drain's descriptor), and publishes :attr:`Journal.allocated` under the journal's
lock. A drain that outruns it (or a journal without a grower) zero-fills synchronously, as
before: counted in :attr:`Journal.sync_grow_count`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final, NamedTuple

import crc32c

from seglog._fs import fdatasync, fsync_dir, pwritev_all
from seglog.segment._on_demand import OnDemandThread

__all__ = [
    "DEFAULT_JOURNAL_BYTES",
    "ENTRY_FRAME",
    "ENTRY_ROWS",
    "ENTRY_ROWS_PRODUCER",
    "Journal",
    "JournalEntry",
    "JournalGrower",
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
# Background growth writes and syncs this much at a time: a drain's fdatasync that runs
# meanwhile carries at most one chunk of dirty zeros, and close waits for at most one chunk.
_GROW_CHUNK_BYTES: Final = 1 << 20
# After a failed background growth (ENOSPC, EIO) the next is not tried for this long; drains
# that outrun the grower meanwhile grow synchronously and report their own errors.
_GROW_RETRY_S: Final = 1.0
_ZEROS: Final = memoryview(bytes(_GROW_CHUNK_BYTES))
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
        grower: Zero-fills ahead of the write position off the drain (``None``: every growth
            is synchronous, in the append that needs it).

    Attributes:
        allocated: Bytes zero-filled (or written) and synced from the start of the file.
        sync_grow_count: Growths done synchronously by :meth:`append` (inside a drain).
        sync_grow_bytes: Bytes those growths zero-filled.
    """

    def __init__(
        self,
        path: Path,
        *,
        journal_bytes: int = DEFAULT_JOURNAL_BYTES,
        grower: JournalGrower | None = None,
    ) -> None:
        self.path = path
        self.journal_bytes = journal_bytes
        self.sync_grow_count = 0
        self.sync_grow_bytes = 0
        self._grower = grower
        # Held while ``allocated`` moves and zeros are written past it (grower or drain).
        self._grow_lock = threading.Lock()
        self._grow_fd = -1  # the grower's own descriptor, open while it grows this journal
        self._grow_target = 0  # how far the grower should zero-fill (set by the worker)
        self._grow_failed_at: float | None = None
        # The whole journal, rounded to blocks: background growth stops there.
        self._cap = journal_bytes + (-journal_bytes & 4095)
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
        if self.allocated < _HEADER_BLOCK_BYTES:  # a new file: its first allocation (no drain)
            with self._grow_lock:
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
        if pos > self.allocated:  # the grower is behind (or absent): zero-fill here
            self._grow_sync(pos)
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

    def grow_ahead(self) -> None:
        """(Worker, after a drain) Have the grower zero-fill ahead if the room is running out.

        The room wanted ahead is the bytes written this cycle (at least 1 MiB, at most
        16 MiB, the old doubling steps); the grower is asked when less than half of it is
        left, so it stays ahead of drains that write up to that much in its time.
        """
        grower = self._grower
        if grower is None or self.allocated >= self._cap:
            return
        want = min(max(self.write_pos, _MIN_GROW_BYTES), _MAX_GROW_BYTES)
        if self.allocated - self.write_pos >= want // 2:
            return
        failed = self._grow_failed_at
        if failed is not None and time.monotonic() < failed + _GROW_RETRY_S:
            return
        target = self.write_pos + want
        target = min(self._cap, target + (-target & (_GROW_CHUNK_BYTES - 1)))
        if target > self._grow_target:
            self._grow_target = target
            grower.request(self)

    def _grow_step(self) -> bool:
        """(Grower) Zero-fill and sync the next chunk towards the target.

        Returns:
            Whether more is left to grow.
        """
        with self._grow_lock:
            start = self.allocated
            end = min(self._grow_target, start + _GROW_CHUNK_BYTES)
            if self._fd < 0 or end <= start:
                self._close_grow_fd()
                return False
            try:
                if self._grow_fd < 0:
                    # Not a dup: a writeback error is reported once per open file, and the
                    # drain's fdatasync must still see the errors of its own pages.
                    self._grow_fd = os.open(self.path, os.O_WRONLY)
                pos = start
                while pos < end:
                    pos += os.pwrite(self._grow_fd, _ZEROS[: end - pos], pos)
                os.fdatasync(self._grow_fd)
            except OSError as exc:
                self._close_grow_fd()
                self._grow_target = self.allocated
                if self._grow_failed_at is None:
                    log.warning(
                        "%s: growing the journal ahead failed (%s); drains grow it themselves", self.path, exc
                    )
                self._grow_failed_at = time.monotonic()
                return False
            self._grow_failed_at = None
            self.allocated = end
            if end < self._grow_target:
                return True
            self._close_grow_fd()
            return False

    def _close_grow_fd(self) -> None:
        if self._grow_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._grow_fd)
            self._grow_fd = -1

    def _grow_sync(self, end: int) -> None:
        """(Worker) Zero-fill up to ``end`` now, in the append that needs it (counted)."""
        with self._grow_lock:  # waits for a chunk the grower is writing: at most 1 MiB
            before = self.allocated
            if end <= before:
                return
            if self._grower is None:
                self._ensure_allocated(end)
            else:
                # Only what this drain needs, to the next chunk: the grower does the rest.
                target = end + (-end & (_GROW_CHUNK_BYTES - 1))
                self._zero_fill(max(end + (-end & 4095), min(target, self._cap)))
            self.sync_grow_count += 1
            self.sync_grow_bytes += self.allocated - before

    def _ensure_allocated(self, end: int) -> None:
        # Zeros written (not fallocate's unwritten extents): an overwrite then changes no metadata.
        if end <= self.allocated:
            return
        step = min(max(self.allocated, _MIN_GROW_BYTES), _MAX_GROW_BYTES)
        target = max(end, min(self.allocated + step, max(self.journal_bytes, end)))
        self._zero_fill(target + (-target & 4095))

    def _zero_fill(self, target: int) -> None:
        pos = self.allocated
        while pos < target:
            n = os.pwrite(self._fd, _ZEROS[: min(len(_ZEROS), target - pos)], pos)
            pos += n
        os.fdatasync(self._fd)
        self.allocated = target

    def close(self) -> None:
        """Close the file (after a chunk the grower is writing); idempotent."""
        with self._grow_lock:
            self._close_grow_fd()
            if self._fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                self._fd = -1


class JournalGrower(OnDemandThread[Journal]):
    """Zero-fills journals ahead of their write positions, on a thread of its own.

    One per engine: the thread runs only while some journal has growth to do (started by
    :meth:`request`, gone when none is left), so idle journals cost no thread. Journals take
    turns a chunk at a time.

    Args:
        name: The thread's name.
    """

    def __init__(self, name: str = "seglog-journal-grow") -> None:
        super().__init__(name)

    def request(self, journal: Journal) -> None:
        """Grow ``journal`` to its target in the background (no-op once closed)."""
        self._enqueue((journal,))

    def _serve(self, journal: Journal) -> bool:
        try:
            return journal._grow_step()
        except Exception:  # never let the thread die with the flag saying it runs
            log.exception("%s: growing the journal failed", journal.path)
            return False
