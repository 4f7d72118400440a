"""The key index's two forms: per-frame key summaries and merged per-run postings.

Indexing every keyed record costs an LMDB put per record and a Python tuple per record to
build it. Instead the key index works per frame:

* A **summary** per keyed frame holds the frame's *distinct* keys, computed in C++
  (``pyarrow.compute.unique``) and stored as the Arrow binary array's buffers (int32
  offsets + data), with the frame's segment base and next offset. No per-record Python.
* When the frames of a segment stop growing (the next frame lands in another segment) or
  enough of them accumulated, their summaries are **merged** into one posting per distinct
  key: key -> the base offsets of the frames of that run holding the key (plus the run's
  end). A run never spans segments, so a posting is per distinct key per segment (or per
  part of a large segment), not per record. The summaries it replaces are deleted in the
  same transaction.

A lookup takes the postings of a key and tests the (few) remaining summaries for
membership with one pyarrow comparison; the caller then filters rows by the real key.

Keys longer than :data:`MAX_INLINE_KEY_BYTES` are stored as a 16-byte BLAKE2b digest padded
to ``MAX_INLINE_KEY_BYTES + 1`` bytes, a length no inline key has, so a long key can only
collide with another long key of the same digest (the caller's row filter drops those).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from typing import Any, Final, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "MAX_INLINE_KEY_BYTES",
    "DistinctKeys",
    "Summary",
    "decode_postings",
    "decode_summary",
    "distinct_keys",
    "distinct_keys_many",
    "encode_postings",
    "encode_summary",
    "frames_holding",
    "merge_postings",
    "normalize_key",
    "posting_prefix",
    "summary_head",
]

# LMDB keys are at most 511 bytes: shard (4) + length (2) + key + run base (8) must fit.
MAX_INLINE_KEY_BYTES: Final = 400
_LONG_KEY_BYTES: Final = MAX_INLINE_KEY_BYTES + 1
_DIGEST_BYTES: Final = 16
_LONG_KEY_PAD: Final = bytes(_LONG_KEY_BYTES - _DIGEST_BYTES)
_SUMMARY_HEAD: Final = struct.Struct(">QQI")  # segment base, frame next offset, distinct keys
_U16: Final = struct.Struct(">H")
_U64: Final = struct.Struct(">Q")
_BE_U64: Final = np.dtype(">u8")
# Frames from which distinct_keys_many hashes all rows at once (fewer: one by one).
_MANY_FRAMES: Final = 4


class DistinctKeys(NamedTuple):
    """A frame's distinct (normalized) keys as Arrow binary buffers: ``n + 1`` offsets, data."""

    offsets: np.ndarray[Any, np.dtype[np.int32]]
    data: bytes

    @property
    def size(self) -> int:
        """How many distinct keys."""
        return len(self.offsets) - 1


class Summary(NamedTuple):
    """A decoded per-frame summary."""

    segment_base: int
    next_offset: int
    keys: pa.Array  # binary, distinct, normalized


def normalize_key(key: bytes) -> bytes:
    """The form a key is indexed under: itself, or a padded digest when it is long."""
    if len(key) <= MAX_INLINE_KEY_BYTES:
        return key
    return hashlib.blake2b(key, digest_size=_DIGEST_BYTES).digest() + _LONG_KEY_PAD


def posting_prefix(shard_prefix: bytes, key: bytes) -> bytes:
    """The LMDB key prefix of every posting of ``key`` (already normalized) in a shard."""
    return shard_prefix + _U16.pack(len(key)) + key


def distinct_keys(column: pa.Array) -> DistinctKeys | None:
    """The distinct non-null keys of a frame's key column (``None``: no keyed record)."""
    if column.null_count == len(column):
        return None
    if column.type != pa.binary():
        column = column.cast(pa.binary())
    uniq = pc.unique(column)
    if uniq.null_count:
        uniq = uniq.drop_null()
    offsets, data = _binary_parts(uniq)
    if len(data) > MAX_INLINE_KEY_BYTES and int((offsets[1:] - offsets[:-1]).max()) > MAX_INLINE_KEY_BYTES:
        # Rare: long keys are normalized one by one (a digest each).
        normalized = sorted({normalize_key(k) for k in uniq.to_pylist()})
        offsets, data = _binary_parts(pa.array(normalized, pa.binary()))
    return DistinctKeys(offsets, data)


