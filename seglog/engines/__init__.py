"""Storage engines behind one protocol: ``segment`` (default), ``memory``, ``lmdb``.

Importing this package registers the three engines in :mod:`seglog.engines.registry`;
the DB layer opens them by name from there and never imports them itself.
"""

from __future__ import annotations

from seglog.engines.base import Engine, EngineConfig, FsyncPolicy, ShardStats
from seglog.engines.lmdb_engine import LmdbEngine
from seglog.engines.memory import MemoryEngine
from seglog.engines.registry import EngineFactory, engine_names, get_engine, register_engine
from seglog.engines.segment import SegmentEngine

__all__ = ["Engine", "EngineConfig", "EngineFactory", "FsyncPolicy", "ShardStats", "engine_names", "get_engine"]

# "segment" first: it is the default and is listed first in error messages.
register_engine(EngineFactory("segment", SegmentEngine.open_blocking, SegmentEngine.measure_bytes, tiering=True))
register_engine(EngineFactory("memory", MemoryEngine.open_blocking, MemoryEngine.measure_bytes))
register_engine(EngineFactory("lmdb", LmdbEngine.open_blocking, LmdbEngine.measure_bytes))
