"""Stream stamping: every shard's LTS, learned in offset order, and a vectorised topic cache.

A record's *stream* is the id its shard's learned topic structure (:class:`~seglog.topics.LTS`)
gives its topic. The log stamps it into the frame's ``stream`` column when the record's
offset is assigned, so the stream ids a shard holds are a pure function of the topics it
holds, in offset order, starting from an empty trie with the database's thresholds:

* **Origins.** Every trie node and stream remembers the offset of the record that created
  it. Learning runs in offset order, so origins never decrease with the id, and the trie
  as it was after offset ``x`` is a prefix of its nodes and streams. :meth:`StreamStamper.cut`
  goes back to it: a failed write whose offsets are handed out again, a replica truncated
  to a leader, or a snapshot taken after what a crash kept.
* **Snapshots** (:meth:`StreamStamper.snapshot`) hold the prefix learned from records below
  an offset ``d``; recovery restores one and learns the topics of ``[d, log end)`` again
  (:meth:`StreamStamper.stamp` in replay), checking that it gives the stamped ids. A
  snapshot ahead of the log (records acknowledged but lost in a crash under a lax fsync
  policy) is cut back to the log end: the offsets of lost records were never handed out
  twice. So recovery never sees a frame whose stream the trie lacks.
* **The cache.** Per record the stamp is a lookup of ``(shard, topic)`` in one open-addressing
  hash table held in NumPy arrays for all shards, done for the whole batch with no Python
  object per record: the topic column is read as a matrix of 8-byte words (Arrow pads the
  rows to one width), hashed by one matrix-vector product (:func:`topic_hashes`), probed
  with one gather of slot records, and every hit is checked word for word against the
  cached topic (a hash collision is a miss, never a wrong stream). Only misses walk a
  trie, one by one in offset order, exactly as without the cache.

* **Compiled code.** When the C extension ``seglog.topics._topic_cache`` is built (``pip
  install`` builds it; it is optional), the cache is a hash table in C instead: one call per
  batch reads the topic column's Arrow buffers in place, hashes, probes and compares each
  row's bytes, and returns the stream ids and the rows that missed. It answers exactly as
  the NumPy cache does (same one-entry-per-key rule); :attr:`StreamStamper.native` says
  which one a stamper uses.

* **Watches.** Subscriptions ask whether a stream got records since a position, to skip
  the read of a stream an append missed (:meth:`StreamStamper.watch`). Only watched
  streams are noted, per stamp call, so a database without subscriptions pays nothing.

Thread safety: one lock guards the tries and the cache; the event loop stamps, an I/O
worker snapshots or cuts.
"""

from __future__ import annotations

__all__ = ["SNAPSHOT_MAGIC", "StreamStamper", "distinct_streams"]

import bisect
import itertools
import struct
import threading
import zlib
from collections.abc import Sequence
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from seglog.errors import CorruptLTS, InvalidArgument
from seglog.topics.lts import LTS

try:
    from seglog.topics import _topic_cache
except ImportError:  # built without a compiler: the NumPy cache answers the same, slower
    _topic_cache = None  # type: ignore[assignment]

SNAPSHOT_MAGIC: Final = b"SLSN"
_SNAPSHOT_VERSION: Final = 1
# magic, version, covered end, node count, stream count, LTS bytes length
_SNAP_HEAD: Final = struct.Struct("<4sBqIII")
_CRC: Final = struct.Struct("<I")
_N_ROOTS: Final = 2
_MIX: Final = np.int64(-7046029254386353131)  # 0x9E3779B97F4A7C15 as int64: spreads shard numbers
_MIN_ENTRIES: Final = 1 << 8
_MIN_WORDS: Final = 1 << 10
_LOAD: Final = 2  # table slots per entry slot (entries have 2x room): at most a quarter full
_STEPS: Final = np.arange(1, 9, dtype=np.int64)
_LEN_BITS: Final = 24  # a slot packs a topic's word start and length (below 2**24 bytes)
_LEN_MASK: Final = (1 << _LEN_BITS) - 1  # a probe's window past the home slot
_DEAD: Final = -1  # entry_shard of a dropped cache entry
_UNKNOWN: Final = 1 << 62  # a watch not yet resolved: the stream may have rows anywhere
# topic_hashes: the length's multiplier and fmix64's constants (the word multipliers are a
# splitmix64 sequence, grown on demand).
_LENGTH_MULT: Final = np.uint64(0x9E3779B97F4A7C15)
_FMIX1: Final = np.uint64(0xFF51AFD7ED558CCD)
_FMIX2: Final = np.uint64(0xC4CEB9FE1A85EC53)


_WORD_MULTS: list[np.ndarray[Any, np.dtype[np.uint64]]] = []
_SHORT_WORDS: Final = 8  # rows of up to 64 bytes are hashed in one pass; longer ones by length class


def _word_multipliers(count: int) -> np.ndarray[Any, np.dtype[np.uint64]]:
    """The first ``count`` word multipliers (odd splitmix64 outputs; computed once, grown by doubling)."""
    if not _WORD_MULTS or len(_WORD_MULTS[0]) < count:
        size = max(count, 2 * len(_WORD_MULTS[0]) if _WORD_MULTS else 64)
        out = []
        state = 0x2545F4914F6CDD1D
        mask = (1 << 64) - 1
        for _ in range(size):
            state = (state + 0x9E3779B97F4A7C15) & mask
            z = state
            z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
            out.append((z ^ (z >> 31)) | 1)
        _WORD_MULTS[:] = [np.array(out, np.uint64)]
    return _WORD_MULTS[0][:count]


