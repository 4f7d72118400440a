"""Sparse LMDB indexes: offset, time, key and tag (stream); rebuilt from segments when lost.

One LMDB environment per database (:class:`DbIndex`) holds every shard's indexes; each
shard reads and writes its own key range through a :class:`ShardIndex` view.
"""

from seglog.index.db_index import INDEX_DIR, DbIndex
from seglog.index.keys import MAX_INLINE_KEY_BYTES
from seglog.index.shard_index import (
    DEFAULT_INDEX_INTERVAL_BYTES,
    FrameEntry,
    IndexPosition,
    ShardIndex,
)

__all__ = [
    "DEFAULT_INDEX_INTERVAL_BYTES",
    "INDEX_DIR",
    "MAX_INLINE_KEY_BYTES",
    "DbIndex",
    "FrameEntry",
    "IndexPosition",
    "ShardIndex",
]
