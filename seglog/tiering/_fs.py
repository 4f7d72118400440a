"""Local file helpers of the tiering layer.

Atomic replacement (temp file + fsync + rename + directory fsync) is
:func:`seglog._fs.atomic_writer`, shared with the rest of the package.
"""

from __future__ import annotations

import hashlib
from typing import IO

__all__ = ["copy_and_hash"]

COPY_CHUNK_BYTES = 1 << 20


def copy_and_hash(src: IO[bytes], dst: IO[bytes]) -> tuple[int, str]:
    """Copies ``src`` to ``dst``; returns (bytes copied, sha256 hex)."""
    digest = hashlib.sha256()
    size = 0
    while chunk := src.read(COPY_CHUNK_BYTES):
        digest.update(chunk)
        dst.write(chunk)
        size += len(chunk)
    return size, digest.hexdigest()
