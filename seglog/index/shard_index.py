"""One shard's view of its database's sparse LMDB indexes: offset, time, key and tag.

Every shard of a database keeps its indexes in the database's one LMDB environment
(``<db>/index/``, owned by :class:`~seglog.index.db_index.DbIndex`), so descriptors and
address-space maps do not grow with the shard count. Every key starts with the shard number
(big-endian u32), which makes each shard one contiguous key range of each named database:

* ``offset``: shard | frame base offset -> (segment base, file position); an entry for the
  first frame of every segment and then one every ``index_interval_bytes``. Lookup is a
  floor search followed by a forward scan of frame headers.
* ``time``: shard | (running max ts, offset after that frame) -> empty. Written when the
  shard's running maximum timestamp grew and ``index_interval_bytes`` passed. The last entry
  whose max is below ``ts`` proves that every record before its offset is older than ``ts``.
* ``keyframe``: shard | frame base offset -> the frame's distinct keys (a summary), for keyed
  frames not merged into postings yet; ``key``: shard | key | run base -> the frames of that
  run holding the key (postings). See :mod:`seglog.index.keys`: the key index costs one
  entry per frame plus one per distinct key per run, never one per record.
* ``tag``: shard | (tag, frame base offset) -> (segment base, file position), one entry per
  distinct tag (the stream id) of a frame.
* ``meta``: shard | ``indexed_end`` -- every frame of the shard below this offset is indexed.

Entries are written only after the frames they point to are durable, in one write
transaction per I/O batch (:func:`add_many`, which may cover many shards). A view's
in-memory state moves only after that transaction committed.
"""

from __future__ import annotations

import bisect
import functools
import logging
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, NamedTuple, ParamSpec, TypeVar

import lmdb
import numpy as np
import pyarrow as pa

from seglog.errors import StorageError
from seglog.index.keys import (
    DistinctKeys,
    decode_postings,
    decode_summary,
    distinct_keys,
    distinct_keys_many,
    encode_postings,
    encode_summary,
    frames_holding,
    merge_postings,
    normalize_key,
    posting_prefix,
    summary_head,
)

log = logging.getLogger("seglog.index")

__all__ = [
    "DEFAULT_INDEX_INTERVAL_BYTES",
    "DEFAULT_MERGE_FRAMES",
    "DEFAULT_MERGE_PAIRS",
    "FrameEntry",
    "IndexPosition",
    "IndexTables",
    "ShardIndex",
    "add_many",
]

DEFAULT_INDEX_INTERVAL_BYTES: Final = 4096
# Summaries of one segment are merged into postings once this many frames (or this many
# (frame, distinct key) pairs) accumulated: lookups test at most about this many summaries,
# and a merge's cost stays bounded (it runs inside an append's index transaction).
DEFAULT_MERGE_FRAMES: Final = 256
DEFAULT_MERGE_PAIRS: Final = 1 << 18
# Shards fed in step (a drain writes a frame to every tailed shard) reach the merge threshold
# in the same transaction: 16 merges of 8-11 ms each held the GIL for 60-80 ms in one go,
# every ~1.3 s at 16 shards and 50k records/s, and stalled the event loop and the I/O worker.
# At most this many shards merge per transaction; the others keep their summaries (a few
# more than the threshold) and merge in the next ones, a few tens of ms apart. A shard at
# twice the threshold merges whatever the count: with more shards due per transaction than
# this (thousands of shards written in step) deferral must not grow the summaries forever.
MAX_MERGES_PER_TXN: Final = 2
_U32: Final = struct.Struct(">I")
_U64: Final = struct.Struct(">Q")
_U64_PAIR: Final = struct.Struct(">QQ")
_U32_U64: Final = struct.Struct(">IQ")
# A tag entry's key: shard | tag | frame base offset.
_TAG_KEY: Final = struct.Struct(">IIQ")
# Up to this many tag entries in one plan are built in Python, not NumPy (see _tag_items).
_FEW_TAG_ITEMS: Final = 64
_TS_BIAS: Final = 1 << 63
INDEXED_END_KEY: Final = b"indexed_end"

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _lookup(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Turn failures of a lookup into :class:`StorageError`.

    Besides LMDB's own errors, an entry a torn index garbled fails to decode (struct,
    NumPy or Arrow errors): the caller then treats the index as suspect and rebuilds it.
    """

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return fn(*args, **kwargs)
        except (lmdb.Error, struct.error, ValueError, pa.ArrowException) as exc:
            raise StorageError(f"index lookup failed: {exc}") from exc

    return wrapper


class IndexPosition(NamedTuple):
    """A frame's place on disk: segment base offset and byte position in that file."""

    segment_base: int
    pos: int