class _ShardTrie:
    """One shard's trie and the offset that created each of its nodes and streams."""

    __slots__ = ("lts", "node_origin", "stream_origin")

    def __init__(self, lts: LTS, node_origin: list[int], stream_origin: list[int]) -> None:
        self.lts = lts
        self.node_origin = node_origin  # roots: -1
        self.stream_origin = stream_origin


# distinct_streams counts stream ids (a bin each) when their span is below this.
_BINCOUNT_SPAN: Final = 4096


def distinct_streams(values: np.ndarray[Any, Any], limit: int) -> np.ndarray[Any, np.dtype[np.uint32]] | None:
    """The distinct stream ids of a frame's ``stream`` column (uint32), ascending, or ``None``
    when there are more than ``limit``.

    The compiled module stops at the first id past ``limit`` (a frame of interleaved streams
    after a few dozen rows); NumPy counts the ids (a bin each) or sorts them.
    """
    if _topic_cache is not None:
        out = np.empty(limit, np.uint32)
        count = _topic_cache.distinct_small(np.ascontiguousarray(values, np.uint32), out)
        return None if count < 0 else out[:count]
    lo, hi = int(values.min()), int(values.max())
    if lo == hi:
        tags = np.array([lo], np.uint32)
    elif hi - lo < _BINCOUNT_SPAN:
        counts = np.bincount(values - lo if lo else values)
        tags = (np.flatnonzero(counts) + lo).astype(np.uint32)
    else:
        tags = np.unique(values).astype(np.uint32, copy=False)
    return None if len(tags) > limit else tags


