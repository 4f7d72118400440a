"""Types of the compiled ``(shard, topic) -> stream`` cache (``_topic_cache.c``)."""

from typing import Any, TypeAlias

import numpy as np
from typing_extensions import Buffer

# Integer buffers: NumPy arrays (C-contiguous, signed items of 1, 2, 4 or 8 bytes).
_Ints: TypeAlias = np.ndarray[Any, Any]

class TopicCache:
    """The ``(shard, topic bytes) -> stream`` cache; ``len()``: its entries."""

    def __init__(self, *, key_bits: int = 64) -> None: ...
    def __len__(self) -> int: ...
    def lookup(
        self,
        offsets: Buffer,
        data: Buffer,
        offset: int,
        length: int,
        width: int,
        shards: int | _Ints,
        streams: _Ints,
        miss_rows: _Ints,
        miss_keys: _Ints,
        /,
    ) -> int: ...
    def insert(
        self,
        offsets: Buffer,
        data: Buffer,
        offset: int,
        length: int,
        width: int,
        rows: _Ints,
        shards: _Ints,
        streams: _Ints,
        /,
    ) -> int: ...
    def drop(self, shard: int, first_stream: int, /) -> int: ...
    def clear(self) -> None: ...

def distinct_small(values: _Ints, out: _Ints, /) -> int: ...
