"""Reading an ``lmdb``-engine database's offsets from outside the process that owns it.

The :data:`~seglog.engines.registry.ReadShardFiles` of the lmdb engine, for ``seglog stats``:
the environment is opened read-only (LMDB's own lock file makes that safe beside the
owner's writes). An lmdb database cannot be followed from another process yet (its factory
has no ``open_reader``).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Final

import lmdb

from seglog.engines.base import ShardFiles
from seglog.engines.lmdb_engine import FRAMES_DIR
from seglog.errors import StorageError
from seglog.record import parse_header

__all__ = ["lmdb_shard_files"]

_U64: Final = struct.Struct(">Q")


def _shard_offsets(path: Path, shards: int) -> list[tuple[int, int]]:
    """(start, end) per shard, from the environment at ``path`` (read-only)."""
    try:
        env = lmdb.open(str(path), readonly=True, lock=True, max_dbs=2 * shards + 1, subdir=True)
    except lmdb.Error as exc:
        raise StorageError(f"cannot open LMDB environment {path} read-only") from exc
    out = []
    try:
        with env.begin(buffers=True) as txn:
            meta = env.open_db(b"meta", txn=txn, create=False)
            for n in range(shards):
                raw = txn.get(b"start:%d" % n, db=meta)
                start = _U64.unpack(bytes(raw))[0] if raw is not None else 0
                end = start
                try:
                    frames = env.open_db(b"f%d" % n, txn=txn, create=False)
                except lmdb.NotFoundError:
                    frames = None
                if frames is not None:
                    cursor = txn.cursor(db=frames)
                    if cursor.last():
                        end = max(end, parse_header(bytes(cursor.value()), 0).next_offset)
                out.append((start, end))
    except lmdb.Error as exc:
        raise StorageError(f"cannot read LMDB environment {path}") from exc
    finally:
        env.close()
    return out


def lmdb_shard_files(directory: Path, shards: int) -> list[ShardFiles]:
    """Offsets per shard; the environment's data file counts as shard 0's ``other_bytes``.

    One environment holds every shard, so its size cannot be split per shard.
    """
    path = directory / FRAMES_DIR
    data_file = path / "data.mdb"
    env_bytes = data_file.stat().st_size if data_file.is_file() else 0
    offsets = _shard_offsets(path, shards) if path.is_dir() else [(0, 0)] * shards
    return [ShardFiles(start, end, (), env_bytes if n == 0 else 0) for n, (start, end) in enumerate(offsets)]
