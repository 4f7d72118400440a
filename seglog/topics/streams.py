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
  hash table held in NumPy arrays for all shards: Python's ``hash`` of each topic, then
  vectorised probes, then one Arrow comparison that checks every hit against the cached
  topic (a hash collision is a miss, never a wrong stream). Only misses walk a trie, one
  by one in offset order. A Python dict of 100,000 topics costs a cache miss or three per
  lookup; the vectorised probes overlap theirs.

* **Watches.** Subscriptions ask whether a stream got records since a position, to skip
  the read of a stream an append missed (:meth:`StreamStamper.watch`). Only watched
  streams are noted, per stamp call, so a database without subscriptions pays nothing.

Thread safety: one lock guards the tries and the cache; the event loop stamps, an I/O
worker snapshots or cuts.
"""

from __future__ import annotations

__all__ = ["SNAPSHOT_MAGIC", "StreamStamper"]

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

SNAPSHOT_MAGIC: Final = b"SLSN"
_SNAPSHOT_VERSION: Final = 1
# magic, version, covered end, node count, stream count, LTS bytes length
_SNAP_HEAD: Final = struct.Struct("<4sBqIII")
_CRC: Final = struct.Struct("<I")
_N_ROOTS: Final = 2
_MIX: Final = np.int64(-7046029254386353131)  # 0x9E3779B97F4A7C15 as int64: spreads shard numbers
_MIN_BUCKETS: Final = 1 << 7
_WAYS: Final = 8
_MAX_TOPIC_CHUNKS: Final = 16
_DEAD: Final = -1  # entry_shard of a dropped cache entry
_UNKNOWN: Final = 1 << 62  # a watch not yet resolved: the stream may have rows anywhere
# topic_hashes: the low k bytes of a word (index k), odd multipliers per word position
# (a splitmix64 sequence, grown on demand), the length's multiplier and fmix64's constants.
_TAIL_MASKS: Final = np.array([(1 << (8 * k)) - 1 for k in range(9)], np.uint64)
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


class StreamStamper:
    """The tries of every shard of one database and the ``(shard, topic) -> stream`` cache.

    Args:
        shards: Number of shards.
        thresholds: The database's LTS thresholds (see :class:`~seglog.topics.LTS`).
        key_bits: Bits of the cache keys (64). Fewer force hash collisions, for tests: a
            collision costs a trie walk, never a wrong stream.
    """

    def __init__(self, shards: int, thresholds: Sequence[int], *, key_bits: int = 64) -> None:
        if not 1 <= key_bits <= 64:
            raise InvalidArgument(f"key_bits must be in 1..64, not {key_bits!r}")
        self.thresholds = tuple(LTS(thresholds, cache_size=0).thresholds)  # validated
        self._key_mask = np.int64(-1) if key_bits == 64 else np.int64((1 << key_bits) - 1)
        self._tries: list[_ShardTrie | None] = [None] * shards
        self._lock = threading.Lock()
        # shard -> watched stream -> the last offset it was stamped at (an upper bound), or
        # _UNKNOWN until the shard's next stamp.
        self._watched: dict[int, dict[int, int]] = {}
        self._reset_cache()

    # --- the cache ----------------------------------------------------------------------

    def _reset_cache(self) -> None:
        # Buckets of _WAYS slots: key (hash of shard and topic; 0 marks a free slot), entry and
        # shard << 32 | stream. One gather of a bucket's keys (one cache line) finds a key
        # without probing; a bucket that filled up sends later keys to a small dict.
        self._init_table(_MIN_BUCKETS)
        self._n = 0
        self._n_reserve = 0
        self._dead = 0
        self._hash = np.empty(_MIN_BUCKETS * _WAYS // 2, np.int64)
        self._shard = np.empty(_MIN_BUCKETS * _WAYS // 2, np.int32)
        self._stream = np.empty(_MIN_BUCKETS * _WAYS // 2, np.uint32)
        self._topic_chunks: list[pa.Array] = []
        self._topics: pa.ChunkedArray | None = None
        self._new_topics: list[str] = []

    def _init_table(self, buckets: int) -> None:
        self._mask = buckets - 1
        self._b_key = np.zeros((buckets, _WAYS), np.int64)
        self._b_entry = np.full((buckets, _WAYS), -1, np.int32)
        self._b_fill = np.zeros(buckets, np.int64)
        self._stash: dict[int, list[int]] = {}  # key -> entries, for keys of full buckets

    @property
    def cached_topics(self) -> int:
        """Entries in the cache (for tests and stats)."""
        return self._n - self._dead

    def _keys(
        self, topics: pa.Array, shards: np.ndarray[Any, Any] | int
    ) -> np.ndarray[Any, np.dtype[np.int64]]:
        """The cache key of every row: the hash of its topic's bytes mixed with its shard."""
        h = topic_hashes(topics)
        if isinstance(shards, np.ndarray):
            h ^= shards.astype(np.int64) * _MIX  # array arithmetic wraps: fine for a hash
        elif shards:
            h ^= (np.array([shards], np.int64) * _MIX)[0]
        h &= self._key_mask
        h[h == 0] = 1  # 0 marks a free slot
        return h

    def _probe(self, keys: np.ndarray[Any, np.dtype[np.int64]]) -> np.ndarray[Any, np.dtype[np.int64]]:
        """The first entry with each key (-1: none); topics and shards are checked by the caller."""
        n = len(keys)
        if self._n == 0 or n == 0:
            return np.full(n, -1, np.int64)
        pos = keys & self._mask
        # np.take on flat indices: several times faster than 2-D fancy indexing.
        eq = np.take(self._b_key, pos, axis=0) == keys[:, None]
        way = eq.argmax(axis=1)
        entry: np.ndarray[Any, np.dtype[np.int64]] = np.take(
            self._b_entry.reshape(-1), pos * _WAYS + way
        ).astype(np.int64)
        missing = ~np.take(eq.reshape(-1), np.arange(0, n * _WAYS, _WAYS) + way)
        if missing.any():
            entry[missing] = -1
            if self._stash:
                for row in np.flatnonzero(missing).tolist():
                    found = self._stash.get(int(keys[row]))
                    if found:
                        entry[row] = found[0]
        return entry

    def _rehash(self, *, grow: bool) -> None:
        """Rebuild the table from the live entries (doubling it when ``grow``), vectorised."""
        self._flush_topics()
        live = np.flatnonzero(self._shard[: self._n] != _DEAD)
        buckets = self._mask + 1
        if grow:
            # Room for twice the entries, the table then at most half full: a bucket of 8
            # overflows rarely (Poisson, mean <= 4).
            want = max(len(live), self._n_reserve - (self._n - len(live)))
            buckets = _MIN_BUCKETS
            while buckets * _WAYS // 2 < 2 * want:
                buckets *= 2
        size = buckets * _WAYS // 2
        self._hash = _resized(self._hash[live], size)
        self._shard = _resized(self._shard[live], size)
        self._stream = _resized(self._stream[live], size)
        if self._topics is not None and len(live) != self._n:
            kept = self._topics.take(pa.array(live))
            self._topic_chunks = [kept.combine_chunks() if isinstance(kept, pa.ChunkedArray) else kept]
            self._topics = pa.chunked_array(self._topic_chunks, pa.string())
        n = self._n = len(live)
        self._dead = 0
        self._init_table(buckets)
        if n:
            self._place_many(np.arange(n))

    def _flush_topics(self) -> None:
        """Move topics cached since the last call into the Arrow storage used to verify hits."""
        if not self._new_topics:
            return
        chunks = self._topic_chunks
        chunks.append(pa.array(self._new_topics, pa.string()))
        self._new_topics = []
        # Sizes at least halve along the list (merged like a binary counter): few chunks,
        # and every topic is copied O(log n) times in all.
        while len(chunks) > 1 and (len(chunks[-1]) * 2 >= len(chunks[-2]) or len(chunks) > _MAX_TOPIC_CHUNKS):
            last = chunks.pop()
            chunks[-1] = pa.concat_arrays([chunks[-1], last])
        self._topics = pa.chunked_array(chunks, pa.string())

    def _drop_cached(self, shard: int, first_stream: int) -> None:
        """Make entries of ``shard`` with a stream ``>= first_stream`` unfindable."""
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
        with self._lock:
            keys = self._keys(topics, shards)
            entry = self._probe(keys)
            found = entry >= 0
            n_found = int(found.sum())
            safe = np.where(found, entry, 0) if n_found != n else entry
            if n_found:
                self._flush_topics()
                assert self._topics is not None
                if n_found == n:
                    cached = self._topics.take(pa.array(entry))
                    found = pc.equal(cached, topics).to_numpy(zero_copy_only=False)
                    found &= self._shard[entry] == shards
                else:
                    rows = np.flatnonzero(found)
                    cached = self._topics.take(pa.array(entry[rows]))
                    same = pc.equal(cached, topics.take(pa.array(rows))).to_numpy(zero_copy_only=False)
                    want = shards[rows] if isinstance(shards, np.ndarray) else shards
                    same &= self._shard[entry[rows]] == want
                    found[rows[~same]] = False
            out = self._stream[safe] if self._n else np.zeros(n, np.uint32)
            misses = np.flatnonzero(~found)
            if len(misses):
                self._learn_rows(out, misses, topics, keys, shards, offsets)
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
        topics: pa.Array,
        keys: np.ndarray[Any, Any],
        shards: np.ndarray[Any, Any] | int,
        offsets: np.ndarray[Any, Any] | int,
    ) -> None:
        """Learn the rows the cache missed, in row order per shard, and cache them.

        Repeats among the misses are found with NumPy (by key, then checked exactly), so
        the tries only walk each new ``(shard, topic)`` once.
        """
        miss_keys = keys[misses]
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
        self._insert_many(keys[rows], row_shards.astype(np.int64), learned, row_topics)

    def _insert_many(
        self,
        keys: np.ndarray[Any, Any],
        shards: np.ndarray[Any, Any],
        streams: np.ndarray[Any, Any],
        topics: list[str],
    ) -> None:
        """Cache new entries (vectorised placement into buckets; a full bucket's go to the stash)."""
        if self._n:
            # A key already cached belongs to another (shard, topic) (a 64-bit collision):
            # that one stays uncached (learned on every append) rather than piling up copies.
            fresh = self._probe(keys) < 0
            if not fresh.all():
                keep = np.flatnonzero(fresh)
                keys, shards, streams = keys[keep], shards[keep], streams[keep]
                topics = [topics[i] for i in keep.tolist()]
        m = len(keys)
        if not m:
            return
        if self._n + m > len(self._hash):
            self._n_reserve = self._n + m
            self._rehash(grow=True)
        lo, hi = self._n, self._n + m
        self._hash[lo:hi] = keys
        self._shard[lo:hi] = shards
        self._stream[lo:hi] = streams
        self._new_topics.extend(topics)
        self._n = hi
        self._place_many(np.arange(lo, hi))

    def _place_many(self, entries: np.ndarray[Any, Any]) -> None:
        keys = self._hash[entries]
        pos = keys & self._mask
        order = np.argsort(pos, kind="stable")
        sorted_pos = pos[order]
        n = len(entries)
        starts = np.flatnonzero(np.r_[True, sorted_pos[1:] != sorted_pos[:-1]])
        counts = np.diff(np.r_[starts, n])
        way = self._b_fill[sorted_pos] + (np.arange(n) - np.repeat(starts, counts))
        fits = way < _WAYS
        e = entries[order][fits]
        p, w = sorted_pos[fits], way[fits]
        self._b_key[p, w] = self._hash[e]
        self._b_entry[p, w] = e
        np.add.at(self._b_fill, p, 1)
        for k in entries[order][~fits].tolist():
            self._stash.setdefault(int(self._hash[k]), []).append(k)

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


