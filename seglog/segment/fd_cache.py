"""Descriptors of segment and marker files, opened on demand and kept in one bounded LRU.

A store with 10,000 shards would otherwise hold an active segment and a durable-end marker
open per shard (20,000 descriptors against a default ``ulimit -n`` of 1024). Every
:class:`CachedFile` opens its descriptor when an operation needs it and leaves it in a
process-wide LRU of at most :data:`OPEN_FILES_MAX` descriptors; an operation pins its
descriptor, so eviction (closing the least recently used unpinned one) never closes a
descriptor another thread is using.

Closing and reopening a file between a write and its ``fdatasync`` is safe on Linux: the
dirty pages belong to the inode, and ``fdatasync`` on any descriptor of it flushes them (an
error of an earlier writeback is reported to every descriptor open since, and to one opened
later only if no descriptor saw it: segment writes report their own errors through their
``pwritev``).
"""

from __future__ import annotations

import contextlib
import os
import resource
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Final

__all__ = ["OPEN_FILES_MAX", "CachedFile", "DescriptorCache", "descriptors"]


def _capacity_for_limit() -> int:
    """A quarter of the process's descriptor limit, between 256 and 4096: a store of 1024
    shards (two files each) then keeps its descriptors open where the limit allows, and
    stays within the default ``ulimit -n`` of 1024 otherwise."""
    try:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return 256
    if soft == resource.RLIM_INFINITY:
        return 4096
    return max(256, min(4096, soft // 4))


# Descriptors the cache keeps open at most (each segment's read mapping holds one more while
# it is mapped: see LogSegment); read once, when seglog is imported.
OPEN_FILES_MAX: Final = _capacity_for_limit()


class DescriptorCache:
    """An LRU of open descriptors; thread-safe."""

    def __init__(self, capacity: int = OPEN_FILES_MAX) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._lock = threading.Lock()
        self._open: OrderedDict[CachedFile, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._open)

    def _admit(self, f: CachedFile) -> None:
        """(Lock held) ``f`` was just opened: make room for it, then track it."""
        excess = len(self._open) - self.capacity + 1
        if excess > 0:
            victims = []  # the least recently used unpinned ones (no copy of the whole LRU)
            for victim in self._open:
                if victim._pins == 0:
                    victims.append(victim)
                    if len(victims) == excess:
                        break
            for victim in victims:
                victim._drop_locked()
        self._open[f] = None

    def _touch(self, f: CachedFile) -> None:
        self._open.move_to_end(f)


_DEFAULT = DescriptorCache()


def descriptors() -> DescriptorCache:
    """The process-wide cache."""
    return _DEFAULT


class CachedFile:
    """One file whose descriptor lives in a :class:`DescriptorCache`.

    Args:
        path: The file.
        flags: ``os.open`` flags used when it is (re)opened (never ``O_CREAT``/``O_EXCL``:
            the file must exist; give an already open descriptor as ``fd`` on creation).
        fd: A descriptor already open on it (handed to the cache), or ``-1``.
        on_evict: Called (with the cache's lock held) when eviction closes the descriptor.
    """

    def __init__(
        self,
        path: Path,
        flags: int,
        *,
        fd: int = -1,
        cache: DescriptorCache | None = None,
        on_evict: Callable[[], None] | None = None,
    ) -> None:
        self.path = path
        self.flags = flags
        self._cache = cache if cache is not None else _DEFAULT
        self._fd = -1
        self._fd_flags = flags
        self._pins = 0
        self._closed = False
        self._on_evict = on_evict
        self._pinned = _Pinned(self)
        if fd >= 0:
            with self._cache._lock:
                self._fd = fd
                self._cache._admit(self)

    @property
    def is_open(self) -> bool:
        """Whether a descriptor is open now (tests and diagnostics)."""
        return self._fd >= 0

    def fd(self) -> _Pinned:
        """The descriptor, pinned (never evicted) while the ``with`` block runs.

        Raises (on entering the block):
            OSError: Reopening the file failed.
            ValueError: The file was closed.
        """
        return self._pinned

    def _pin(self) -> int:
        cache = self._cache
        with cache._lock:
            if self._closed:
                raise ValueError(f"{self.path} is closed")
            if (
                self._fd >= 0
                and self._pins == 0
                and self._fd_flags & os.O_ACCMODE != self.flags & os.O_ACCMODE
            ):
                self._drop_locked()  # opened read-only before the file became writable again
            if self._fd < 0:
                self._fd = os.open(self.path, self.flags)
                self._fd_flags = self.flags
                cache._admit(self)
            else:
                cache._touch(self)
            self._pins += 1
            return self._fd

    def _unpin(self) -> None:
        with self._cache._lock:
            self._pins -= 1

    def set_flags(self, flags: int) -> None:
        """Use ``flags`` from now on: a descriptor open with another access mode is reopened
        at its next unpinned use (a sealed segment reopens read-only, an unsealed one writable)."""
        self.flags = flags

    def _drop_locked(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
        self._cache._open.pop(self, None)
        if self._on_evict is not None:
            self._on_evict()

    def close(self) -> None:
        """Close the descriptor for good; idempotent.

        Raises:
            OSError: Closing the descriptor failed.
        """
        with self._cache._lock:
            self._closed = True
            fd, self._fd = self._fd, -1
            self._cache._open.pop(self, None)
        if fd >= 0:
            os.close(fd)


class _Pinned:
    """The context manager :meth:`CachedFile.fd` returns: pins the descriptor on entry and
    unpins it on exit. It holds no state of its own (the pin count is the file's), so one
    object per file serves every use, on any thread, nested too: a generator-based context
    manager cost twice as much, three times per shard per drain and per tailing read."""

    __slots__ = ("_file",)

    def __init__(self, file: CachedFile) -> None:
        self._file = file

    def __enter__(self) -> int:
        return self._file._pin()

    def __exit__(self, *exc: object) -> None:
        self._file._unpin()
