"""Small filesystem helpers with the fsync discipline every layer needs."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["atomic_write", "boot_id", "fsync_dir"]

_BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")


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