class StreamStamper:
    """The tries of every shard of one database and the ``(shard, topic) -> stream`` cache.

    Args:
        shards: Number of shards.
        thresholds: The database's LTS thresholds (see :class:`~seglog.topics.LTS`).
        key_bits: Bits of the cache keys (64). Fewer force hash collisions, for tests: a
            collision costs a trie walk, never a wrong stream.
        native: Use the compiled cache (``None``: when it is built; ``False``: the NumPy one).

    Raises:
        InvalidArgument: ``key_bits`` out of range, or ``native=True`` without the extension.
    """

    def __init__(
        self, shards: int, thresholds: Sequence[int], *, key_bits: int = 64, native: bool | None = None
    ) -> None:
        if not 1 <= key_bits <= 64:
            raise InvalidArgument(f"key_bits must be in 1..64, not {key_bits!r}")
        if native and _topic_cache is None:
            raise InvalidArgument("the compiled topic cache (seglog.topics._topic_cache) is not built")
        self._native = (
            _topic_cache.TopicCache(key_bits=key_bits)
            if _topic_cache is not None and native is not False
            else None
        )
        self.thresholds = tuple(LTS(thresholds, cache_size=0).thresholds)  # validated
        self._key_mask = np.int64(-1) if key_bits == 64 else np.int64((1 << key_bits) - 1)
        self._tries: list[_ShardTrie | None] = [None] * shards
        self._lock = threading.Lock()
        # shard -> watched stream -> the last offset it was stamped at (an upper bound), or
        # _UNKNOWN until the shard's next stamp.
        self._watched: dict[int, dict[int, int]] = {}
        self._trie_rows = 0
        self._reset_cache()

    # --- the cache ----------------------------------------------------------------------

    def _reset_cache(self) -> None:
        if self._native is not None:
            self._native.clear()
            return
        # Entries (appended; a cut marks some dead and rebuilds): key, shard, stream, the
        # topic's length and where its words (see topic_hashes) start in ``_store``, whose
        # word 0 is a zero word that verification reads for words past a topic's end.
        self._n = 0
        self._dead = 0
        self._hash = np.empty(_MIN_ENTRIES, np.int64)
        self._shard = np.empty(_MIN_ENTRIES, np.int32)
        self._stream = np.empty(_MIN_ENTRIES, np.uint32)
        self._len = np.empty(_MIN_ENTRIES, np.int64)
        self._wstart = np.empty(_MIN_ENTRIES, np.int64)
        self._store = np.zeros(_MIN_WORDS, np.uint64)
        self._n_words = 1
        self._init_table(_LOAD * _MIN_ENTRIES)

    def _init_table(self, slots: int) -> None:
        # Open addressing with linear probing, at most a quarter full. A slot is one record
        # of 4 int64 (half a cache line): key (0: free), entry, word start << 24 | topic
        # length, shard << 32 | stream -- a copy of what a hit needs, so that a probe is one
        # gather of records for the whole batch (one cache miss per row, not one per array).
        # The rows whose home slot holds another key (a few %) look further together.
        self._mask = slots - 1
        self._slots = np.zeros((slots, 4), np.int64)

    @property
    def native(self) -> bool:
        """Whether the compiled cache (``seglog.topics._topic_cache``) serves the lookups."""
        return self._native is not None

    @property
    def cached_topics(self) -> int:
        """Entries in the cache (for tests and stats)."""
        if self._native is not None:
            return len(self._native)
        return self._n - self._dead

    @property
    def trie_rows(self) -> int:
        """Rows the cache missed so far, handed to the tries (for tests and stats)."""
        return self._trie_rows

    def _keys(
        self, column: _Column, shards: np.ndarray[Any, Any] | int
    ) -> np.ndarray[Any, np.dtype[np.int64]]:
        """The cache key of every row: the hash of its topic's bytes mixed with its shard."""
        h = column.hashes()
        if isinstance(shards, np.ndarray):
            h ^= shards.astype(np.int64) * _MIX  # array arithmetic wraps: fine for a hash
        elif shards:
            h ^= (np.array([shards], np.int64) * _MIX)[0]
        if self._key_mask != -1:
            h &= self._key_mask
        h[h == 0] = 1  # 0 marks a free slot
        return h

    def _lookup(
        self, keys: np.ndarray[Any, np.dtype[np.int64]]
    ) -> tuple[np.ndarray[Any, np.dtype[np.bool_]], np.ndarray[Any, np.dtype[np.int64]]]:
        """``(hit, slot records)`` of each key (records of misses are garbage)."""
        n = len(keys)
        if self._n == 0 or n == 0:
            return np.zeros(n, np.bool_), np.zeros((n, 4), np.int64)
        mask = self._mask
        pos = keys & mask
        rec = np.take(self._slots, pos, axis=0)  # several times faster than self._slots[pos]
        hit: np.ndarray[Any, np.dtype[np.bool_]] = rec[:, 0] == keys
        if bool(hit.all()):
            return hit, rec
        # Rows whose home slot holds another key look at the next _WINDOW slots at once; a
        # free slot ends a probe (a miss). Longer runs (rare at this load) step on.
        rows = np.flatnonzero(~hit & (rec[:, 0] != 0))
        start = pos[rows]
        slot_keys = self._slots[:, 0]
        while len(rows):
            window = (start[:, None] + _STEPS) & mask
            at_w = slot_keys[window]
            eq = at_w == keys[rows][:, None]
            stop = eq | (at_w == 0)
            first = stop.argmax(axis=1)
            ended = stop[np.arange(len(rows)), first]
            found = ended & eq[np.arange(len(rows)), first]
            hit[rows[found]] = True
            rec[rows[found]] = np.take(self._slots, window[found, first[found]], axis=0)
            rows, start = rows[~ended], start[~ended] + len(_STEPS)
        return hit, rec

    def _verify(
        self, column: _Column, rows: np.ndarray[Any, Any] | None, rec: np.ndarray[Any, np.dtype[np.int64]]
    ) -> np.ndarray[Any, np.dtype[np.bool_]]:
        """Whether each row's topic (``rows`` of ``column``; ``None``: all) is its slot's, byte for byte."""
        packed = rec[:, 2]
        same: np.ndarray[Any, np.dtype[np.bool_]] = (packed & _LEN_MASK) == (
            column.lengths if rows is None else column.lengths[rows]
        )
        if bool(same.all()):
            return column.same(rows, self._store, packed >> _LEN_BITS)
        keep = np.flatnonzero(same)
        picked = keep if rows is None else rows[keep]
        same[keep] = column.same(picked, self._store, packed[keep] >> _LEN_BITS)
        return same

    def _rehash(self, *, grow: bool, reserve: int = 0) -> None:
        """Rebuild the table from the live entries (dropping dead ones; sized for ``reserve`` more)."""
        live = np.flatnonzero(self._shard[: self._n] != _DEAD)
        size = max(_MIN_ENTRIES, len(self._hash))
        if grow:
            size = _MIN_ENTRIES
            while size < 2 * (len(live) + reserve):
                size *= 2
        if len(live) != self._n:
            # Keep the words of the live entries only (after the zero word).
            counts = np.maximum((self._len[live] + 7) // 8, 1)
            kept, starts = _gather_ranges(self._store, self._wstart[live], counts)
            self._n_words = 1 + len(kept)
            self._store = np.zeros(max(_MIN_WORDS, 2 * self._n_words), np.uint64)
            self._store[1 : self._n_words] = kept
            self._wstart = _resized(starts + 1, size)
        else:
            self._wstart = _resized(self._wstart[: self._n], size)
        self._len = _resized(self._len[live], size)
        self._hash = _resized(self._hash[live], size)
        self._shard = _resized(self._shard[live], size)
        self._stream = _resized(self._stream[live], size)
        n = self._n = len(live)
        self._dead = 0
        self._init_table(_LOAD * size)
        if n:
            self._place_many(np.arange(n))

    def _drop_cached(self, shard: int, first_stream: int) -> None:
        """Make entries of ``shard`` with a stream ``>= first_stream`` unfindable."""
        if self._native is not None:
            self._native.drop(shard, first_stream)
            return
        n = self._n
        doomed = (self._shard[:n] == shard) & (self._stream[:n] >= first_stream)
        count = int(doomed.sum())
        if count:
            self._shard[:n][doomed] = _DEAD
            self._dead += count
            self._rehash(grow=False)

    # --- tries --------------------------------------------------------------------------

    def _trie(self, shard: int) -> _ShardTrie:
        trie = self._tries[shard]
        if trie is None:
            trie = self._tries[shard] = _ShardTrie(LTS(self.thresholds, cache_size=0), [-1, -1], [])
        return trie

    def _learn(self, trie: _ShardTrie, topic: str, origin: int) -> int:
        lts = trie.lts
        nodes, streams = lts.node_count, lts.stream_count
        stream = lts.learn_stream(topic)
        if lts.node_count != nodes:
            trie.node_origin.extend([origin] * (lts.node_count - nodes))
        if lts.stream_count != streams:
            trie.stream_origin.extend([origin] * (lts.stream_count - streams))
        return stream

    def stamp(
        self,
        topics: pa.Array,
        shards: np.ndarray[Any, Any] | int,
        offsets: np.ndarray[Any, Any] | int,
    ) -> np.ndarray[Any, np.dtype[np.uint32]]:
        """The stream of every row, learning new topics in row order.

        Args:
            topics: Valid topic names (a string array).
            shards: Each row's shard, or one shard for all rows.
            offsets: Each row's offset, or the first row's (rows then follow on). Within a
                shard, rows must come in offset order, continuing what was learned.

        Returns:
            A uint32 array of stream ids, one per row.

        Raises:
            InvalidTopic: A topic is not a valid name (validated appends never have one).
        """
        n = len(topics)
        if n == 0:
            return np.empty(0, np.uint32)
        if self._native is not None:
            return self._stamp_native(topics, shards, offsets)
        column = _Column(topics)
        out: np.ndarray[Any, np.dtype[np.uint32]]
        with self._lock:
            keys = self._keys(column, shards)
            found, rec = self._lookup(keys)
            if bool(found.all()):
                # The common case (every topic known): one check of all rows.
                found = self._verify(column, None, rec)
                found &= (rec[:, 3] >> 32) == shards
                out = rec[:, 3].astype(np.uint32)  # the low 32 bits: the stream
            else:
                out = np.zeros(n, np.uint32)
                rows = np.flatnonzero(found)
                if len(rows):
                    hits = rec[rows]
                    same = self._verify(column, rows, hits)
                    same &= (hits[:, 3] >> 32) == (shards[rows] if isinstance(shards, np.ndarray) else shards)
                    found[rows[~same]] = False
                    out[rows] = hits[:, 3].astype(np.uint32)
            if not bool(found.all()):
                misses = np.flatnonzero(~found)
                self._trie_rows += len(misses)
                rows, row_shards, learned = self._learn_rows(
                    out, misses, keys[misses], topics, shards, offsets
                )
                self._insert_many(keys[rows], row_shards, learned, column, rows)
            if self._watched:
                self._note_watched(out, shards, offsets)
            return out

    def _stamp_native(
        self,
        topics: pa.Array,
        shards: np.ndarray[Any, Any] | int,
        offsets: np.ndarray[Any, Any] | int,
    ) -> np.ndarray[Any, np.dtype[np.uint32]]:
        """:meth:`stamp` with the compiled cache: one call looks up the batch in place."""
        cache = self._native
        assert cache is not None
        kind = topics.type
        if kind == pa.string():
            width = 4
        elif kind == pa.large_string():
            width = 8
        else:
            topics = topics.cast(pa.string())
            width = 4
        if isinstance(shards, np.ndarray):
            if not shards.flags.c_contiguous:
                shards = np.ascontiguousarray(shards)
        else:
            shards = int(shards)  # a NumPy integer too: the extension takes an int or a buffer
        _, offsets_buf, data_buf = topics.buffers()
        data = b"" if data_buf is None else data_buf
        n = len(topics)
        start = topics.offset
        out = np.empty(n, np.uint32)
        miss_rows = np.empty(n, np.int64)
        miss_keys = np.empty(n, np.int64)
        with self._lock:
            m = cache.lookup(offsets_buf, data, start, n, width, shards, out, miss_rows, miss_keys)
            if m:
                self._trie_rows += m
                rows, row_shards, learned = self._learn_rows(
                    out, miss_rows[:m], miss_keys[:m], topics, shards, offsets
                )
                cache.insert(offsets_buf, data, start, n, width, rows, row_shards, learned)
            if self._watched:
                self._note_watched(out, shards, offsets)
            return out

    # --- watches ------------------------------------------------------------------------

    def watch(self, shard: int, stream: int) -> None:
        """Note from now on where ``stream`` of ``shard`` is stamped (see :meth:`stamped_since`).

        Until the shard's next stamp the answer is "maybe anywhere": rows stamped before the
        watch may still be on their way to the log.
        """
        with self._lock:
            self._watched.setdefault(shard, {})[stream] = _UNKNOWN

    def unwatch(self, shard: int, stream: int) -> None:
        """Stop noting ``stream`` of ``shard``."""
        with self._lock:
            streams = self._watched.get(shard)
            if streams is not None:
                streams.pop(stream, None)
                if not streams:
                    del self._watched[shard]

    def stamped_since(self, shard: int, stream: int, offset: int) -> bool:
        """Whether a watched stream may have a record at ``offset`` or later (``True`` when
        unsure: never watched, or not resolved yet). ``False`` is a promise: no record at or
        after ``offset`` was stamped with it since the watch began, nor before it."""
        with self._lock:
            last = self._watched.get(shard, {}).get(stream, _UNKNOWN)
        return last >= offset

    def _note_watched(
        self,
        out: np.ndarray[Any, Any],
        shards: np.ndarray[Any, Any] | int,
        offsets: np.ndarray[Any, Any] | int,
    ) -> None:
        """Move the watches of the shards these rows went to (under the lock)."""
        for shard, streams in self._watched.items():
            if isinstance(shards, np.ndarray):
                mask = shards == shard
                if not mask.any():
                    continue
                ids = out[mask]
                rows_offsets = (
                    offsets[mask] if isinstance(offsets, np.ndarray) else np.flatnonzero(mask) + offsets
                )
                first, last = int(rows_offsets.min()), int(rows_offsets.max())
            elif shards == shard:
                ids = out
                if isinstance(offsets, np.ndarray):
                    first, last = int(offsets.min()), int(offsets.max())
                else:
                    first, last = offsets, offsets + len(out) - 1
            else:
                continue
            for stream, seen in streams.items():
                if seen == _UNKNOWN:
                    # Rows stamped before the watch lie below these: a reader that has read
                    # below ``first`` has seen them.
                    streams[stream] = first - 1
            hit = np.unique(ids[np.isin(ids, np.fromiter(streams, np.int64, len(streams)))])
            for stream in hit.tolist():
                # The last row of the call bounds the stream's last row (exact is not needed).
                streams[stream] = max(streams[stream], last)

    def _learn_rows(
        self,
        out: np.ndarray[Any, Any],
        misses: np.ndarray[Any, Any],
        miss_keys: np.ndarray[Any, Any],
        topics: pa.Array,
        shards: np.ndarray[Any, Any] | int,
        offsets: np.ndarray[Any, Any] | int,
    ) -> tuple[
        np.ndarray[Any, Any], np.ndarray[Any, np.dtype[np.int64]], np.ndarray[Any, np.dtype[np.int64]]
    ]:
        """Learn the rows the cache missed (with their cache keys), in row order per shard.

        Repeats among the misses are found with NumPy (by key, then checked exactly), so
        the tries only walk each new ``(shard, topic)`` once.

        Returns:
            ``(rows, shards, streams)`` of the first row of each ``(shard, topic)`` learned,
            to cache.
        """
        miss_shards = shards[misses] if isinstance(shards, np.ndarray) else None
        _, first, inverse = np.unique(miss_keys, return_index=True, return_inverse=True)
        firsts = misses[first]
        miss_topics = topics.take(pa.array(misses))
        same = pc.equal(miss_topics, miss_topics.take(pa.array(first[inverse]))).to_numpy(
            zero_copy_only=False
        )
        if miss_shards is not None:
            same &= miss_shards == miss_shards[first[inverse]]
        if not same.all():  # two new topics share a key: learn every miss on its own
            first = np.arange(len(misses))
            inverse = first
            firsts = misses
        # Learn in row order, each shard's rows in offset order.
        order = np.argsort(firsts, kind="stable")
        rows = firsts[order]
        row_shards = shards[rows] if isinstance(shards, np.ndarray) else np.full(len(rows), shards, np.int64)
        row_origins = offsets[rows] if isinstance(offsets, np.ndarray) else rows + offsets
        row_topics: list[str] = topics.take(pa.array(rows)).to_pylist()
        learned = np.empty(len(rows), np.int64)
        by_shard = np.argsort(row_shards, kind="stable")
        cuts = np.flatnonzero(np.diff(row_shards[by_shard])) + 1
        for group in np.split(by_shard, cuts):
            if not len(group):
                continue
            trie = self._trie(int(row_shards[group[0]]))
            group_list = group.tolist()
            lts = trie.lts
            nodes0, streams0 = lts.node_count, lts.stream_count
            streams, nodes_after, streams_after = lts.learn_valid([row_topics[i] for i in group_list])
            learned[group] = streams
            if lts.node_count != nodes0 or lts.stream_count != streams0:
                origins = row_origins[group].tolist()
                _note_origins(trie.node_origin, nodes0, nodes_after, origins)
                _note_origins(trie.stream_origin, streams0, streams_after, origins)
        # Back to every miss: order maps first-occurrence rank to learned position.
        stream_of_unique = np.empty(len(rows), np.int64)
        stream_of_unique[order] = learned
        out[misses] = stream_of_unique[inverse]
        return rows, row_shards.astype(np.int64), learned

    def _insert_many(
        self,
        keys: np.ndarray[Any, Any],
        shards: np.ndarray[Any, Any],
        streams: np.ndarray[Any, Any],
        column: _Column,
        rows: np.ndarray[Any, Any],
    ) -> None:
        """Cache new entries: the topics of ``rows`` of ``column`` (vectorised placement)."""
        # A key already cached belongs to another (shard, topic) (a 64-bit collision): that
        # one stays uncached (learned on every append) rather than piling up copies. So do
        # topics of 2**24 bytes or more (a slot packs the length in 24 bits; MQTT's are shorter).
        fresh = column.lengths[rows] <= _LEN_MASK
        if self._n:
            fresh &= ~self._lookup(keys)[0]
        if not fresh.all():
            keep = np.flatnonzero(fresh)
            keys, shards, streams, rows = keys[keep], shards[keep], streams[keep], rows[keep]
        _, first = np.unique(keys, return_index=True)
        if len(first) != len(keys):  # keys shared within the batch: the first row's topic is cached
            first.sort()
            keys, shards, streams, rows = keys[first], shards[first], streams[first], rows[first]
        m = len(keys)
        if not m:
            return
        if self._n + m > len(self._hash):
            self._rehash(grow=True, reserve=m)
        words, counts = column.row_words(rows)
        at = self._n_words
        if at + len(words) > len(self._store):
            self._store = _resized(self._store[:at], max(2 * len(self._store), at + len(words)))
        self._store[at : at + len(words)] = words
        self._n_words = at + len(words)
        lo, hi = self._n, self._n + m
        self._hash[lo:hi] = keys
        self._shard[lo:hi] = shards
        self._stream[lo:hi] = streams
        self._wstart[lo:hi] = np.cumsum(counts) - counts + at
        self._len[lo:hi] = column.lengths[rows]
        self._n = hi
        self._place_many(np.arange(lo, hi))

    def _place_many(self, entries: np.ndarray[Any, Any]) -> None:
        """Put entries (with distinct keys, none in the table yet) into free slots."""
        mask = self._mask
        keys = self._hash[entries]
        pos = keys & mask
        todo = np.arange(len(entries))
        while len(todo):
            p = pos[todo]
            free = self._slots[p, 0] == 0
            # Of the rows that want one free slot, the first takes it; the others step on.
            cand = todo[free]
            _, first = np.unique(p[free], return_index=True)
            won = cand[first]
            e = entries[won]
            self._slots[pos[won]] = np.stack(
                (
                    keys[won],
                    e,
                    self._wstart[e] << _LEN_BITS | self._len[e],
                    self._shard[e].astype(np.int64) << 32 | self._stream[e].astype(np.int64),
                ),
                axis=1,
            )
            placed = np.zeros(len(entries), np.bool_)
            placed[won] = True
            todo = todo[~placed[todo]]
            pos[todo] = (pos[todo] + 1) & mask

    def cut(self, shard: int, offset: int) -> bool:
        """Forget what records at ``offset`` and later taught ``shard``'s trie.

        Returns:
            Whether anything was forgotten.
        """
        with self._lock:
            trie = self._tries[shard]
            if trie is None:
                return False
            k = bisect.bisect_left(trie.node_origin, offset, lo=_N_ROOTS)
            j = bisect.bisect_left(trie.stream_origin, offset)
            if k == trie.lts.node_count and j == trie.lts.stream_count:
                return False
            trie.lts.truncate(k, j)
            del trie.node_origin[k:]
            del trie.stream_origin[j:]
            self._drop_cached(shard, j)
            return True

    def reset(self, shard: int) -> None:
        """Forget everything ``shard`` learned (its log is empty from offset 0)."""
        self.cut(shard, -1)

    # --- generations --------------------------------------------------------------------

    def copy_tries(self) -> list[LTS]:
        """A copy of every shard's trie (an empty one for a shard that learned nothing)."""
        with self._lock:
            return [
                LTS(self.thresholds, cache_size=0)
                if trie is None
                else LTS.from_bytes(trie.lts.to_bytes(), cache_size=0)
                for trie in self._tries
            ]

    def begin_generation(self, tries: Sequence[LTS]) -> None:
        """Start a new generation on every shard with the given tries (each one inherited
        the old trie's wildcard structure: :meth:`LTS.inherit_wildcards`).

        Topics stamped from now on get the new tries' stream ids; the caller takes the
        offsets at the same step (nothing awaits in between). The cache is emptied and
        every watch becomes "unsure" (ids now name the new generation's streams).
        """
        if len(tries) != len(self._tries):
            raise InvalidArgument(f"{len(tries)} tries for {len(self._tries)} shards")
        with self._lock:
            for shard, lts in enumerate(tries):
                self._tries[shard] = _inherited(lts)
            self._reset_cache()
            for streams in self._watched.values():
                for stream in streams:
                    streams[stream] = _UNKNOWN

    def set_base(self, shard: int, lts: LTS) -> None:
        """Make ``lts`` (a generation's inherited trie) ``shard``'s trie, learned before any
        of the generation's records (recovery of a generation without a snapshot)."""
        with self._lock:
            old = self._tries[shard]
            if old is not None and old.lts.stream_count:
                self._drop_cached(shard, 0)
            self._tries[shard] = _inherited(lts)

    # --- reading the tries ------------------------------------------------------------

    def stream_count(self, shard: int) -> int:
        """Streams of ``shard`` (ids are ``range(stream_count)``)."""
        with self._lock:
            trie = self._tries[shard]
            return 0 if trie is None else trie.lts.stream_count

    def match(self, shard: int, topic_filter: str) -> list[tuple[int, list[str | None]]]:
        """``shard``'s streams that may hold topics matching ``topic_filter``, with varying filters.

        Raises:
            InvalidTopicFilter: The filter is malformed.
        """
        with self._lock:
            trie = self._tries[shard]
            if trie is None:
                LTS(self.thresholds, cache_size=0).match(topic_filter)  # validates
                return []
            return trie.lts.match(topic_filter)

    def structure(self, shard: int, stream: int) -> tuple[tuple[str, ...], bool] | None:
        """``(learned structure, under the '$' root)`` of a stream; ``None``: no such stream."""
        with self._lock:
            trie = self._tries[shard]
            if trie is None or not 0 <= stream < trie.lts.stream_count:
                return None
            return trie.lts.structure(stream), trie.lts.is_special(stream)

    def varying_filter(self, shard: int, stream: int, topic_filter: str) -> list[str | None] | None:
        """The varying filter of ``topic_filter`` for one stream (``None``: it matches none of it).

        Raises:
            InvalidArgument: No such stream.
            InvalidTopicFilter: The filter is malformed.
        """
        with self._lock:
            trie = self._tries[shard]
            if trie is None:
                raise InvalidArgument(f"shard {shard} has no stream {stream}")
            return trie.lts.varying_filter(stream, topic_filter)

    def lts_bytes(self, shard: int) -> bytes:
        """``shard``'s whole trie as :meth:`LTS.to_bytes` writes it (for tests and tools)."""
        with self._lock:
            return self._trie(shard).lts.to_bytes()

    # --- snapshots ------------------------------------------------------------------------

    def snapshot(self, shard: int, upto: int) -> bytes:
        """``shard``'s trie as learned from the records below ``upto`` (with origins).

        ``upto`` must be an offset no rollback goes below (the durable end): the snapshot
        is then the state after exactly the records ``[0, upto)`` of the log.
        """
        with self._lock:
            trie = self._trie(shard)
            k = bisect.bisect_left(trie.node_origin, upto, lo=_N_ROOTS)
            j = bisect.bisect_left(trie.stream_origin, upto)
            lts_bytes = trie.lts.to_bytes(node_count=k, stream_count=j)
            node_origin = np.array(trie.node_origin[_N_ROOTS:k], np.int64)
            stream_origin = np.array(trie.stream_origin[:j], np.int64)
        body = b"".join(
            (
                _SNAP_HEAD.pack(SNAPSHOT_MAGIC, _SNAPSHOT_VERSION, upto, k, j, len(lts_bytes)),
                lts_bytes,
                node_origin.astype("<i8").tobytes(),
                stream_origin.astype("<i8").tobytes(),
            )
        )
        return body + _CRC.pack(zlib.crc32(body))

    def restore(self, shard: int, data: bytes, log_end: int) -> int:
        """Replace ``shard``'s trie by a snapshot, cut back to ``log_end`` if it is ahead.

        Returns:
            The offset from which the log's topics must be learned again (``stamp``).

        Raises:
            CorruptLTS: The snapshot is damaged or was written with other thresholds.
        """
        trie, upto = _decode_snapshot(data, self.thresholds)
        with self._lock:
            old = self._tries[shard]
            if old is not None and old.lts.stream_count:
                self._drop_cached(shard, 0)
            self._tries[shard] = trie
        if upto > log_end:
            self.cut(shard, log_end)
            upto = log_end
        return upto


def _inherited(lts: LTS) -> _ShardTrie:
    """A trie whose nodes and streams predate every record of its generation (origin -1)."""
    return _ShardTrie(lts, [-1] * lts.node_count, [-1] * lts.stream_count)


def _note_origins(origin: list[int], before: int, counts_after: list[int], origins: list[int]) -> None:
    """Extend ``origin`` (per node or stream) with the origin of each item that grew the count."""
    prev = before
    for count, at in zip(counts_after, origins, strict=True):
        if count != prev:
            origin.extend([at] * (count - prev))
            prev = count


def _resized(arr: np.ndarray[Any, Any], size: int) -> np.ndarray[Any, Any]:
    out = np.empty(size, arr.dtype)
    out[: len(arr)] = arr
    return out


def _decode_snapshot(data: bytes, thresholds: tuple[int, ...]) -> tuple[_ShardTrie, int]:
    view = memoryview(data)
    if len(view) < _SNAP_HEAD.size + _CRC.size:
        raise CorruptLTS(f"LTS snapshot of {len(view)} bytes is shorter than its header")
    body, (crc,) = view[: -_CRC.size], _CRC.unpack(view[-_CRC.size :])
    if zlib.crc32(body) != crc:
        raise CorruptLTS("LTS snapshot CRC mismatch")
    magic, version, upto, k, j, size = _SNAP_HEAD.unpack_from(body, 0)
    if magic != SNAPSHOT_MAGIC or version != _SNAPSHOT_VERSION:
        raise CorruptLTS(f"not an LTS snapshot (magic {bytes(magic)!r}, version {version})")
    at = _SNAP_HEAD.size
    expect = at + size + 8 * (k - _N_ROOTS) + 8 * j
    if k < _N_ROOTS or len(body) != expect:
        raise CorruptLTS("LTS snapshot lengths do not add up")
    lts = LTS.from_bytes(bytes(body[at : at + size]), cache_size=0)
    if lts.thresholds != thresholds:
        raise CorruptLTS(
            f"LTS snapshot learned with thresholds {list(lts.thresholds)}, the database uses {list(thresholds)}"
        )
    if lts.node_count != k or lts.stream_count != j:
        raise CorruptLTS("LTS snapshot counts disagree with its trie")
    at += size
    node_origin = np.frombuffer(body, "<i8", k - _N_ROOTS, at).tolist()
    at += 8 * (k - _N_ROOTS)
    stream_origin = np.frombuffer(body, "<i8", j, at).tolist()
    if any(b < a for a, b in itertools.pairwise(node_origin)) or any(
        b < a for a, b in itertools.pairwise(stream_origin)
    ):
        raise CorruptLTS("LTS snapshot origins are not in offset order")
    return _ShardTrie(lts, [-1, -1, *node_origin], stream_origin), int(upto)


class _Part:
    """Rows of a column as one ``(rows, words)`` matrix of 8-byte words (see :func:`topic_hashes`)."""

    __slots__ = ("inside", "rows", "words")

    def __init__(
        self,
        rows: np.ndarray[Any, Any] | None,
        words: np.ndarray[Any, np.dtype[np.uint64]],
        inside: np.ndarray[Any, np.dtype[np.bool_]] | None,
    ) -> None:
        self.rows = rows  # None: every row of the column
        self.words = words  # word k of each row, 0 past its end
        self.inside = inside  # k < the row's word count (None: true everywhere)


class _Column:
    """A string column's rows as 8-byte words (no Python object per row)."""

    __slots__ = ("lengths", "parts")

    def __init__(self, topics: pa.Array) -> None:
        n = len(topics)
        if topics.type != pa.string():
            topics = topics.cast(pa.string())
        offsets = np.frombuffer(topics.buffers()[1], np.int32, n + 1, topics.offset * 4)
        self.lengths = lengths = (offsets[1:] - offsets[:-1]).astype(np.int64)
        self.parts: list[_Part] = []
        for rows, words in _length_classes(lengths):
            part = topics if rows is None else topics.take(pa.array(rows))
            r_lengths = lengths if rows is None else lengths[rows]
            # Arrow pads every row with zero bytes to the class's width: the data buffer is
            # then a (rows, words) matrix of words, read in place.
            padded = pc.ascii_rpad(part, width=8 * words, padding="\0")
            data = padded.buffers()[2]
            w = np.frombuffer(data, np.uint64, len(part) * words, 0).reshape(len(part), words)
            counts = np.maximum((r_lengths + 7) // 8, 1)
            inside = None
            if int(counts.min()) != words:
                inside = np.arange(words)[None, :] < counts[:, None]
            self.parts.append(_Part(rows, w, inside))

    def hashes(self) -> np.ndarray[Any, np.dtype[np.int64]]:
        """:func:`topic_hashes` of the column."""
        n = len(self.lengths)
        x = np.empty(n, np.uint64)
        for part in self.parts:
            sums = part.words @ _word_multipliers(part.words.shape[1])
            if part.rows is None:
                x = sums
            else:
                x[part.rows] = sums
        x += self.lengths.astype(np.uint64) * _LENGTH_MULT
        return _fmix64(x).view(np.int64)

    def same(
        self,
        rows: np.ndarray[Any, Any] | None,
        store: np.ndarray[Any, np.dtype[np.uint64]],
        word_starts: np.ndarray[Any, np.dtype[np.int64]],
    ) -> np.ndarray[Any, np.dtype[np.bool_]]:
        """Whether ``rows`` (``None``: all) hold the words ``store[word_starts[i]:]`` of equal-length topics."""
        if rows is None and len(self.parts) == 1:
            return _same_words(self.parts[0].words, self.parts[0].inside, store, word_starts)
        n = len(self.lengths)
        wanted = np.full(n, -1, np.int64)
        picked = np.arange(n) if rows is None else rows
        wanted[picked] = word_starts
        same = np.zeros(n, np.bool_)
        for part in self.parts:
            at = wanted if part.rows is None else wanted[part.rows]
            cols = np.flatnonzero(at >= 0)
            inside = None if part.inside is None else part.inside[cols]
            ok = _same_words(part.words[cols], inside, store, at[cols])
            same[cols if part.rows is None else part.rows[cols]] = ok
        return same[picked]

    def row_words(
        self, rows: np.ndarray[Any, Any]
    ) -> tuple[np.ndarray[Any, np.dtype[np.uint64]], np.ndarray[Any, Any]]:
        """The words of ``rows`` back to back and each row's word count (at least 1)."""
        counts = np.maximum((self.lengths[rows] + 7) // 8, 1)
        starts = np.cumsum(counts) - counts
        out = np.empty(int(counts.sum()), np.uint64)
        n = len(self.lengths)
        where = np.full(n, -1, np.int64)
        where[rows] = np.arange(len(rows))
        for part in self.parts:
            at = where if part.rows is None else where[part.rows]
            cols = np.flatnonzero(at >= 0)
            if not len(cols):
                continue
            sub = part.words[cols]  # (rows, words)
            mine = at[cols]
            steps = np.arange(sub.shape[1])[None, :]
            keep = steps < counts[mine][:, None]
            out[(starts[mine][:, None] + steps)[keep]] = sub[keep]
        return out, counts


def _same_words(
    words: np.ndarray[Any, np.dtype[np.uint64]],
    inside: np.ndarray[Any, np.dtype[np.bool_]] | None,
    store: np.ndarray[Any, np.dtype[np.uint64]],
    word_starts: np.ndarray[Any, np.dtype[np.int64]],
) -> np.ndarray[Any, np.dtype[np.bool_]]:
    """Row by row, whether ``words`` equal the stored words (past a row's end: ``store[0]``, zero)."""
    idx = word_starts[:, None] + np.arange(words.shape[1])
    if inside is not None:
        idx *= inside
    # Differing words per row, as a product (a reduction along short rows is slow in NumPy).
    differ = (np.take(store, idx) != words).view(np.uint8) @ np.ones(words.shape[1], np.int32)
    out: np.ndarray[Any, np.dtype[np.bool_]] = differ == 0
    return out


def topic_hashes(topics: pa.Array) -> np.ndarray[Any, np.dtype[np.int64]]:
    """A 64-bit hash of every value's bytes, for a whole column without a Python object per row.

    A row of ``L`` bytes is its ``max(1, ceil(L / 8))`` little-endian 8-byte words, the
    last one zero-padded (Arrow's ``ascii_rpad`` pads a batch to one width: the padded
    data buffer is a word matrix). The words times an odd constant of their position are
    summed (two rows that differ in one word never collide), the length is mixed in and
    MurmurHash3's ``fmix64`` spreads the bits. Equal values hash equal, in any process;
    the hash is a cache key, verified against the cached topic's words, never stored.

    Args:
        topics: A string (or large string) array without nulls.

    Returns:
        One int64 per row.
    """
    if not len(topics):
        return np.empty(0, np.int64)
    return _Column(topics).hashes()


def _length_classes(
    lengths: np.ndarray[Any, np.dtype[np.int64]],
) -> list[tuple[np.ndarray[Any, Any] | None, int]]:
    """``(rows, words)`` groups to read as one ``(words, rows)`` matrix (``None``: all rows).

    Rows of up to 64 bytes go together; longer rows by length class (words <= 8, 32, 128,
    ...), so that a class's matrix is at most 4x its bytes.
    """
    longest = int(lengths.max())
    if longest <= 8 * _SHORT_WORDS:
        return [(None, max(1, (longest + 7) // 8))]
    out: list[tuple[np.ndarray[Any, Any] | None, int]] = []
    row_words = (lengths + 7) // 8
    low, high = 0, _SHORT_WORDS
    while low * 8 < longest:
        rows = np.flatnonzero((row_words > low) & (row_words <= high) if low else row_words <= high)
        if len(rows):
            out.append((rows, max(1, int(row_words[rows].max()))))
        low, high = high, 4 * high
    return out


def _gather_ranges(
    data: np.ndarray[Any, Any], starts: np.ndarray[Any, np.dtype[np.int64]], counts: np.ndarray[Any, Any]
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, np.dtype[np.int64]]]:
    """The ranges ``[start, start + count)`` of ``data`` back to back, and their new starts."""
    ends = np.cumsum(counts)
    new_starts = ends - counts
    size = int(ends[-1]) if len(ends) else 0
    return data[np.repeat(starts - new_starts, counts) + np.arange(size)], new_starts


def _fmix64(h: np.ndarray[Any, np.dtype[np.uint64]]) -> np.ndarray[Any, np.dtype[np.uint64]]:
    s33 = np.uint64(33)
    h ^= h >> s33
    h *= _FMIX1
    h ^= h >> s33
    h *= _FMIX2
    h ^= h >> s33
    return h