class FrameEntry(NamedTuple):
    """What the index needs to know about one durable frame."""

    base_offset: int
    next_offset: int
    max_ts: int
    segment_base: int
    pos: int
    size: int
    keys: pa.Array | None  # the frame's key column (nullable binary); None: no keys
    tags: Iterable[int]  # distinct tags (stream ids) of the frame (a sorted uint32 array is fastest)


class IndexTables(NamedTuple):
    """The open environment of a database's index and its named databases."""

    path: Path
    env: Any  # lmdb.Environment
    offset: Any
    time: Any
    key: Any
    keyframe: Any
    tag: Any
    meta: Any


class _Pending(NamedTuple):
    """A summary not merged into postings yet."""

    base: int
    segment_base: int
    next_offset: int
    keys: int  # distinct keys


@dataclass
class _Plan:
    """One view's share of an :func:`add_many` transaction and the state it leads to."""

    offset_items: list[tuple[bytes, bytes]]
    time_items: list[tuple[bytes, bytes]]
    tag_items: list[tuple[bytes, bytes]]
    summaries: list[tuple[int, int, int, DistinctKeys]]  # base, segment base, next offset, keys
    segment_base: int  # of the last new frame
    indexed_end: int
    since_offset: int
    since_time: int
    running_max: int | None
    # Set inside the transaction: either the summaries kept after a merge (``replaced``), or
    # the list to extend with ``appended`` (no merge: the common case, no copy of the list).
    replaced: list[_Pending] | None = None
    extend: list[_Pending] = field(default_factory=list)
    appended: list[_Pending] = field(default_factory=list)
    pairs: int = 0


def add_many(tables: IndexTables, batches: Sequence[tuple[ShardIndex, Sequence[FrameEntry]]]) -> None:
    """Index durable frames of many shards of one database in ONE write transaction.

    Args:
        tables: The database's environment.
        batches: ``(view, frames in offset order)``; a view may appear more than once (its
            frames are taken in the order given).

    Nothing changes, in memory or on disk, unless the transaction commits.

    Raises:
        StorageError: The transaction failed.
    """
    try:
        groups: list[tuple[ShardIndex, Sequence[FrameEntry]]]
        if len(batches) == 1:
            groups = [batches[0]]
        else:
            grouped: dict[int, tuple[ShardIndex, list[FrameEntry]]] = {}
            for view, frames in batches:
                grouped.setdefault(id(view), (view, []))[1].extend(frames)
            groups = list(grouped.values())
        # Every frame's key summary at once (a drain of many shards: a small frame each).
        summaries = iter(
            distinct_keys_many([f.keys for _, frames in groups for f in frames if f.keys is not None])
        )
        plans = [
            (view, view._plan(frames, [None if f.keys is None else next(summaries) for f in frames]))
            for view, frames in groups
        ]
        todo = [(view, plan) for view, plan in plans if plan is not None]
        if not todo:
            return
        merges_left = MAX_MERGES_PER_TXN
        with tables.env.begin(write=True) as txn:
            for view, plan in todo:
                if view._write(txn, plan, may_merge=merges_left > 0):
                    merges_left -= 1
    except (lmdb.Error, ValueError, pa.ArrowException) as exc:
        # Arrow errors too (a key column it cannot take): the frames are durable already, so
        # the caller must see an index failure (it catches up later), not a write failure.
        raise StorageError(f"index write failed at {tables.path}") from exc
    for view, plan in todo:
        view._apply(plan)


