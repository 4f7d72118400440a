"""Small filesystem helpers with the fsync discipline every layer needs."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

__all__ = ["atomic_write", "boot_id", "fsync_dir", "pwritev_all"]

_BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
# Linux's IOV_MAX: one pwritev takes at most this many buffers.
_IOV_MAX: Final = 1024


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory so that entries created, renamed or removed in it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace ``path`` with ``data`` durably: temp file, fsync, rename, fsync directory."""
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, target)
    fsync_dir(target.parent)


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
