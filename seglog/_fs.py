"""Small filesystem helpers with the fsync discipline every layer needs."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Final

__all__ = [
    "TMP_PREFIX",
    "atomic_write",
    "atomic_writer",
    "boot_id",
    "fsync_dir",
    "makedirs_durable",
    "pwritev_all",
]

_BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
# Linux's IOV_MAX: one pwritev takes at most this many buffers.
_IOV_MAX: Final = 1024
TMP_PREFIX: Final = ".tmp-"
"""Unique temp files start with this (a dot, so Spark and Hadoop ignore them)."""


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
