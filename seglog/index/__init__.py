"""Sparse LMDB indexes: offset, time, key and tag (stream); rebuilt from segments when lost."""

from seglog.index.shard_index import (
    DEFAULT_INDEX_INTERVAL_BYTES,
    FrameEntry,
    IndexPosition,
    ShardIndex,
)

__all__ = ["DEFAULT_INDEX_INTERVAL_BYTES", "FrameEntry", "IndexPosition", "ShardIndex"]
