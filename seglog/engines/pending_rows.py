"""Acknowledged rows of one I/O worker that are not in their segments yet, kept per request.

A many-shard append gives each I/O worker one rows request: its rows in append order (not
grouped by shard) with each row's shard and offset. The rows are durable in the journal and
wait here until a flush writes them into their shards' segments as frames. Nothing is kept
per shard per request: a request costs one list entry and a few numpy assignments, whatever
the number of shards it touches (a list of per-shard tuples per request made the garbage
collector walk the heap every few hundred appends at 1024 shards). A shard's own rows are
found when needed:

* a flush of every pending shard concatenates the requests once and sorts them stably by
  shard (each shard's rows then stay in offset order);
* a flush of some shards and a read of one shard look only at the requests since the shard's
  first pending one (a read from a recent offset walks back from the newest request); the first
  read that needs a request's rows groups them by shard once (:meth:`PendingPart.shard_rows`),
  so reads of its other shards slice that copy.

Per-shard positions live in :class:`ShardArrays` (numpy, indexed by shard number) shared by
the event loop and the worker. The worker makes a request visible in this order: the list
entry, the shard's pending start, its durable end; a reader takes them in the reverse order
(durable end, list, pending start), so everything below the durable end it read is either in
the list it took or already in the segment (a flush writes the segment before it clears a
shard's pending start, and empties the list only after every shard's start is cleared).
"""

from __future__ import annotations

import time
from typing import Any, Final, NamedTuple

import numpy as np
import pyarrow as pa

from seglog.errors import StorageError
from seglog.segment.producer_state import ProducerColumns

__all__ = ["NO_PENDING", "PendingPart", "PendingRows", "ShardArrays"]

NO_PENDING: Final = -1  # a shard's pending start when nothing of it is buffered
_END: Final = np.iinfo(np.int64).max


class ShardArrays(NamedTuple):
    """Per-shard positions of one database, indexed by shard number (one numpy step per append)."""

    next_offsets: np.ndarray[Any, np.dtype[np.int64]]  # the next offset to assign (event loop)
    durable_ends: np.ndarray[Any, np.dtype[np.int64]]  # the acknowledged end (worker thread)
    pending_starts: np.ndarray[Any, np.dtype[np.int64]]  # first buffered offset, or NO_PENDING

    @classmethod
    def zeros(cls, shards: int) -> ShardArrays:
        """Arrays for ``shards`` shards: offsets 0, nothing pending."""
        return cls(
            np.zeros(shards, np.int64), np.zeros(shards, np.int64), np.full(shards, NO_PENDING, np.int64)
        )


class PendingPart(NamedTuple):
    """One buffered rows request."""

    batch: pa.RecordBatch  # FRAME_SCHEMA rows in append order
    shard_col: np.ndarray[Any, Any]  # each row's shard (int32)
    offset_col: np.ndarray[Any, Any]  # each row's offset (int64)
    ids: np.ndarray[Any, Any]  # the shards it holds rows of, ascending (int64)
    bases: np.ndarray[Any, Any]  # each of those shards' first offset in it
    counts: np.ndarray[Any, Any]  # each of those shards' row count in it
    # The rows grouped by shard, made by the first read that needs them (then every shard's
    # rows are a zero-copy slice): ``[batch]`` once made. Reads race benignly to make it.
    by_shard: list[pa.RecordBatch]
    stamps: ProducerColumns | None = None  # an idempotent append's producer fields per row

    @classmethod
    def make(
        cls,
        batch: pa.RecordBatch,
        shard_col: np.ndarray[Any, Any],
        offset_col: np.ndarray[Any, Any],
        ids: np.ndarray[Any, Any],
        bases: np.ndarray[Any, Any],
        counts: np.ndarray[Any, Any],
        stamps: ProducerColumns | None = None,
    ) -> PendingPart:
        """A part with its own (empty) grouped-rows slot."""
        return cls(batch, shard_col, offset_col, ids, bases, counts, [], stamps)

    def shard_rows(self, k: int) -> pa.RecordBatch:
        """The rows of ``ids[k]``, in offset order."""
        if not self.by_shard:
            order = np.argsort(self.shard_col.astype(np.int16), kind="stable")  # radix sort
            self.by_shard[:] = [self.batch.take(pa.array(order))]
        start = int(self.counts[:k].sum())
        return self.by_shard[0].slice(start, int(self.counts[k]))