class ShardIndex:
    """The sparse indexes of one shard: a view of its key range (see the module docstring).

    Created by :meth:`DbIndex.shard <seglog.index.db_index.DbIndex.shard>`; closed with it.
    Writes come from the shard's one writer thread; lookups are safe from any thread.
    """

    def __init__(
        self,
        tables: IndexTables,
        number: int,
        *,
        indexed_end: int,
        rebuilt: bool,
        index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES,
        merge_frames: int = DEFAULT_MERGE_FRAMES,
        merge_pairs: int = DEFAULT_MERGE_PAIRS,
    ) -> None:
        self._t = tables
        self.number = number
        self.index_interval_bytes = index_interval_bytes
        #: Every frame of the shard below this offset is indexed.
        self.indexed_end = indexed_end
        #: Whether this open found the index unusable and started it empty (callers re-index).
        self.rebuilt = rebuilt
        self._prefix = _U32.pack(number)
        self._merge_frames = merge_frames
        self._merge_pairs = merge_pairs
        # Summaries not merged yet, ascending, and their keys in all; None until the first
        # write loads them.
        self._pending: list[_Pending] | None = None
        self._pending_pairs = 0
        self._reset_sparse_state()

    def __repr__(self) -> str:
        return f"ShardIndex({str(self._t.path)!r}, shard={self.number})"

    def _reset_sparse_state(self) -> None:
        # Recomputed conservatively (the next frame gets entries) after open or a cut.
        self._bytes_since_offset_entry = self.index_interval_bytes
        self._bytes_since_time_entry = self.index_interval_bytes
        self._running_max_ts: int | None = None
        self._last_segment_base: int | None = None

    def _k(self, *parts: bytes) -> bytes:
        return self._prefix + b"".join(parts)

    def reset(self) -> None:
        """Drop every entry of this shard (it disagreed with the segments); the caller re-indexes.

        Other shards' entries are untouched.

        Raises:
            StorageError: The entries could not be cleared.
        """
        log.warning(
            "%s shard %d: clearing the index to rebuild it from the segments", self._t.path, self.number
        )
        t = self._t
        try:
            with t.env.begin(write=True) as txn:
                for db in (t.offset, t.time, t.key, t.keyframe, t.tag):
                    _delete_range(txn.cursor(db), self._prefix, self._prefix)
                txn.put(self._k(INDEXED_END_KEY), _U64.pack(0), db=t.meta)
        except lmdb.Error as exc:
            raise StorageError(f"cannot clear index of shard {self.number} at {t.path}") from exc
        self.indexed_end = 0
        self._set_pending([])
        self._reset_sparse_state()

    # --- writing -----------------------------------------------------------------------

    def add(self, frames: Sequence[FrameEntry]) -> None:
        """Index durable frames (in offset order) in one write transaction (:func:`add_many`).

        Raises:
            StorageError: The transaction failed.
        """
        add_many(self._t, [(self, frames)])

    def merge_likely(self, frames: int, segment_base: int) -> bool:
        """Whether indexing ``frames`` more frames of segment ``segment_base`` may merge
        summaries into postings (tens of ms): a cheap guess, erring towards yes, from the
        pending summaries (a writer takes such work off its acknowledgement path)."""
        pending = self._pending
        if pending is None:
            return True  # not loaded since open
        if pending and pending[0].segment_base != segment_base:
            return True  # the segment rolled: its summaries are merged whatever their number
        return len(pending) + frames >= self._merge_frames or 2 * self._pending_pairs >= self._merge_pairs

    def _plan(
        self, frames: Sequence[FrameEntry], distinct: Sequence[DistinctKeys | None] | None = None
    ) -> _Plan | None:
        """The entries of ``frames`` and the sparse state after them (no I/O); ``distinct``:
        each frame's :func:`distinct_keys` when the caller has them already."""
        offset_items: list[tuple[bytes, bytes]] = []
        time_items: list[tuple[bytes, bytes]] = []
        tag_items: list[tuple[bytes, bytes]] = []
        tag_parts: list[tuple[np.ndarray[Any, Any], int, bytes]] = []  # (tags, frame base, position)
        summaries: list[tuple[int, int, int, DistinctKeys]] = []
        interval = self.index_interval_bytes
        since_offset = self._bytes_since_offset_entry
        since_time = self._bytes_since_time_entry
        running_max = self._running_max_ts
        last_segment = self._last_segment_base
        indexed_end = self.indexed_end
        prefix = self._prefix
        for i, f in enumerate(frames):
            if f.next_offset <= indexed_end:
                continue  # already indexed (rebuild overlapping a live tail)
            position = _U64_PAIR.pack(f.segment_base, f.pos)
            since_offset += f.size
            if last_segment != f.segment_base or since_offset >= interval:
                offset_items.append((prefix + _U64.pack(f.base_offset), position))
                since_offset = 0
                last_segment = f.segment_base
            since_time += f.size
            if running_max is None or f.max_ts > running_max:
                running_max = f.max_ts
                if since_time >= interval:
                    time_items.append((prefix + _U64_PAIR.pack(f.max_ts + _TS_BIAS, f.next_offset), b""))
                    since_time = 0
            if f.keys is not None:
                keys = distinct_keys(f.keys) if distinct is None else distinct[i]
                if keys is not None:
                    summaries.append((f.base_offset, f.segment_base, f.next_offset, keys))
            tags = f.tags if isinstance(f.tags, np.ndarray) else np.fromiter(f.tags, np.uint32)
            if len(tags):
                tag_parts.append((tags, f.base_offset, position))
            indexed_end = f.next_offset
        if last_segment is None or indexed_end == self.indexed_end:
            return None
        if tag_parts:
            tag_items = self._tag_items(tag_parts)
        return _Plan(
            offset_items,
            time_items,
            tag_items,
            summaries,
            last_segment,
            indexed_end,
            since_offset,
            since_time,
            running_max,
        )

    def _tag_items(self, parts: list[tuple[np.ndarray[Any, Any], int, bytes]]) -> list[tuple[bytes, bytes]]:
        """``(shard | tag | frame base, position)`` of every frame's tags, sorted by key.

        Built with NumPy: a frame of interleaved streams has one entry per stream. A few
        entries (a drain's one small frame of a shard, often of a single stream) are packed
        one by one instead: NumPy's fixed cost per call is most of a small batch's cost.
        """
        counts = [len(t) for t, _, _ in parts]
        total = sum(counts)
        if total <= _FEW_TAG_ITEMS:
            pack, shard = _TAG_KEY.pack, self.number
            items = [(pack(shard, tag, base), pos) for tags, base, pos in parts for tag in tags.tolist()]
            if len(parts) > 1:
                items.sort()  # big-endian keys: by (tag, base) as below; keys are distinct
            return items
        rec = np.empty(total, dtype=[("shard", ">u4"), ("tag", ">u4"), ("base", ">u8")])
        rec["shard"] = self.number
        rec["tag"] = np.concatenate([t for t, _, _ in parts]) if len(parts) > 1 else parts[0][0]
        rec["base"] = np.repeat(np.array([b for _, b, _ in parts], np.uint64), counts)
        which = np.repeat(np.arange(len(parts)), counts)
        if len(parts) > 1:
            order = np.lexsort((rec["base"], rec["tag"]))
            rec, which = rec[order], which[order]
        positions = [p for _, _, p in parts]
        return list(zip(rec.view("V16").tolist(), [positions[i] for i in which.tolist()], strict=True))

    def _write(self, txn: Any, plan: _Plan, *, may_merge: bool = True) -> bool:
        """Put ``plan`` into the write transaction ``txn``, merging summaries that are due
        (if ``may_merge``: otherwise they wait); return whether it merged."""
        t = self._t
        if plan.offset_items:
            txn.cursor(t.offset).putmulti(plan.offset_items)
        if plan.time_items:
            txn.cursor(t.time).putmulti(plan.time_items)
        if plan.tag_items:
            txn.cursor(t.tag).putmulti(plan.tag_items)
        if self._pending is None:
            old = self._load_pending(txn)
            pairs = sum(p.keys for p in old)
        else:
            old, pairs = self._pending, self._pending_pairs
        new: dict[int, bytes] = {}
        appended: list[_Pending] = []
        for base, seg, nxt, keys in plan.summaries:
            new[base] = encode_summary(seg, nxt, keys)
            appended.append(_Pending(base, seg, nxt, keys.size))
            pairs += keys.size
        count = len(old) + len(appended)
        first = old[0] if old else appended[0] if appended else None
        due = first is not None and (
            first.segment_base != plan.segment_base
            or count >= self._merge_frames
            or pairs >= self._merge_pairs
        )
        overdue = count >= 2 * self._merge_frames or pairs >= 2 * self._merge_pairs
        merged = due and (may_merge or overdue)
        if not merged:
            # Nothing due (all in the current segment, below the thresholds), or it waits for
            # a later transaction (MAX_MERGES_PER_TXN).
            if appended:
                txn.cursor(t.keyframe).putmulti([(self._k(_U64.pack(p.base)), new[p.base]) for p in appended])
            plan.extend, plan.appended, plan.pairs = old, appended, pairs
        else:
            plan.replaced = self._merge_due(txn, [*old, *appended], new, plan.segment_base)
            plan.pairs = sum(p.keys for p in plan.replaced)
        txn.put(self._k(INDEXED_END_KEY), _U64.pack(plan.indexed_end), db=t.meta)
        return merged

    def _merge_due(
        self, txn: Any, pending: list[_Pending], new: dict[int, bytes], segment_base: int
    ) -> list[_Pending]:
        """Merge the runs of ``pending`` that are due into postings; return the summaries kept.

        ``new`` holds the summaries of this transaction (not put yet: a merged one never is).
        """
        t = self._t
        keep, runs = self._due_runs(pending, segment_base)
        for run in runs:
            frames = []
            for p in run:
                blob = new.get(p.base)
                if blob is None:
                    blob = txn.get(self._k(_U64.pack(p.base)), db=t.keyframe)
                    txn.delete(self._k(_U64.pack(p.base)), db=t.keyframe)
                if blob is not None:  # a lost summary (torn index) is caught by a rebuild, not here
                    frames.append((p.base, decode_summary(blob).keys))
            items = merge_postings(self._prefix, run[0].base, run[-1].next_offset, frames)
            if items:
                txn.cursor(t.key).putmulti(items)
        keyframes = [(self._k(_U64.pack(p.base)), new[p.base]) for p in keep if p.base in new]
        if keyframes:
            txn.cursor(t.keyframe).putmulti(keyframes)
        return keep

    def _apply(self, plan: _Plan) -> None:
        """The transaction holding ``plan`` committed: move the in-memory state."""
        self.indexed_end = plan.indexed_end
        self._bytes_since_offset_entry = plan.since_offset
        self._bytes_since_time_entry = plan.since_time
        self._running_max_ts = plan.running_max
        self._last_segment_base = plan.segment_base
        if plan.replaced is not None:
            self._pending = plan.replaced
        else:
            plan.extend.extend(plan.appended)
            self._pending = plan.extend
        self._pending_pairs = plan.pairs

    def _set_pending(self, pending: list[_Pending]) -> None:
        self._pending = pending
        self._pending_pairs = sum(p.keys for p in pending)

    def _load_pending(self, txn: Any) -> list[_Pending]:
        out: list[_Pending] = []
        cur = txn.cursor(self._t.keyframe)
        if not cur.set_range(self._prefix):
            return out
        for k, v in cur.iternext():
            if not k.startswith(self._prefix):
                break
            seg, nxt, n = summary_head(v)
            out.append(_Pending(_U64.unpack_from(k, 4)[0], seg, nxt, n))
        return out

    def _due_runs(
        self, pending: list[_Pending], current_segment: int
    ) -> tuple[list[_Pending], list[list[_Pending]]]:
        """Split summaries into those kept and runs to merge now.

        A run never spans segments (a posting belongs to one segment, so retention and cuts
        stay per segment). The summaries of a segment other than the current one (it
        rolled) are merged whatever their number; the current segment's in runs of
        ``merge_frames`` frames or ``merge_pairs`` keys.
        """
        keep: list[_Pending] = []
        runs: list[list[_Pending]] = []
        run: list[_Pending] = []
        pairs = 0
        for i, p in enumerate(pending):
            run.append(p)
            pairs += p.keys
            last_of_segment = i + 1 == len(pending) or pending[i + 1].segment_base != p.segment_base
            full = len(run) >= self._merge_frames or pairs >= self._merge_pairs
            if full or (last_of_segment and p.segment_base != current_segment):
                runs.append(run)
                run, pairs = [], 0
            elif last_of_segment:
                keep.extend(run)
                run, pairs = [], 0
        return keep, runs

    def truncate_from(self, offset: int) -> None:
        """Drop every entry that points at or past ``offset`` (the log was cut there).

        Raises:
            StorageError: The transaction failed.
        """
        end = min(self.indexed_end, offset)
        t = self._t
        prefix = self._prefix
        try:
            with t.env.begin(write=True) as txn:
                _delete_range(txn.cursor(t.offset), self._k(_U64.pack(offset)), prefix)
                _delete_where(txn.cursor(t.time), prefix, lambda k: _U64_PAIR.unpack_from(k, 4)[1] > offset)
                _delete_where(txn.cursor(t.tag), prefix, lambda k: _U32_U64.unpack_from(k, 4)[1] >= offset)
                _delete_range(txn.cursor(t.keyframe), self._k(_U64.pack(offset)), prefix)
                _cut_postings(txn.cursor(t.key), prefix, offset)
                txn.put(self._k(INDEXED_END_KEY), _U64.pack(end), db=t.meta)
        except lmdb.Error as exc:
            raise StorageError(f"index cut of shard {self.number} failed at {t.path}") from exc
        self.indexed_end = end
        if self._pending is not None:
            self._set_pending([p for p in self._pending if p.base < offset])
        self._reset_sparse_state()

    def delete_below(self, offset: int) -> None:
        """Drop entries for data below ``offset`` (retention removed it).

        Key entries are dropped only for frames (runs) wholly below ``offset``: a frame that
        straddles it still has readable records.

        Raises:
            StorageError: The transaction failed.
        """
        t = self._t
        prefix = self._prefix
        try:
            with t.env.begin(write=True) as txn:
                _delete_range(txn.cursor(t.offset), prefix, prefix, below=self._k(_U64.pack(offset)))
                _delete_where(txn.cursor(t.tag), prefix, lambda k: _U32_U64.unpack_from(k, 4)[1] < offset)
                gone = _drop_summaries_below(txn.cursor(t.keyframe), prefix, offset)
                _delete_where(
                    txn.cursor(t.key),
                    prefix,
                    lambda k: False,
                    value_doomed=lambda v: decode_postings(v)[0] <= offset,
                )
        except lmdb.Error as exc:
            raise StorageError(f"index cleanup of shard {self.number} failed at {t.path}") from exc
        if self._pending is not None:
            self._set_pending([p for p in self._pending if p.base not in gone])

    # --- lookups (microsecond-scale; safe from any thread) -----------------------------

    @_lookup
    def floor(self, offset: int) -> tuple[int, IndexPosition] | None:
        """The indexed frame with the greatest base offset ``<= offset``."""
        with self._t.env.begin(db=self._t.offset) as txn:
            k_v = _floor_item(txn.cursor(), self._prefix, self._k(_U64.pack(offset + 1)))
            if k_v is None:
                return None
            base = _U64.unpack_from(k_v[0], 4)[0]
            seg, pos = _U64_PAIR.unpack(k_v[1])
            return base, IndexPosition(seg, pos)

    @_lookup
    def time_lower_bound(self, ts: int) -> int | None:
        """An offset before which every record has a timestamp below ``ts`` (``None``: no bound)."""
        with self._t.env.begin(db=self._t.time) as txn:
            k_v = _floor_item(txn.cursor(), self._prefix, self._k(_U64_PAIR.pack(ts + _TS_BIAS, 0)))
            if k_v is None:
                return None
            return int(_U64_PAIR.unpack_from(k_v[0], 4)[1])

    @_lookup
    def key_frames(self, key: bytes, *, start: int = 0) -> list[int]:
        """Base offsets (ascending) of frames that may hold records with ``key``.

        A superset: a long key's digest may match other long keys, and the last candidate
        below ``start`` is included (it may be the frame that reaches past ``start``); the
        caller filters rows by the key.
        """
        norm = normalize_key(key)
        prefix = posting_prefix(self._prefix, norm)
        found: list[np.ndarray[Any, Any]] = []
        summaries: list[tuple[int, bytes]] = []
        t = self._t
        with t.env.begin() as txn:
            cur = txn.cursor(t.key)
            if cur.set_range(prefix):
                for k, v in cur.iternext():
                    if not k.startswith(prefix):
                        break
                    run_end, bases = decode_postings(v)
                    if run_end > start:
                        found.append(bases)
            cur = txn.cursor(t.keyframe)
            if cur.set_range(self._prefix):
                for k, v in cur.iternext():
                    if not k.startswith(self._prefix):
                        break
                    if summary_head(v)[1] > start:
                        summaries.append((_U64.unpack_from(k, 4)[0], v))
        merged = set(np.concatenate(found).tolist()) if found else set()
        merged.update(frames_holding(norm, summaries))
        out = sorted(merged)
        # Only the frame holding ``start`` can reach past it: the greatest base below it.
        first = bisect.bisect_left(out, start)
        return out[max(0, first - 1) :]

    @_lookup
    def tag_frames(
        self, tag: int, *, start: int = 0, limit: int | None = None
    ) -> list[tuple[int, IndexPosition]]:
        """(frame base offset, position) of frames holding records with ``tag``, ascending.

        Args:
            tag: The tag (a stream id).
            start: Only frames whose base offset is at least this.
            limit: At most this many (``None``: all).
        """
        out: list[tuple[int, IndexPosition]] = []
        with self._t.env.begin(db=self._t.tag) as txn:
            cur = txn.cursor()
            if not cur.set_range(self._k(_U32_U64.pack(tag, start))):
                return out
            for k, v in cur.iternext():
                if not k.startswith(self._prefix):
                    break
                t, base = _U32_U64.unpack_from(k, 4)
                if t != tag:
                    break
                out.append((base, IndexPosition(*_U64_PAIR.unpack(v))))
                if limit is not None and len(out) >= limit:
                    break
        return out


