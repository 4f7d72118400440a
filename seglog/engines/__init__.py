"""Storage engines behind one protocol: ``segment`` (default), ``memory``, ``lmdb``.

Importing this package registers the three engines in :mod:`seglog.engines.registry`;
the DB layer opens them by name from there and never imports them itself.
"""

from __future__ import annotations

from pathlib import Path

from seglog.engines.base import Engine, EngineConfig, FsyncPolicy, ShardFiles, ShardStats
from seglog.engines.lmdb_engine import LmdbEngine
from seglog.engines.lmdb_reader import lmdb_shard_files
from seglog.engines.memory import MemoryEngine
from seglog.engines.registry import EngineFactory, engine_names, get_engine, register_engine
from seglog.engines.segment import SegmentEngine
from seglog.engines.segment_reader import open_segment_reader, segment_shard_files

__all__ = [
    "Engine",
    "EngineConfig",
    "EngineFactory",
    "FsyncPolicy",
    "ShardStats",
    "engine_names",
    "get_engine",
]


def _memory_shard_files(directory: Path, shards: int) -> list[ShardFiles]:
    """A memory database keeps its frames in the owner's RAM: every shard reads as empty."""
    del directory
    return [ShardFiles(0, 0)] * shards


# Only "segment" has an open_reader: memory's frames live in the owner's RAM, and lmdb
# cannot be followed across processes yet.
# "segment" first: it is the default and is listed first in error messages.
register_engine(
    EngineFactory(
        "segment",
        SegmentEngine.open_blocking,
        SegmentEngine.measure_bytes,
        segment_shard_files,
        open_reader=open_segment_reader,
        tiering=True,
    )
)
register_engine(
    EngineFactory("memory", MemoryEngine.open_blocking, MemoryEngine.measure_bytes, _memory_shard_files)
)
register_engine(EngineFactory("lmdb", LmdbEngine.open_blocking, LmdbEngine.measure_bytes, lmdb_shard_files))
