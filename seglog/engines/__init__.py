"""Storage engines behind one protocol: ``segment`` (default), ``memory``, ``lmdb``."""

from seglog.engines.base import Engine, EngineConfig, FsyncPolicy, ShardStats

__all__ = ["Engine", "EngineConfig", "FsyncPolicy", "ShardStats"]