def _floor_item(cur: Any, prefix: bytes, above: bytes) -> tuple[bytes, bytes] | None:
    """The last item of the ``prefix`` range whose key is below ``above``."""
    if cur.set_range(above):
        if not cur.prev():
            return None
    elif not cur.last():
        return None
    k = cur.key()
    if not k.startswith(prefix):
        return None
    return k, cur.value()


def _delete_range(cur: Any, start: bytes, prefix: bytes, *, below: bytes | None = None) -> None:
    """Delete the keys from ``start`` that begin with ``prefix`` (and are ``< below``)."""
    if not cur.set_range(start):
        return
    while True:
        k = cur.key()
        if not k or not k.startswith(prefix) or (below is not None and k >= below):
            return
        if not cur.delete():
            return


def _delete_where(
    cur: Any,
    prefix: bytes,
    doomed: Callable[[bytes], bool],
    *,
    value_doomed: Callable[[bytes], bool] | None = None,
) -> None:
    """Delete the keys of the ``prefix`` range for which ``doomed`` (or ``value_doomed``) holds."""
    if not cur.set_range(prefix):
        return
    while True:
        k = cur.key()
        if not k or not k.startswith(prefix):
            return
        if doomed(k) or (value_doomed is not None and value_doomed(cur.value())):
            if not cur.delete():
                return
        elif not cur.next():
            return


def _drop_summaries_below(cur: Any, prefix: bytes, offset: int) -> set[int]:
    """Delete summaries of frames wholly below ``offset``; return their base offsets."""
    gone: set[int] = set()
    if not cur.set_range(prefix):
        return gone
    while True:
        k = cur.key()
        if not k or not k.startswith(prefix):
            return gone
        base = _U64.unpack_from(k, 4)[0]
        if base >= offset:
            return gone
        if summary_head(cur.value())[1] <= offset:
            gone.add(base)
            if not cur.delete():
                return gone
        elif not cur.next():
            return gone


def _cut_postings(cur: Any, prefix: bytes, offset: int) -> None:
    """Make every posting of the shard forget frames at or past ``offset``."""
    if not cur.set_range(prefix):
        return
    while True:
        k = cur.key()
        if not k or not k.startswith(prefix):
            return
        run_end, bases = decode_postings(cur.value())
        if run_end <= offset:
            if not cur.next():
                return
            continue
        kept = bases[bases < offset]
        if not len(kept):
            if not cur.delete():
                return
            continue
        cur.put(k, encode_postings(offset, kept))
        if not cur.next():
            return
