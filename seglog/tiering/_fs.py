"""Crash-safe local file helpers: temp file + fsync + rename + directory fsync."""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, BinaryIO

from seglog._fs import fsync_dir

__all__ = ["TMP_PREFIX", "atomic_write", "copy_and_hash", "fsync_dir", "makedirs_durable"]

TMP_PREFIX = ".tmp-"
"""Temporary files start with this (a dot, so Spark and Hadoop ignore them)."""

COPY_CHUNK_BYTES = 1 << 20


def makedirs_durable(path: Path) -> None:
    """Creates ``path`` and missing parents, fsyncing each parent of a new directory."""
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


def copy_and_hash(src: IO[bytes], dst: IO[bytes]) -> tuple[int, str]:
    """Copies ``src`` to ``dst``; returns (bytes copied, sha256 hex)."""
    digest = hashlib.sha256()
    size = 0
    while chunk := src.read(COPY_CHUNK_BYTES):
        digest.update(chunk)
        dst.write(chunk)
        size += len(chunk)
    return size, digest.hexdigest()


@contextlib.contextmanager
def atomic_write(path: Path) -> Iterator[BinaryIO]:
    """Yields a file whose content replaces ``path`` atomically and durably on success.

    The data goes to a temp file in the same directory, which is fsynced, renamed over
    ``path``, and the directory fsynced. On error the temp file is removed and ``path`` is
    untouched. Parent directories are created (durably) if missing.
    """
    makedirs_durable(path.parent)
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}.{uuid.uuid4().hex}")
    try:
        with open(tmp, "xb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)