def distinct_keys_many(columns: Sequence[pa.Array]) -> list[DistinctKeys | None]:
    """:func:`distinct_keys` of each of many frames' key columns: the same summaries (keys in
    order of first appearance), with one hash of all the rows instead of one per frame.

    A drain of many shards indexes a small frame per shard; ``pyarrow.compute.unique`` per
    frame cost more than the frame's rows.
    """
    keyed = [i for i, c in enumerate(columns) if c.null_count < len(c)]
    if len(keyed) < len(columns):
        # Unkeyed frames (an all-null key column) have no summary: hashing their rows cost
        # ~1 ms per 64 frames of 1000 rows, on the appending thread.
        out: list[DistinctKeys | None] = [None] * len(columns)
        if keyed:
            for i, found in zip(keyed, distinct_keys_many([columns[i] for i in keyed]), strict=True):
                out[i] = found
        return out
    k = len(columns)
    if k < _MANY_FRAMES or any(c.type != pa.binary() for c in columns):
        return [distinct_keys(c) for c in columns]
    encoded = pc.dictionary_encode(pa.concat_arrays(list(columns)))
    indices = encoded.indices
    codes = (pc.fill_null(indices, -1) if indices.null_count else indices).to_numpy().astype(np.int64)
    frame = np.repeat(np.arange(k, dtype=np.int64), [len(c) for c in columns])
    if indices.null_count:
        keep = codes >= 0
        frame, codes = frame[keep], codes[keep]
    width = max(len(encoded.dictionary), 1)
    # Arrow's hash kernel keeps first appearances in row order (as distinct_keys relies on),
    # and rows come frame by frame: each frame's keys in the order they first appear. A sorting
    # np.unique plus an argsort took ~4x as long (5.3 against 1.4 ms for 64 frames of 1000).
    pairs = pc.unique(pa.array(frame * width + codes)).to_numpy()
    offsets, data = _binary_parts(encoded.dictionary.take(pa.array(pairs % width)))
    if len(data) > MAX_INLINE_KEY_BYTES and int((offsets[1:] - offsets[:-1]).max()) > MAX_INLINE_KEY_BYTES:
        return [distinct_keys(c) for c in columns]  # rare: long keys are normalized per frame
    ends = np.cumsum(np.bincount(pairs // width, minlength=k))
    out = []
    start = 0
    for end in ends.tolist():
        if end == start:
            out.append(None)  # no keyed record
            continue
        part = offsets[start : end + 1]
        lo, hi = int(part[0]), int(part[-1])
        out.append(DistinctKeys(part - lo if lo else part, data[lo:hi]))
        start = end
    return out


def _binary_parts(arr: pa.Array) -> tuple[np.ndarray[Any, np.dtype[np.int32]], bytes]:
    """Offsets (rebased to 0) and data of a null-free binary array."""
    n = len(arr)
    if n == 0:
        return np.zeros(1, np.int32), b""
    buffers = arr.buffers()
    offsets = np.frombuffer(buffers[1], np.int32, count=n + 1, offset=arr.offset * 4)
    lo, hi = int(offsets[0]), int(offsets[-1])
    data = buffers[2].to_pybytes()[lo:hi] if buffers[2] is not None else b""
    return offsets - lo if lo else offsets, data


def encode_summary(segment_base: int, next_offset: int, keys: DistinctKeys) -> bytes:
    """The stored form of a frame's summary."""
    return b"".join(
        (
            _SUMMARY_HEAD.pack(segment_base, next_offset, keys.size),
            keys.offsets.astype("<i4", copy=False).tobytes(),
            keys.data,
        )
    )


def summary_head(blob: bytes | memoryview) -> tuple[int, int, int]:
    """``(segment base, next offset, distinct keys)`` of a stored summary."""
    seg, nxt, n = _SUMMARY_HEAD.unpack_from(blob, 0)
    return int(seg), int(nxt), int(n)


def decode_summary(blob: bytes | memoryview) -> Summary:
    """A stored summary with its keys as an Arrow array (over ``blob``'s memory)."""
    seg, nxt, n = _SUMMARY_HEAD.unpack_from(blob, 0)
    head = _SUMMARY_HEAD.size
    data_at = head + 4 * (n + 1)
    buf = pa.py_buffer(blob)
    keys = pa.Array.from_buffers(pa.binary(), n, [None, buf.slice(head, data_at - head), buf.slice(data_at)])
    return Summary(int(seg), int(nxt), keys)


def frames_holding(key: bytes, summaries: Sequence[tuple[int, bytes | memoryview]]) -> list[int]:
    """Base offsets of the summarized frames whose distinct keys include ``key`` (normalized).

    A substring search rules most frames out cheaply; the rest are compared exactly in one
    pyarrow call.
    """
    head = _SUMMARY_HEAD.size
    hits: list[tuple[int, pa.Array]] = []
    for base, blob in summaries:
        raw = blob if isinstance(blob, bytes) else bytes(blob)
        if raw.find(key, head) < 0:
            continue
        hits.append((base, decode_summary(raw).keys))
    if not hits:
        return []
    counts = np.fromiter((len(a) for _, a in hits), np.int64, len(hits))
    bases = np.repeat(np.fromiter((b for b, _ in hits), np.int64, len(hits)), counts)
    equal = pc.equal(pa.concat_arrays([a for _, a in hits]), pa.scalar(key, pa.binary()))
    mask = np.asarray(equal.to_numpy(zero_copy_only=False), dtype=bool)
    return [int(b) for b in np.unique(bases[mask])]


def merge_postings(
    shard_prefix: bytes, run_base: int, run_end: int, frames: Sequence[tuple[int, pa.Array]]
) -> list[tuple[bytes, bytes]]:
    """The postings of one run of summarized frames, sorted by LMDB key.

    Args:
        shard_prefix: The shard's key prefix.
        run_base: Base offset of the run's first frame (part of every posting's key).
        run_end: Offset after the run's last frame (stored, for retention).
        frames: ``(frame base, distinct keys)`` of the run, ascending.

    Returns:
        ``(shard | len | key | run base, run end | frame bases...)`` per distinct key, all
        big-endian, built with Arrow/NumPy (Python only touches the finished items).
    """
    frames = [(b, a) for b, a in frames if len(a)]
    if not frames:
        return []
    counts = np.fromiter((len(a) for _, a in frames), np.int64, len(frames))
    bases = np.repeat(np.fromiter((b for b, _ in frames), np.uint64, len(frames)), counts)
    encoded = pc.dictionary_encode(pa.concat_arrays([a for _, a in frames]))
    distinct = encoded.dictionary
    n_keys = len(distinct)
    lengths = pc.binary_length(distinct).to_numpy().astype(">u2")
    length_col = pa.Array.from_buffers(pa.binary(2), n_keys, [None, pa.py_buffer(lengths.tobytes())])
    lmdb_keys = pc.binary_join_element_wise(
        pa.scalar(shard_prefix, pa.binary()),
        length_col.cast(pa.binary()),
        distinct,
        pa.scalar(_U64.pack(run_base), pa.binary()),
        pa.scalar(b"", pa.binary()),
    )
    # Sort the distinct keys as LMDB orders them, then every (key, frame) pair by that rank
    # (stable: frame order within a key is kept).
    order = pc.sort_indices(lmdb_keys).to_numpy()
    rank = np.empty(n_keys, np.int64)
    rank[order] = np.arange(n_keys)
    pair_rank = rank[encoded.indices.to_numpy()]
    sorted_bases = bases[_stable_argsort(pair_rank, n_keys)]
    per_key = np.bincount(pair_rank, minlength=n_keys)
    # Each value is the run end followed by the key's frame bases: lay them out in one array.
    slots = np.zeros(n_keys + 1, np.int64)
    np.cumsum(per_key + 1, out=slots[1:])
    values = np.empty(int(slots[-1]), _BE_U64)
    is_head = np.zeros(len(values), bool)
    is_head[slots[:-1]] = True
    values[is_head] = run_end
    values[~is_head] = sorted_bases
    value_col = pa.Array.from_buffers(
        pa.binary(),
        n_keys,
        [None, pa.py_buffer((slots * 8).astype(np.int32)), pa.py_buffer(values.tobytes())],
    )
    # The values are already in LMDB order (laid out by rank); the keys are put in it.
    sorted_keys = lmdb_keys.take(pa.array(order)).to_pylist()
    return list(zip(sorted_keys, value_col.to_pylist(), strict=True))


def _stable_argsort(values: np.ndarray[Any, Any], bound: int) -> np.ndarray[Any, Any]:
    """Stable argsort of non-negative ints below ``bound`` by 16-bit digits.

    NumPy's stable sort is a radix sort only for 16-bit (and smaller) integers, several times
    faster than its merge sort of wider ones; a merge's pairs are sorted on the append path.
    """
    if bound <= 1 << 16:
        return np.argsort(values.astype(np.uint16), kind="stable")
    perm: np.ndarray[Any, Any] = np.argsort((values & 0xFFFF).astype(np.uint16), kind="stable")
    high = values[perm] >> 16
    out: np.ndarray[Any, Any] = perm[_stable_argsort(high, (bound >> 16) + 1)]
    return out


def decode_postings(value: bytes | memoryview) -> tuple[int, np.ndarray[Any, np.dtype[np.int64]]]:
    """``(run end, frame bases)`` of a stored posting."""
    arr = np.frombuffer(value, _BE_U64)
    return int(arr[0]), arr[1:].astype(np.int64)


def encode_postings(run_end: int, bases: np.ndarray[Any, Any]) -> bytes:
    """The stored form of a posting (after a cut rewrote it)."""
    out = np.empty(len(bases) + 1, _BE_U64)
    out[0] = run_end
    out[1:] = bases
    return out.tobytes()