class PendingRows:
    """The buffered rows requests of one I/O worker (worker thread; reads from any thread).

    Attributes:
        count: Shards with buffered rows.
        nbytes: Bytes buffered since the buffer was last empty.
        since: ``time.monotonic()`` of the first request buffered since then, or ``None``.
    """

    def __init__(self, arrays: ShardArrays, numbers: np.ndarray[Any, Any]) -> None:
        self._arrays = arrays
        self._numbers = numbers  # this worker's shards
        self._first = np.full(len(arrays.pending_starts), -1, np.int64)  # seq of first part per shard
        self._parts: list[PendingPart] = []
        self._seq0 = 0  # the sequence number of _parts[0]
        self.count = 0
        self.nbytes = 0
        self.since: float | None = None

    def add(self, part: PendingPart) -> None:
        """(Worker) Buffer a request made durable; move its shards' durable ends."""
        starts = self._arrays.pending_starts
        self._parts.append(part)  # before the starts: see the module docstring
        ids = part.ids
        new = starts[ids] < 0
        if new.any():
            fresh = ids[new]
            self._first[fresh] = self._seq0 + len(self._parts) - 1
            starts[fresh] = part.bases[new]
            self.count += len(fresh)
        self._arrays.durable_ends[ids] = part.bases + part.counts
        self.nbytes += part.batch.nbytes
        if self.since is None:
            self.since = time.monotonic()

    def shard_numbers(self) -> list[int]:
        """(Worker) This worker's shards with buffered rows."""
        starts = self._arrays.pending_starts
        return [int(n) for n in self._numbers[starts[self._numbers] >= 0]]

    def snapshot(self, shard: int, stop: int, lower: int = 0) -> tuple[int, list[tuple[int, pa.RecordBatch]]]:
        """``(first pending offset or stop, [(base, rows)])``: ``shard``'s buffered rows below ``stop``.

        Read the shard's durable end (``stop``) before calling. Parts wholly below ``lower``
        are left out (a reader from ``lower`` on does not need them); each part's rows are
        the shard's rows of one request, in offset order.
        """
        parts = list(self._parts)
        start = int(self._arrays.pending_starts[shard])
        if start < 0:
            return stop, []
        if start >= stop:
            return start, []
        floor = max(start, lower)
        out: list[tuple[int, pa.RecordBatch]] = []
        for part in reversed(parts):
            ids = part.ids
            k = int(np.searchsorted(ids, shard))
            if k >= len(ids) or ids[k] != shard:
                continue
            base = int(part.bases[k])
            if base >= stop:
                continue
            if base + int(part.counts[k]) <= floor:
                break
            out.append((base, part.shard_rows(k)))
        out.reverse()
        return start, out

    def collect(
        self, numbers: np.ndarray[Any, Any], log_ends: np.ndarray[Any, Any]
    ) -> list[tuple[pa.RecordBatch, ProducerColumns | None]]:
        """(Worker) The buffered rows of ``numbers`` (ascending), one batch per shard in offset
        order, with their producer fields when an idempotent append buffered any.

        Rows below a shard's ``log_ends`` entry (already written by an earlier flush of that
        shard alone) are left out.

        Raises:
            StorageError: The buffered requests do not add up to the shards' pending rows.
        """
        rows, starts, counts, stamps = self.collect_sorted(numbers, log_ends)
        return [
            (rows.slice(a, c), None if stamps is None else stamps.slice(a, a + c))
            for a, c in zip(starts.tolist(), counts.tolist(), strict=True)
        ]

    def collect_sorted(
        self, numbers: np.ndarray[Any, Any], log_ends: np.ndarray[Any, Any]
    ) -> tuple[pa.RecordBatch, np.ndarray[Any, Any], np.ndarray[Any, Any], ProducerColumns | None]:
        """(Worker) :meth:`collect` as one batch: ``(rows, starts, counts, stamps)``, the rows of
        ``numbers[i]`` being ``rows[starts[i] : starts[i] + counts[i]]`` (shards one after the
        other, each in offset order), so a caller can work on all shards at once.

        Raises:
            StorageError: The buffered requests do not add up to the shards' pending rows.
        """
        ends = np.full(len(self._first), _END, np.int64)
        ends[numbers] = log_ends
        if len(numbers) == self.count:
            parts = self._parts
        else:
            parts = self._parts[int(self._first[numbers].min()) - self._seq0 :]
        stamped = any(p.stamps is not None for p in parts)
        stamps: ProducerColumns | None = None
        idx: np.ndarray[Any, Any] | None = None  # rows of ``batch`` kept (None: all)
        if len(parts) > 1 and len(numbers) == self.count:
            # Everything buffered: one concatenation; rows single flushes wrote are dropped.
            batch = pa.concat_batches([p.batch for p in parts])
            shard_col = np.concatenate([p.shard_col for p in parts])
            offset_col = np.concatenate([p.offset_col for p in parts])
            if stamped:
                stamps = ProducerColumns.concat([_stamps_of(p) for p in parts])
            idx = np.flatnonzero(offset_col >= ends[shard_col])
            if len(idx) == len(offset_col):
                idx = None
            else:
                shard_col, offset_col = shard_col[idx], offset_col[idx]
                stamps = None if stamps is None else stamps.take(idx)
        else:
            pieces = []
            for p in parts:
                keep = np.flatnonzero(p.offset_col >= ends[p.shard_col])
                if len(keep) == p.batch.num_rows:
                    pieces.append((p.batch, p.shard_col, p.offset_col, _stamps_of(p) if stamped else None))
                elif len(keep):
                    pieces.append(
                        (
                            p.batch.take(keep),
                            p.shard_col[keep],
                            p.offset_col[keep],
                            _stamps_of(p).take(keep) if stamped else None,
                        )
                    )
            if not pieces:
                raise StorageError("buffered rows do not match the shards' pending rows")
            batch = pa.concat_batches([b for b, _, _, _ in pieces]) if len(pieces) > 1 else pieces[0][0]
            shard_col = np.concatenate([c for _, c, _, _ in pieces])
            offset_col = np.concatenate([o for _, _, o, _ in pieces])
            if stamped:
                stamps = ProducerColumns.concat([st for _, _, _, st in pieces if st is not None])
        # Requests are kept in append order and a shard's rows come in offset order in each:
        # a stable sort by shard alone (a radix sort) leaves every shard's rows in offset order.
        order = np.argsort(shard_col.astype(np.int16), kind="stable")  # radix: MAX_SHARDS fits
        sorted_shards = shard_col[order]
        starts = np.concatenate(([0], np.flatnonzero(sorted_shards[1:] != sorted_shards[:-1]) + 1))
        counts = np.diff(np.concatenate((starts, [len(sorted_shards)])))
        got = sorted_shards[starts]
        expected = self._arrays.durable_ends[numbers] - self._arrays.pending_starts[numbers]
        if not (np.array_equal(got, numbers) and np.array_equal(counts, expected)):
            raise StorageError("buffered rows do not match the shards' pending rows")
        rows = batch.take(pa.array(order if idx is None else idx[order]))
        sorted_stamps = None if stamps is None else stamps.take(order)
        return rows, starts, counts, sorted_stamps

    def done(self, shard: int) -> None:
        """(Worker) ``shard``'s buffered rows are in its segment now."""
        self._arrays.pending_starts[shard] = NO_PENDING
        self._first[shard] = -1
        self.count -= 1
        if self.count == 0:  # every buffered row is in a segment: forget the requests
            self._seq0 += len(self._parts)
            self._parts = []  # rebound, not cleared: readers may hold the old list
            self.nbytes = 0
            self.since = None


def _stamps_of(part: PendingPart) -> ProducerColumns:
    return part.stamps if part.stamps is not None else ProducerColumns.none(part.batch.num_rows)