def topic_hashes(topics: pa.Array) -> np.ndarray[Any, np.dtype[np.int64]]:
    """A 64-bit hash of every value's bytes, for a whole column with NumPy.

    No Python object per row. A row of ``L >= 8`` bytes is read as the 8-byte words at
    ``min(8 k, L - 8)`` (the last word overlaps its predecessor), so every read lies inside
    the row; a
    row under 8 bytes is one word with the bytes past its end masked off. Each word is
    multiplied by an odd constant of its position and the products of the row's
    ``ceil(L / 8)`` words summed (two rows that differ in one word never collide), then the length is mixed in and MurmurHash3's
    ``fmix64`` spreads the bits. Equal values hash equal, in any process; the hash is a
    cache key, verified against the cached topic, and never stored.

    Args:
        topics: A string (or large string / binary) array without nulls.

    Returns:
        One int64 per row.
    """
    n = len(topics)
    if n == 0:
        return np.empty(0, np.int64)
    if topics.type not in (pa.string(), pa.binary()):
        topics = topics.cast(pa.string() if pa.types.is_unicode(topics.type) else pa.binary())
    _validity, offsets_buf, data_buf = topics.buffers()[:3]
    offsets = np.frombuffer(offsets_buf, np.int32, n + 1, topics.offset * 4).astype(np.int64)
    first = int(offsets[0])
    size = int(offsets[-1]) - first
    starts = offsets[:-1] - first
    lengths = offsets[1:] - offsets[:-1]
    longest = int(lengths.max())
    # The bytes, with 8 zero bytes after them: a short last row reads its word whole.
    padded = np.zeros(size + 8, np.uint8)
    if size:
        padded[:size] = np.frombuffer(data_buf, np.uint8, size, first)
    unaligned = np.ndarray((size + 1,), np.uint64, buffer=padded, strides=(1,))
    if longest <= 8 * _SHORT_WORDS:
        x = _sum_words(unaligned, starts, lengths, max(1, (longest + 7) // 8))
    else:
        # Long rows by length class (words <= 8, 32, 128, ...): a class's (words, rows)
        # matrix is at most 4x its bytes.
        x = np.empty(n, np.uint64)
        row_words = (lengths + 7) // 8
        low, high = 0, _SHORT_WORDS
        while low * 8 < longest:
            rows = np.flatnonzero((row_words > low) & (row_words <= high) if low else row_words <= high)
            if len(rows):
                words = int(row_words[rows].max())
                x[rows] = _sum_words(unaligned, starts[rows], lengths[rows], words)
            low, high = high, 4 * high
    x += lengths.astype(np.uint64) * _LENGTH_MULT
    return _fmix64(x).view(np.int64)


def _sum_words(
    unaligned: np.ndarray[Any, np.dtype[np.uint64]],
    starts: np.ndarray[Any, np.dtype[np.int64]],
    lengths: np.ndarray[Any, np.dtype[np.int64]],
    words: int,
) -> np.ndarray[Any, np.dtype[np.uint64]]:
    """``sum(word k of a row * multiplier k)`` over ``k < words`` (see :func:`topic_hashes`)."""
    last = np.maximum(lengths - 8, 0)
    if words == 1:
        w = np.take(unaligned, starts)
    else:
        steps = np.arange(0, 8 * words, 8, dtype=np.int64)[:, None]
        w = np.take(unaligned, np.minimum(steps, last) + starts)  # (words, rows)
        if int(lengths.min()) <= 8 * (words - 1):
            w *= steps < lengths  # words past a row's end count nothing
    if bool((lengths < 8).any()):
        w &= _TAIL_MASKS[np.minimum(lengths, 8)]
    if words == 1:
        out: np.ndarray[Any, np.dtype[np.uint64]] = w * _word_multipliers(1)[0]
        return out
    w *= _word_multipliers(words)[:, None]
    out = w.sum(axis=0, dtype=np.uint64)
    return out


def _fmix64(h: np.ndarray[Any, np.dtype[np.uint64]]) -> np.ndarray[Any, np.dtype[np.uint64]]:
    s33 = np.uint64(33)
    h ^= h >> s33
    h *= _FMIX1
    h ^= h >> s33
    h *= _FMIX2
    h ^= h >> s33
    return h


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
