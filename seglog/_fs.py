"""Small filesystem helpers with the fsync discipline every layer needs."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Final

__all__ = [
    "TMP_PREFIX",
    "add_fsync_observer",
    "atomic_write",
    "atomic_writer",
    "boot_id",
    "fdatasync",
    "fsync_dir",
    "makedirs_durable",
    "pwritev_all",
    "remove_fsync_observer",
]

_BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
# Linux's IOV_MAX: one pwritev takes at most this many buffers.
_IOV_MAX: Final = 1024
TMP_PREFIX: Final = ".tmp-"
"""Unique temp files start with this (a dot, so Spark and Hadoop ignore them)."""


# Callbacks given the seconds of each write-path fdatasync (a node's fsync latency metric).
# A tuple, replaced on change: the I/O worker threads read it without a lock.
_fsync_observers: tuple[Callable[[float], None], ...] = ()


def add_fsync_observer(observer: Callable[[float], None]) -> None:
    """Call ``observer(seconds)`` after every :func:`fdatasync` (from I/O worker threads)."""
    global _fsync_observers
    _fsync_observers = (*_fsync_observers, observer)


def remove_fsync_observer(observer: Callable[[float], None]) -> None:
    """Stop calling ``observer`` (one registration of it)."""
    global _fsync_observers
    observers = list(_fsync_observers)
    with contextlib.suppress(ValueError):
        observers.remove(observer)
    _fsync_observers = tuple(observers)


def fdatasync(fd: int) -> None:
    """``os.fdatasync``, timed for the observers when there are any (one call per drain, not per record)."""
    observers = _fsync_observers
    if not observers:
        os.fdatasync(fd)
        return
    start = time.perf_counter()
    os.fdatasync(fd)
    seconds = time.perf_counter() - start
    for observer in observers:
        observer(seconds)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory so that entries created, renamed or removed in it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def makedirs_durable(path: Path) -> None:
    """Create ``path`` and missing parents, fsyncing each parent of a new directory."""
    missing: list[Path] = []
    cur = path
    while not cur.exists():
        missing.append(cur)
        if cur.parent == cur:
            break
        cur = cur.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            directory.mkdir()
        fsync_dir(directory.parent)


@contextlib.contextmanager
def atomic_writer(
    path: str | os.PathLike[str], *, tmp_name: str | None = None, make_parents: bool = False
) -> Iterator[BinaryIO]:
    """Yield a file whose content replaces ``path`` atomically and durably on success.

    The one implementation of the rule: the data goes to a temp file in the same directory,
    which is fsynced, renamed over ``path``, and the directory fsynced. On error the temp
    file is removed and ``path`` is untouched.

    Args:
        path: The file to replace.
        tmp_name: A fixed name for the temp file, opened with ``O_TRUNC`` (so one left by a
            crash is reused). By default the name is unique (``TMP_PREFIX`` + name + a random
            suffix) and created exclusively.
        make_parents: Create missing parent directories first (durably).
    """
    target = Path(path)
    if make_parents:
        makedirs_durable(target.parent)
    if tmp_name is None:
        tmp = target.with_name(f"{TMP_PREFIX}{target.name}.{uuid.uuid4().hex}")
        flags = os.O_EXCL
    else:
        tmp = target.with_name(tmp_name)
        flags = os.O_TRUNC
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | flags, 0o644), "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(target.parent)


def atomic_write(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace ``path`` with ``data`` durably (see :func:`atomic_writer`).

    The temp file is ``<name>.tmp``: ``ShardLog`` removes stale ``*.tmp`` files at open.
    """
    with atomic_writer(path, tmp_name=Path(path).name + ".tmp") as f:
        f.write(data)


def boot_id() -> str:
    """This boot of the machine (Linux ``boot_id``); ``"unknown"`` where it cannot be read.

    Page-cache writes survive a process crash but not a machine restart, so state written
    without fsync is trusted only by the same boot that wrote it.
    """
    try:
        return _BOOT_ID_PATH.read_text().strip()
    except OSError:
        return "unknown"


def pwritev_all(fd: int, buffers: Sequence[Any], pos: int) -> int:
    """Write every buffer at ``pos`` with as few ``pwritev`` calls as possible; return the end.

    Partial writes (e.g. a disk nearly full) are continued until everything is written or a
    call raises.

    Raises:
        OSError: A write failed; some of the bytes may have been written.
    """
    for i in range(0, len(buffers), _IOV_MAX):
        chunk = [memoryview(b).cast("B") for b in buffers[i : i + _IOV_MAX]]
        want = sum(len(b) for b in chunk)
        while want:
            written = os.pwritev(fd, chunk, pos)
            pos += written
            want -= written
            if want:
                chunk = _drop_prefix(chunk, written)
    return pos


def _drop_prefix(chunk: list[memoryview], nbytes: int) -> list[memoryview]:
    out: list[memoryview] = []
    for b in chunk:
        if nbytes >= len(b):
            nbytes -= len(b)
            continue
        out.append(b[nbytes:])
        nbytes = 0
    return out
