"""Stable shard routing: a 64-bit polynomial hash of the routing key's bytes.

``h = sum(b[i] * P**(n-1-i)) mod 2**64`` over the UTF-8 (topic) or raw (key) bytes, with
``P = 1099511628211`` (the FNV prime), then MurmurHash3's ``fmix64`` finaliser so that every
input bit reaches the low bits; shard = ``h % shards``. It is computed for a
whole Arrow column at once with numpy (no per-record Python), is independent of
``PYTHONHASHSEED`` and easy to reproduce in any language.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np
import pyarrow as pa

__all__ = ["ROUTING_PRIME", "route_rows", "routing_hash", "routing_hashes", "shard_for"]

ROUTING_PRIME: Final = 1099511628211
_MASK64: Final = (1 << 64) - 1
_POWERS_CACHE: list[np.ndarray[Any, np.dtype[np.uint64]]] = []


_FMIX1: Final = 0xFF51AFD7ED558CCD
_FMIX2: Final = 0xC4CEB9FE1A85EC53


def routing_hash(data: bytes) -> int:
    """The routing hash of one byte string."""
    h = 0
    for b in data:
        h = (h * ROUTING_PRIME + b) & _MASK64
    h ^= h >> 33
    h = (h * _FMIX1) & _MASK64
    h ^= h >> 33
    h = (h * _FMIX2) & _MASK64
    return h ^ (h >> 33)


def shard_for(data: bytes, shards: int) -> int:
    """The shard ``data`` (a key, or a topic's UTF-8 bytes) routes to."""
    return routing_hash(data) % shards


def _fmix(h: np.ndarray[Any, np.dtype[np.uint64]]) -> np.ndarray[Any, np.dtype[np.uint64]]:
    s33 = np.uint64(33)
    h = h ^ (h >> s33)
    h = h * np.uint64(_FMIX1)
    h = h ^ (h >> s33)
    h = h * np.uint64(_FMIX2)
    return h ^ (h >> s33)


def _powers(length: int) -> np.ndarray[Any, np.dtype[np.uint64]]:
    """``P**k mod 2**64`` for k in ``[0, length)``."""
    if not _POWERS_CACHE or len(_POWERS_CACHE[0]) < length:
        size = max(length, 1024)
        out = np.empty(size, np.uint64)
        acc = 1
        for k in range(size):
            out[k] = acc
            acc = (acc * ROUTING_PRIME) & _MASK64
        _POWERS_CACHE[:] = [out]
    return _POWERS_CACHE[0][:length]


def routing_hashes(column: pa.Array) -> np.ndarray[Any, np.dtype[np.uint64]]:
    """Routing hash of every value of a string or binary array (nulls hash as empty)."""
    n = len(column)
    if n == 0:
        return np.empty(0, np.uint64)
    if column.offset or column.type not in (pa.string(), pa.binary()):
        column = pa.concat_arrays([column.cast(pa.binary())])
    _validity, offsets_buf, data_buf = column.buffers()
    offsets = np.frombuffer(offsets_buf, np.int32, n + 1)
    lengths = np.diff(offsets)
    if data_buf is None or offsets[-1] == offsets[0]:
        return _fmix(np.zeros(n, np.uint64))
    width = int(lengths.max())
    data = np.frombuffer(data_buf, np.uint8, int(offsets[-1]))[offsets[0] :]
    if bool((lengths == width).all()):
        # Keys of one length (device ids, UUIDs): a matrix product row by row, no gathers.
        raw = data.reshape(n, width)
    elif n * width <= 4 * len(data) + 4096:
        # Keys of similar lengths: right-aligned in an n x width matrix (leading zero bytes add
        # nothing), so column j carries P**(width-1-j) for every row; one scatter, one product.
        raw = np.zeros((n, width), np.uint8)
        row_start = np.arange(n, dtype=np.int64) * width + width - lengths - (offsets[:-1] - offsets[0])
        raw.reshape(-1)[np.repeat(row_start, lengths) + np.arange(len(data))] = data
    else:
        return _fmix(_sums_by_gather(data, offsets, lengths))
    return _fmix(raw.astype(np.uint64) @ np.ascontiguousarray(_powers(width)[::-1]))


def _sums_by_gather(
    data: np.ndarray[Any, Any], offsets: np.ndarray[Any, Any], lengths: np.ndarray[Any, Any]
) -> np.ndarray[Any, np.dtype[np.uint64]]:
    """The polynomial sums of keys of very different lengths, one term per byte."""
    n = len(lengths)
    values = data.astype(np.uint64)
    rel = offsets - offsets[0]
    # Position of each byte counted from the end of its string: the exponent of P.
    owner = np.repeat(np.arange(n), lengths)
    exponent = (rel[owner + 1] - 1 - np.arange(len(values))).astype(np.int64)
    terms = values * _powers(int(lengths.max()))[exponent]
    nonempty = lengths > 0
    sums = np.zeros(n, np.uint64)
    if nonempty.any():
        sums[nonempty] = np.add.reduceat(terms, rel[:-1][nonempty])
    return sums


def route_rows(topics: pa.Array, keys: pa.Array, shards: int) -> np.ndarray[Any, np.dtype[np.int32]]:
    """Shard of every row: the routing hash of its key, or of its topic when the key is null.

    The one routing rule, shared by ``Database.append`` and the network producer so that a
    client batching by shard and the server agree.
    """
    n = np.uint64(shards)
    if keys.null_count == 0:  # every row keyed (the usual shape): topics are not hashed
        routes = routing_hashes(keys) % n
    else:
        routes = routing_hashes(topics) % n
        if keys.null_count != len(keys):
            key_routes = routing_hashes(keys) % n
            routes = np.where(keys.is_valid().to_numpy(zero_copy_only=False), key_routes, routes)
    return routes.astype(np.int32)
