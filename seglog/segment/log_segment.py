"""One segment file: an append-only run of frames named by its base offset."""

from __future__ import annotations

import contextlib
import enum
import mmap
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from seglog._fs import fdatasync, fsync_dir, pwritev_all
from seglog.errors import CorruptFrame
from seglog.record import FrameHeader, parse_header
from seglog.segment.fd_cache import CachedFile

__all__ = ["SEGMENT_SUFFIX", "LogSegment", "SegmentState", "segment_name"]

SEGMENT_SUFFIX: Final = ".log"


def segment_name(base_offset: int) -> str:
    """File name of the segment starting at ``base_offset``."""
    return f"{base_offset:020d}{SEGMENT_SUFFIX}"


class SegmentState(enum.StrEnum):
    """Whether a segment still takes appends."""

    ACTIVE = "active"
    SEALED = "sealed"


class LogSegment:
    """A segment file; appended by one I/O worker, read by any thread through ``mmap``.

    Attributes:
        base_offset: Offset of the first record the segment holds (or will hold).
        size: Bytes of valid frames (the append position).
        sealed: Sealed segments are fsynced, read-only and never appended again.
        next_offset: Offset after the last record of the segment.
        max_ts: Largest record timestamp in the segment (``None`` while empty).
        created_ms: Clock time of creation, for ``segment_ms`` rolling.
    """

    def __init__(self, path: Path, base_offset: int, fd: int, size: int, *, sealed: bool) -> None:
        self.path = path
        self.base_offset = base_offset
        self.next_offset = base_offset
        self.max_ts: int | None = None
        self.size = size
        self.sealed = sealed
        self.created_ms = 0
        self._map: mmap.mmap | None = None
        self._retired = False
        # The descriptor comes and goes with the process-wide LRU (fd_cache); the read mapping
        # (which holds a descriptor of its own) is let go with it, unless retired.
        self._file = CachedFile(path, os.O_RDONLY if sealed else os.O_RDWR, fd=fd, on_evict=self._evicted)

    def _evicted(self) -> None:
        if not self._retired:
            self._map = None

    # --- lifecycle ---------------------------------------------------------------------

    @classmethod
    def create(cls, directory: Path, base_offset: int) -> LogSegment:
        """Create a new empty active segment (durably: the directory is fsynced)."""
        path = directory / segment_name(base_offset)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            fsync_dir(directory)
        except OSError:
            os.close(fd)  # a leaked descriptor would keep a dead filesystem mounted
            with contextlib.suppress(OSError):
                path.unlink()
            raise
        return cls(path, base_offset, fd, 0, sealed=False)

    @classmethod
    def open(cls, path: Path, *, sealed: bool) -> LogSegment:
        """Open an existing segment file; the caller recovers or trusts its content."""
        base = int(path.name[: -len(SEGMENT_SUFFIX)])
        if not sealed:
            # A segment sealed by an earlier run is read-only; reopening it as the active
            # segment (after a crash right after a roll) needs write access back.
            mode = os.stat(path).st_mode
            if not mode & stat.S_IWUSR:
                os.chmod(path, mode | stat.S_IWUSR)
        size = os.stat(path).st_size
        return cls(path, base, -1, size, sealed=sealed)

    def close(self) -> None:
        """Close the file descriptor. Views handed out stay valid until dropped."""
        self._file.close()
        # The mapping is left to the GC: Arrow buffers may still point into it.
        self._map = None

    def delete(self) -> None:
        """Close and unlink the file (readers holding views keep their pages)."""
        self.close()
        self.path.unlink(missing_ok=True)

    def replace_with_prefix(self, size: int) -> LogSegment:
        """A new active segment holding this one's first ``size`` bytes, renamed over it durably.

        Used by truncation instead of ``ftruncate``: readers in this process may hold
        zero-copy views of the bytes that go, and pages cut from under a mapping fault
        (SIGBUS). This object keeps its mapping for them (:meth:`detach`).
        """
        tmp = self.path.with_name(self.path.name + ".tmp")
        out = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            with self._file.fd() as src:
                done = 0
                while done < size:
                    n = os.copy_file_range(src, out, size - done, done, done)
                    if n <= 0:
                        raise OSError(f"short copy of {self.path.name} at {done} of {size} bytes")
                    done += n
            os.fsync(out)
            os.replace(tmp, self.path)
            fsync_dir(self.path.parent)
        except BaseException:
            os.close(out)
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        new = LogSegment(self.path, self.base_offset, out, size, sealed=False)
        self.detach()
        return new

    def detach(self) -> None:
        """Let go of the file but stay readable through the mapping (its name now holds another file)."""
        if self.size:
            mapped = self._map
            if mapped is None or len(mapped) < self.size:
                self._remap(self.size)
        self._retired = True
        self._file.close()

    def retire(self) -> None:
        """Unlink the file but keep it readable: readers holding this object still work."""
        if self.size:
            mapped = self._map
            if mapped is None or len(mapped) < self.size:
                self._remap(self.size)
        self._retired = True  # the mapping (its own descriptor) now outlives the file's name
        self._file.close()
        self.path.unlink(missing_ok=True)

    def largest_ts(self) -> int | None:
        """:attr:`max_ts`, scanning frame headers when it is not known yet (trusted segments)."""
        if self.max_ts is None and self.size:
            for _pos, header in self.headers():
                if self.max_ts is None or header.max_ts > self.max_ts:
                    self.max_ts = header.max_ts
        return self.max_ts

    # --- writing -----------------------------------------------------------------------

    def append(self, buffers: list[object]) -> int:
        """Write ``buffers`` at the end with as few ``pwritev`` calls as possible.

        Returns:
            The file position the first buffer was written at.

        Raises:
            OSError: The write failed; the file is cut back to where it was.
        """
        start = self.size
        with self._file.fd() as fd:
            try:
                pos = pwritev_all(fd, buffers, start)
            except OSError:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, start)
                raise
        self.size = pos
        return start

    def sync(self) -> None:
        """fdatasync the file (any descriptor of it flushes the inode's dirty pages)."""
        with self._file.fd() as fd:
            fdatasync(fd)

    def truncate(self, size: int) -> None:
        """Cut the file to ``size`` bytes, durably."""
        with self._file.fd() as fd:
            os.ftruncate(fd, size)
            os.fsync(fd)
        self.size = size
        self._map = None

    def seal(self) -> None:
        """fsync and make the file read-only; it is never appended again."""
        with self._file.fd() as fd:
            os.fdatasync(fd)
            os.fchmod(fd, 0o444)
        self.sealed = True
        self._file.set_flags(os.O_RDONLY)

    def unseal(self) -> None:
        """Make a segment sealed by this process writable again (a failed append rolls back)."""
        self._file.set_flags(os.O_RDWR)
        with self._file.fd() as fd:
            os.fchmod(fd, 0o644)
        self.sealed = False

    @property
    def state(self) -> SegmentState:
        """:attr:`SegmentState.SEALED` once :meth:`seal` ran, else :attr:`SegmentState.ACTIVE`."""
        return SegmentState.SEALED if self.sealed else SegmentState.ACTIVE

    # --- reading -----------------------------------------------------------------------

    def view(self, start: int, end: int) -> memoryview:
        """A zero-copy view of bytes ``[start, end)`` (``end`` at most :attr:`size`)."""
        mapped = self._map
        if mapped is None or len(mapped) < end:
            mapped = self._remap(end)
        return memoryview(mapped)[start:end]

    def read(self, start: int, end: int) -> bytes:
        """A copy of bytes ``[start, end)`` read with ``pread``, not through the mapping.

        For the newest bytes of a growing file: a view past the mapping would map the file
        again (an mmap and, once the old mapping is dropped, an munmap per read).

        Raises:
            OSError: The read failed or came back short.
        """
        with self._file.fd() as fd:
            data = os.pread(fd, end - start, start)
        if len(data) != end - start:
            raise OSError(f"{self.path.name}: short read at {start} ({len(data)} of {end - start} bytes)")
        return data

    def _remap(self, end: int) -> mmap.mmap:
        length = max(end, self.size)
        with self._file.fd() as fd:
            mapped = mmap.mmap(fd, length, prot=mmap.PROT_READ)
            self._map = mapped
        return mapped

    def headers(self, start: int = 0, end: int | None = None) -> Iterator[tuple[int, FrameHeader]]:
        """Yield ``(position, header)`` of the frames in ``[start, end)`` without decoding bodies.

        Raises:
            CorruptFrame: A header in the range is invalid.
        """
        limit = self.size if end is None else end
        if start >= limit:
            return
        buf = self.view(0, limit)
        pos = start
        while pos < limit:
            header = parse_header(buf, pos)
            yield pos, header
            pos += header.size
        if pos != limit:
            raise CorruptFrame(f"{self.path}: last frame runs past position {limit}")

    def __repr__(self) -> str:
        return f"<LogSegment {self.path.name} {self.state} size={self.size}>"
