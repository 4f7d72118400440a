"""The write path of the segment engine: one journal and one fdatasync per I/O-worker drain.

Each I/O worker owns the shards ``n % io_workers`` of a database and one :class:`Journal`.
An append is cut on the event loop into one request per worker:

* a **frame request** when the worker gets rows of a single shard: the frames are encoded on
  the loop and written to the shard's segment in the drain, byte for byte the same as in
  the journal entry;
* a **rows request** when the worker gets rows of several shards (keyed records spread over
  many shards): the rows go to the journal as one Arrow batch (with ``shard`` and
  ``offset`` columns, in append order) and wait in the worker's pending buffer
  (:mod:`seglog.engines.pending_rows`); they are written into the shards' segments as
  frames later, many producers' rows at once (:meth:`WorkerLog.flush`), so a record that is
  one of 1024 shards' share of a batch does not cost a frame of its own.

A drain writes every request's segment frames (page cache), then all journal entries with
one ``pwritev`` and one ``fdatasync`` (``fsync="always"``), and only then acknowledges. A
drain that touched a single shard with frames only syncs that segment instead and skips the
journal (the same bytes and one sync, as before there was a journal). The drain then queues
its index entries in the worker's backlog, written with those of the next drains (at
``INDEX_BATCH_FRAMES`` frames or ``INDEX_BATCH_S``, a barrier, the idle deadline or close) or,
when they may make the key index merge (tens of ms), handed to the worker's indexer thread
(:class:`_Indexer`); the drain acknowledges at once: the index is derived and readers scan
past it.

A failed drain fails every request in it: segment writes are rolled back, the journal entries
are discarded, and the worker's write generation moves on so requests queued behind it (their
offsets no longer continue the log) are refused too; offsets restart at each shard's durable
end. A segment is synced at its roll and at a checkpoint, which runs before the journal would
overflow: flush every pending buffer, fdatasync every segment written since the last
checkpoint, then recycle the journal. Recovery replays the journal past each shard's log end
(see :func:`replay_journals`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NamedTuple

import numpy as np
import pyarrow as pa

from seglog.engines.base import Fsync, ReadOnlyReason
from seglog.engines.frames import IntervalSync, encode_rows, encode_shard_rows
from seglog.engines.pending_rows import PendingPart, PendingRows, ShardArrays
from seglog.errors import CorruptFrame, StorageError
from seglog.io_pool import ItemError
from seglog.record import FRAME_SCHEMA, EncodedFrame, parse_header, verify_frame
from seglog.segment import FramePosition
from seglog.segment.high_watermark import DEFAULT_FLUSH_INTERVAL_S as DEFAULT_HW_FLUSH_INTERVAL_S
from seglog.segment.high_watermark import HighWatermarkWriter
from seglog.segment.journal import ENTRY_FRAME, ENTRY_ROWS, ENTRY_ROWS_PRODUCER, Journal, journal_name
from seglog.segment.producer_state import ProducerColumns
from seglog.segment.shard_log import AppendMark
from seglog.segment.writeback import SegmentWriteback

if TYPE_CHECKING:
    from seglog.engines.segment import _Shard
    from seglog.index import DbIndex
    from seglog.topics.streams import StreamStamper

__all__ = [
    "DEFAULT_BUFFER_BYTES",
    "DEFAULT_BUFFER_MS",
    "TAILED_S",
    "FrameRequest",
    "RowsRequest",
    "WorkerLog",
    "replay_journals",
    "rows_body",
]

log = logging.getLogger("seglog.engines.segment")

# Rows wait in a shard's pending buffer this long, idle or not (they are durable in the
# journal and readable in-process); cross-process followers see them after the flush.
DEFAULT_BUFFER_MS: Final = 1000
# A shard whose frames were read this recently is tailed: a drain writes its buffered rows
# into the segment at once, so the reader's next poll finds frames (see ``_flush_tailed``).
TAILED_S: Final = 2.0
# A worker flushes its pending buffers when they hold this many bytes.
DEFAULT_BUFFER_BYTES: Final = 64 << 20
# Moved high watermarks are written at most this often while the store runs (and at close).
HW_FLUSH_INTERVAL_S: Final = DEFAULT_HW_FLUSH_INTERVAL_S
_JOURNAL_DIR: Final = "journal"
# Index work a worker may hand its indexer ahead of it (drains): past it the worker waits,
# so a starved indexer slows appends down instead of holding unbounded frames in memory.
INDEX_QUEUE_MAX: Final = 64
# A drain's index entries wait for later drains' until this many frames or this long (see
# ``WorkerLog._index``); readers scan the frames past a shard's ``indexed_end`` meanwhile.
INDEX_BATCH_FRAMES: Final = 64
INDEX_BATCH_S: Final = 0.05
# The dirty segments are handed to the background writeback after every 1/WRITEBACK_PARTS of
# the journal (8 MiB of the default 64), so a checkpoint writes back at most about that much.
WRITEBACK_PARTS: Final = 8
_ROWS_SCHEMA: Final = pa.schema(
    [*FRAME_SCHEMA, pa.field("shard", pa.int32()), pa.field("offset", pa.int64())]
)
# A rows entry of an idempotent append (ENTRY_ROWS_PRODUCER) also keeps each row's producer.
_ROWS_PRODUCER_SCHEMA: Final = pa.schema(
    [
        *_ROWS_SCHEMA,
        pa.field("producer_id", pa.int64()),
        pa.field("producer_epoch", pa.int16()),
        pa.field("sequence", pa.int32()),
    ]
)


class FrameRequest(NamedTuple):
    """Frames of one shard, encoded on the loop at the offsets assigned there."""

    gen: int  # the worker's write generation when the offsets were assigned
    shard: _Shard
    frames: list[EncodedFrame]
    batches: list[pa.RecordBatch]  # the batch of each frame (for the index)


class RowsRequest(NamedTuple):
    """Rows of several shards of one worker, in append order (see the module docstring)."""

    gen: int
    part: PendingPart  # the rows, each row's shard and offset, and per-shard bases and counts
    epoch: int = 0  # the leader epoch its frames are stamped with (kept in the journal entry)


def rows_body(req: RowsRequest) -> pa.Buffer:
    """The journal body of a rows request: its batch plus ``shard`` and ``offset`` columns
    (and the producer columns of an idempotent append)."""
    p = req.part
    columns = [*p.batch.columns, pa.array(p.shard_col), pa.array(p.offset_col)]
    if p.stamps is None:
        return pa.RecordBatch.from_arrays(columns, schema=_ROWS_SCHEMA).serialize()
    columns += [pa.array(p.stamps.pid), pa.array(p.stamps.epoch), pa.array(p.stamps.seq)]
    return pa.RecordBatch.from_arrays(columns, schema=_ROWS_PRODUCER_SCHEMA).serialize()


def rows_kind(req: RowsRequest) -> int:
    """The journal entry kind of a rows request."""
    return ENTRY_ROWS if req.part.stamps is None else ENTRY_ROWS_PRODUCER


_Written = Sequence[tuple["_Shard", Sequence[tuple[FramePosition, pa.RecordBatch]]]]


class _Indexer:
    """A thread that writes one worker's index entries after the drain that wrote their frames.

    The index is derived data and readers scan past ``indexed_end``, so an acknowledgement
    need not wait for it. It used to: every few hundred frames of a keyed shard the key
    index merges its summaries into postings (10-60 ms of CPU, :meth:`ShardIndex._merge_due
    <seglog.index.shard_index.ShardIndex._merge_due>`), and every append of that drain and
    of the drains queued behind it waited, on every replica at once (the p99 stalls of
    ``acks="all"``). Work is taken in order; :meth:`barrier` waits until it is all done.
    """

    def __init__(self, name: str) -> None:
        self._queue: queue.Queue[tuple[Callable[[_Written], None], _Written] | None] = queue.Queue(
            INDEX_QUEUE_MAX
        )
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[_Written], None], written: _Written) -> None:
        """Queue ``fn(written)`` (blocks while ``INDEX_QUEUE_MAX`` items wait)."""
        self._queue.put((fn, written))

    @property
    def idle(self) -> bool:
        """Whether everything submitted is done (only the submitting thread adds work)."""
        return self._queue.unfinished_tasks == 0

    def barrier(self) -> None:
        """Wait until everything submitted so far is done."""
        self._queue.join()

    def close(self) -> None:
        """Finish the queued work and stop the thread."""
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                fn, written = item
                try:
                    fn(written)
                except Exception:  # derived data: the shards are marked lagging by fn itself
                    log.exception("index write failed")
            finally:
                self._queue.task_done()


class WorkerLog:
    """The writer of one I/O worker for one database (a :class:`~seglog.io_pool.BatchWriter`).

    Attributes:
        gen: The write generation requests are stamped with (event-loop thread).
        failed: Set when the worker cannot undo a failed write: every shard it owns is
            read-only until the store is reopened.
    """

    def __init__(
        self,
        worker: int,
        shards: list[_Shard],
        journal: Journal,
        arrays: ShardArrays,
        *,
        fsync: str,
        fsync_interval_ms: int,
        buffer_ms: int = DEFAULT_BUFFER_MS,
        buffer_bytes: int = DEFAULT_BUFFER_BYTES,
        compression: int = 0,
        index: DbIndex | None = None,
        streams: StreamStamper | None = None,
        writeback: SegmentWriteback | None = None,
        hw_writer: HighWatermarkWriter | None = None,
    ) -> None:
        self.worker = worker
        self.writeback = writeback
        self.hw_writer = hw_writer
        self.index = index
        self.streams = streams  # the database's stamper (None: no streams)
        self.shards = shards
        self.journal = journal
        self.fsync = Fsync(fsync)
        self.buffer_s = buffer_ms / 1000
        self.buffer_bytes = buffer_bytes
        self.compression = compression
        self._interval = IntervalSync(fsync_interval_ms)
        self.gen = 0  # event loop
        self.loop: asyncio.AbstractEventLoop | None = None
        self.failed: BaseException | None = None
        self.read_only_reason: ReadOnlyReason | None = None
        self._min_gen = 0  # worker thread
        self._by_number = {s.number: s for s in shards}
        self._pending = PendingRows(arrays, np.array([s.number for s in shards], np.int64))
        self._pending_epoch = 0  # every pending row has it: a request of another epoch flushes first
        # No shard of this worker knows a leader epoch below this: appends at or below it
        # need no epoch-cache check (the standalone case: epoch 0 everywhere, no file).
        self._known_epoch_floor = min((s.known_epoch for s in shards), default=0)
        self._dirty: dict[int, _Shard] = {}  # written since the last checkpoint, not synced
        # The journal position at which the dirty segments are next handed to the writeback.
        self._writeback_at = journal.write_pos + journal.journal_bytes // WRITEBACK_PARTS
        self._writeback_failures = 0 if writeback is None else writeback.failed  # seen at start
        # Shards whose high watermark moved since it was last written (set on the loop).
        self.hw_dirty: dict[int, _Shard] = {}
        # Shards read as frames lately (set on the loop by ``note_tailed``, expired here), so
        # finding the tailed ones costs nothing per idle shard.
        self._tailed: dict[int, _Shard] = {}
        self._hw_flushed_at = time.monotonic()  # the last flush_high_watermarks pass (worker)
        self._indexer: _Indexer | None = None  # started by the first drain with index work
        # Index entries of durable frames not written yet (see ``_index``; worker thread).
        self._backlog: list[tuple[_Shard, Sequence[tuple[FramePosition, pa.RecordBatch]]]] = []
        self._backlog_frames = 0
        self._backlog_since: float | None = None
        self.closed = False

    # --- state -------------------------------------------------------------------------

    def make_read_only(self, exc: BaseException, reason: ReadOnlyReason) -> None:
        """(Worker) Refuse every later write until reopen."""
        self.failed = exc
        self.read_only_reason = reason
        log.error(
            "I/O worker %d of %s: %s (%s); its shards are read-only until reopen",
            self.worker,
            self.journal.path.parent.parent,
            reason,
            exc,
        )

    def check_writable(self, shard: int) -> None:
        """Raise :class:`StorageError` if the worker's shards are read-only."""
        if self.failed is not None:
            raise StorageError(
                f"shard {shard} is read-only after {self.read_only_reason}; reopen the store"
            ) from self.failed

    # --- BatchWriter -------------------------------------------------------------------

    def write_batch(self, items: Sequence[FrameRequest | RowsRequest]) -> Sequence[Any]:
        if self.failed is not None:
            raise StorageError(
                f"I/O worker {self.worker}'s shards are read-only after {self.read_only_reason}; reopen the store"
            ) from self.failed
        results: list[Any] = []
        run: list[FrameRequest | RowsRequest] = []
        run_epoch: int | None = None  # the epoch of the run's rows requests (they share one)
        for item in items:
            if isinstance(item, FrameRequest) and any(
                isinstance(r, RowsRequest) and item.shard.number in r.part.ids for r in run
            ):
                # Its shard's rows earlier in this drain are buffered only once durable.
                results.extend(self._write_run(run))
                run, run_epoch = [], None
            elif isinstance(item, RowsRequest):
                if run_epoch is not None and item.epoch != run_epoch:
                    # Pending rows share one leader epoch: a new epoch's rows start a new run.
                    results.extend(self._write_run(run))
                    run = []
                run_epoch = item.epoch
            run.append(item)
        results.extend(self._write_run(run))
        return results

    def _write_run(self, items: Sequence[FrameRequest | RowsRequest]) -> list[Any]:
        """Write one run of requests atomically; stale ones (behind a failure) are refused."""
        results: list[Any] = [None] * len(items)
        live: list[FrameRequest | RowsRequest] = []
        for i, item in enumerate(items):
            if item.gen < self._min_gen or self.failed is not None:
                results[i] = ItemError(
                    StorageError(
                        "not written: an earlier write to this shard's I/O worker failed and was rolled back; retry"
                    )
                )
            else:
                live.append(item)
        if not live:
            return results
        try:
            written = self._write(live)
        except BaseException as exc:
            return [ItemError(exc) if r is None else r for r in results]
        it = iter(written)
        return [next(it) if r is None else r for r in results]

    def _write(self, items: Sequence[FrameRequest | RowsRequest]) -> list[Any]:
        bodies: list[tuple[int, int, Sequence[Any]]] = []
        for item in items:
            if isinstance(item, FrameRequest):
                for frame in item.frames:
                    bodies.append((ENTRY_FRAME, item.shard.number, frame.buffers))
            else:
                bodies.append((rows_kind(item), item.epoch, (rows_body(item),)))
        need = sum(Journal.entry_bytes(sum(memoryview(b).nbytes for b in body)) for _, _, body in bodies)
        marks: dict[int, tuple[_Shard, AppendMark]] = {}
        frame_writes: list[tuple[FrameRequest, list[FramePosition]]] = []
        direct = (
            self.fsync is Fsync.ALWAYS
            and all(isinstance(i, FrameRequest) for i in items)
            and len({i.shard.number for i in items if isinstance(i, FrameRequest)}) == 1
        )
        journal_start: int | None = None
        stage = "checkpoint"
        try:
            if not self.journal.fits(need):
                self.checkpoint()
            stage = "segment write"
            if self._pending.count and any(
                isinstance(i, RowsRequest) and i.epoch != self._pending_epoch for i in items
            ):
                self.flush()
            for item in items:
                if not isinstance(item, FrameRequest):
                    continue
                s = item.shard
                if s.has_pending:
                    self._flush_shard(s)
                if item.frames[0].header.base_offset != s.log.next_offset:
                    raise StorageError(
                        f"shard {s.number}: frames at {item.frames[0].header.base_offset} do not continue "
                        f"the log at {s.log.next_offset}"
                    )
                if s.number not in marks:
                    marks[s.number] = (s, s.log.mark())
                frame_writes.append((item, s.log.append(item.frames)))
            stage = "sync"
            if direct:
                s = frame_writes[0][0].shard
                s.log.sync()
                self._dirty.pop(s.number, None)
            else:
                stage = "journal write"
                journal_start = self.journal.append(bodies)
                stage = "sync"
                self._sync_journal()
                # After the sync, so the grower's zeros rarely ride on this drain's fdatasync.
                self.journal.grow_ahead()
                self._request_writeback()
        except (OSError, StorageError) as exc:
            self._undo(items, marks, journal_start, exc, stage)
            if isinstance(exc, StorageError):
                raise
            raise StorageError(
                f"{stage} failed on I/O worker {self.worker}; nothing of the batch was kept"
            ) from exc
        # Durable (per the policy): epochs, publish, index, buffer.
        self._note_epochs(items)
        out: list[Any] = []
        for item in items:
            if isinstance(item, FrameRequest):
                out.append(item.frames[0].header.base_offset)
            else:
                self._buffer(item)
                out.append(None)
        if any(isinstance(i, RowsRequest) for i in items):
            self._flush_tailed()
        written: list[tuple[_Shard, list[tuple[FramePosition, pa.RecordBatch]]]] = []
        for item, positions in frame_writes:
            s = item.shard
            s.durable_end = positions[-1].header.next_offset
            if not direct:
                self._dirty[s.number] = s
            self._publish(s)
            written.append((s, list(zip(positions, item.batches, strict=True))))
        self._index(written)
        if self.streams is not None:
            for item in items:
                if isinstance(item, FrameRequest):
                    item.shard.maybe_snapshot()
                else:
                    for n in item.part.ids.tolist():
                        self._by_number[n].maybe_snapshot()
        return out

    def _note_epochs(self, items: Sequence[FrameRequest | RowsRequest]) -> None:
        """Record in shards' leader-epoch caches the first offset of each new epoch just made durable.

        Rare (a leader change): the check is one comparison per request otherwise. A cache
        that cannot be written makes the worker read-only (its answers would be wrong);
        the next open rebuilds it from the frames.
        """
        floor = self._known_epoch_floor
        assigned = False
        try:
            for item in items:
                if isinstance(item, FrameRequest):
                    s = item.shard
                    for frame in item.frames:
                        h = frame.header
                        if h.leader_epoch > floor and h.leader_epoch > s.known_epoch:
                            s.assign_epoch(h.leader_epoch, h.base_offset)
                            assigned = True
                elif item.epoch > floor:
                    for n, base in zip(item.part.ids.tolist(), item.part.bases.tolist(), strict=True):
                        s = self._by_number[n]
                        if item.epoch > s.known_epoch:
                            s.assign_epoch(item.epoch, base)
                            assigned = True
        except (OSError, StorageError) as exc:
            self.make_read_only(exc, ReadOnlyReason.EPOCH_CACHE_FAILED)
            return
        if assigned:  # O(shards): only when a cache changed, not per drain
            self.refresh_epoch_floor()

    def refresh_epoch_floor(self) -> None:
        """(Worker) Recompute the epoch floor after a change that can lower a shard's latest epoch."""
        self._known_epoch_floor = min((s.known_epoch for s in self.shards), default=0)

    def _index(self, written: _Written) -> None:
        """Index frames just written: here, or on the indexer thread when a key-index merge
        is likely (or the indexer still has work: entries are written in drain order), so
        the drain is acknowledged without waiting for the merge.

        A shard whose index is lagging or suspect catches up from its segments here on the
        worker (after the indexer finished, so the two never write one shard's entries at
        once).
        """
        if not written:
            return
        behind = {s.number: s for s, _ in written if not s.index_ready}
        if behind:
            self.index_barrier()
            for s in behind.values():
                s.index_frames([])  # catches up from the segments (these frames too)
        ready = [(s, frames) for s, frames in written if s.number not in behind]
        if not ready:
            return
        # Entries wait in a backlog for a few drains: a drain of many tailed shards has one
        # small frame per shard, and an LMDB transaction (and a put of each shard's end) per
        # drain cost more than the entries themselves.
        self._backlog.extend(ready)
        self._backlog_frames += sum(len(frames) for _, frames in ready)
        now = time.monotonic()
        if self._backlog_since is None:
            self._backlog_since = now
        if self._backlog_frames < INDEX_BATCH_FRAMES and now < self._backlog_since + INDEX_BATCH_S:
            return
        self._index_backlog()

    def _index_backlog(self) -> None:
        """Write (or hand the indexer) the entries waiting in the backlog, a shard's together."""
        if not self._backlog:
            return
        by_shard: dict[int, tuple[_Shard, list[tuple[FramePosition, pa.RecordBatch]]]] = {}
        for s, frames in self._backlog:
            by_shard.setdefault(s.number, (s, []))[1].extend(frames)
        self._backlog, self._backlog_frames, self._backlog_since = [], 0, None
        ready = list(by_shard.values())
        indexer = self._indexer
        if (indexer is None or indexer.idle) and not any(
            frames and s.index.merge_likely(len(frames), frames[0][0].segment.base_offset)
            for s, frames in ready
        ):
            # Most drains: a few entries, cheaper here than a hand-off to another thread
            # (which then competes with this one and the event loop for the GIL).
            self._index_now(ready)
            return
        if indexer is None:
            indexer = self._indexer = _Indexer(f"seglog-index-{self.worker}")
        indexer.submit(self._index_now, ready)

    def _index_now(self, written: _Written) -> None:
        """(Indexer) Index frames of shards whose index was ready, in one LMDB transaction
        where it can; a failure leaves the shards lagging (the worker catches them up)."""
        ready = [(s, frames) for s, frames in written if s.index_ready]
        groups = [ready] if self.index is not None and len(ready) > 1 else [[r] for r in ready]
        for group in groups:
            try:
                if len(group) == 1:
                    s, frames = group[0]
                    s.index.add(s.frame_entries(frames))
                else:
                    assert self.index is not None
                    self.index.add_many([(s.index, s.frame_entries(frames)) for s, frames in group])
            except Exception as exc:
                # Durable and acknowledged; the index is derived and caught up on the next write.
                # Any failure, not only a storage one: a skipped group must not leave a gap
                # below a later indexed_end (readers would not scan it).
                for s, _ in group:
                    s.index_lagging = True
                log.error(
                    "I/O worker %d: index write failed (%s: %s); shards %s catch up on the next write",
                    self.worker,
                    type(exc).__name__,
                    exc,
                    [s.number for s, _ in group],
                    exc_info=not isinstance(exc, StorageError | CorruptFrame | OSError),
                )

    def index_barrier(self) -> None:
        """(Worker) Wait until every entry of the frames written so far is in the index (the
        backlog's too): before anything else writes the index (a cut, a rebuild, retention)
        or reads ``indexed_end`` as final."""
        self._index_backlog()
        if self._indexer is not None:
            self._indexer.barrier()

    def _undo(
        self,
        items: Sequence[FrameRequest | RowsRequest],
        marks: dict[int, tuple[_Shard, AppendMark]],
        journal_start: int | None,
        exc: BaseException,
        stage: str,
    ) -> None:
        """Roll every segment write of a failed drain back and refuse what is queued behind it."""
        undo_failed: BaseException | None = None
        for s, mark in marks.values():
            try:
                s.log.rollback(mark)
            except OSError as undo_exc:
                undo_failed = undo_exc
                with contextlib.suppress(OSError):
                    s.log.fence(mark)
        if journal_start is not None:
            try:
                self.journal.discard_from(journal_start)
            except OSError as undo_exc:
                undo_failed = undo_exc
        if undo_failed is not None:
            self.make_read_only(undo_failed, ReadOnlyReason.UNDO_FAILED)
            return
        log.warning("I/O worker %d: %s failed (%s); the drain was rolled back", self.worker, stage, exc)
        gen = max(item.gen for item in items)
        self._min_gen = gen + 1
        ends = {s.number: s.durable_end for s in self.shards}
        loop = self.loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._rewound, gen, ends)
        if stage == "sync" and self._interval.pending:
            self.make_read_only(exc, ReadOnlyReason.FAILED_FSYNC)

    def _rewound(self, gen: int, ends: dict[int, int]) -> None:
        if self.gen == gen:
            self.gen = gen + 1
            for s in self.shards:
                s.next_offset = ends[s.number]
                if self.streams is not None:
                    # The offsets from the durable end are handed out again: forget what
                    # the refused requests taught the trie.
                    self.streams.cut(s.number, ends[s.number])

    def _sync_journal(self) -> None:
        if self.fsync is Fsync.ALWAYS:
            self.journal.sync()
        elif self.fsync is Fsync.INTERVAL and self._interval.due():
            self.journal.sync()
            self._interval.synced()

    def _publish(self, s: _Shard) -> None:
        try:
            s.log.publish_durable_end()
        except OSError as exc:
            # Durable and acknowledged; but followers would no longer see the log grow.
            self.make_read_only(exc, ReadOnlyReason.DURABLE_END_FAILED)

    # --- pending rows ------------------------------------------------------------------

    def _buffer(self, req: RowsRequest) -> None:
        self._pending.add(req.part)
        self._pending_epoch = req.epoch

    def pending_snapshot(
        self, s: _Shard, stop: int, lower: int = 0
    ) -> tuple[int, list[tuple[int, pa.RecordBatch]]]:
        """(Any thread) ``s``'s buffered rows below ``stop`` (see :meth:`PendingRows.snapshot`)."""
        return self._pending.snapshot(s.number, stop, lower)

    def note_tailed(self, s: _Shard) -> None:
        """(Loop) ``s`` was just read as frames: it counts as tailed for ``TAILED_S``."""
        s.frames_read_at = time.monotonic()
        self._tailed[s.number] = s

    def tailed_pending(self) -> list[_Shard]:
        """(Worker) The tailed shards that hold buffered rows; forgets those read too long ago."""
        cutoff = time.monotonic() - TAILED_S
        hot = []
        for s in list(self._tailed.values()):
            if s.frames_read_at < cutoff:
                # A read racing this only loses its in-drain flush once: it flushes for itself.
                self._tailed.pop(s.number, None)
            elif s.has_pending:
                hot.append(s)
        return hot

    def _flush_tailed(self) -> None:
        """Write the buffered rows of tailed shards into their segments now, in this drain.

        A consumer or follower tailing a shard would otherwise have its next poll queue a
        flush behind the drains that follow (milliseconds under load); here the rows are
        already durable in the journal, so a failure only leaves them pending (a read flushes
        them again) and never fails the append.
        """
        hot = self.tailed_pending()
        if not hot:
            return
        try:
            first: BaseException | None = self._flush_shards(hot)
        except StorageError as exc:
            first = exc
        if first is not None:
            log.warning(
                "I/O worker %d: writing tailed shards' rows into their segments failed (%s); "
                "they are safe in the journal and stay buffered",
                self.worker,
                first,
            )

    def _flush_shard(self, s: _Shard) -> None:
        """Write one shard's pending rows into its segment (see :meth:`_flush_shards`).

        Raises:
            OSError: The segment write failed; it was rolled back and the rows stay pending.
        """
        exc = self._flush_shards([s])
        if exc is not None:
            raise exc

    def _flush_shards(self, shards: Sequence[_Shard]) -> OSError | None:
        """Write shards' pending rows into their segments as frames (the rows are durable already).

        The pending rows of all of them are gathered once and cut back into one run of
        frames per shard; the frames of all of them are indexed in one transaction.

        Returns:
            The first segment write that failed (that shard was rolled back and its rows stay
            pending; the others were written), or ``None``.
        """
        shards = sorted((s for s in shards if s.has_pending), key=lambda s: s.number)
        if not shards:
            return None
        log_ends = np.array([s.log.next_offset for s in shards], np.int64)
        for s, end in zip(shards, log_ends.tolist(), strict=True):
            if s.pending_start != end:
                raise StorageError(
                    f"shard {s.number}: pending rows at {s.pending_start} do not continue the log at {end}"
                )
        try:
            rows, starts, counts, stamps = self._pending.collect_sorted(
                np.array([s.number for s in shards], np.int64), log_ends
            )
        except StorageError as exc:
            raise StorageError(f"I/O worker {self.worker}: {exc}") from None
        # Every shard's frames at once: a tailed flush is many shards' few rows each.
        encoded = encode_shard_rows(
            rows,
            starts,
            counts,
            log_ends.tolist(),
            stamps,
            compression=self.compression,
            leader_epoch=self._pending_epoch,
            frame_bytes=[s.log.segment_bytes // 2 for s in shards],
        )
        first: OSError | None = None
        written: list[tuple[_Shard, list[tuple[FramePosition, pa.RecordBatch]]]] = []
        for s, (frames, batches) in zip(shards, encoded, strict=True):
            mark = s.log.mark()
            try:
                positions = s.log.append(frames)
            except OSError as exc:
                try:
                    s.log.rollback(mark)
                except OSError as undo_exc:
                    self.make_read_only(undo_exc, ReadOnlyReason.SEGMENT_UNDO_FAILED)
                    with contextlib.suppress(OSError):
                        s.log.fence(mark)
                first = first or exc
                continue
            self._pending.done(s.number)
            self._dirty[s.number] = s
            self._publish(s)
            written.append((s, list(zip(positions, batches, strict=True))))
        self._index(written)
        return first

    def flush(self) -> None:
        """Write every pending buffer into its segment.

        Raises:
            OSError: A segment write failed (that shard's rows stay pending; retried later).
        """
        first = self._flush_shards([self._by_number[n] for n in self._pending.shard_numbers()])
        if first is not None:
            log.warning(
                "I/O worker %d: writing buffered rows into a segment failed (%s); they are "
                "safe in the journal and retried",
                self.worker,
                first,
            )
        if first is not None:
            raise first

    def flush_shard(self, s: _Shard) -> None:
        """(Worker) Write ``s``'s pending rows into its segment before a maintenance step."""
        self.flush_shards([s])

    def flush_shards(self, shards: Sequence[_Shard]) -> None:
        """(Worker) Write the pending rows of ``shards`` into their segments (in one pass).

        Raises:
            StorageError: A segment write failed (its rows stay pending; the others were written).
        """
        exc = self._flush_shards(shards)
        if exc is not None:
            which = ", ".join(str(s.number) for s in shards)
            which = f"shard {which}" if len(shards) == 1 else f"shards {which}"
            raise StorageError(f"{which}: writing buffered rows failed") from exc

    def _request_writeback(self) -> None:
        """(Worker, after a drain's journal sync) Every ``1/WRITEBACK_PARTS`` of the journal,
        have the writeback sync the dirty segments in the background, so the checkpoint at
        the journal's end finds little left to write (see :mod:`seglog.segment.writeback`)."""
        if self.writeback is None or self.fsync is Fsync.NEVER or not self._dirty:
            return
        if self.journal.write_pos < self._writeback_at:
            return
        self._writeback_at = self.journal.write_pos + self.journal.journal_bytes // WRITEBACK_PARTS
        self.writeback.request([s.log.active.path for s in self._dirty.values()])

    def checkpoint(self) -> None:
        """Make every segment hold and sync what the journal has; then recycle the journal.

        Raises:
            StorageError: A segment could not be written or synced; the journal is kept.
        """
        try:
            self.flush()
            if self.writeback is not None:
                # Its syncs may consume a write error that our own descriptors would then not
                # report (an error is reported once per open file): wait for them, and take
                # any failure of theirs as this checkpoint's (kept until the store reopens and
                # replays the journal).
                self.writeback.wait_idle()
                if self.writeback.failed != self._writeback_failures:
                    raise OSError(errno.EIO, "a background writeback of a segment failed")
            for s in list(self._dirty.values()):
                s.log.sync()
                del self._dirty[s.number]
            self.journal.recycle()
            self._writeback_at = self.journal.write_pos + self.journal.journal_bytes // WRITEBACK_PARTS
        except OSError as exc:
            raise StorageError(
                f"I/O worker {self.worker}: the journal is full and the segments cannot take its "
                f"entries ({exc}); nothing more is accepted until they can"
            ) from exc
        self._interval.synced()

    def sync_deadline(self) -> float | None:
        if self.failed is not None or self.closed:
            return None
        due = self._interval.deadline()
        if self.hw_dirty:
            hw_due = self._hw_flushed_at + HW_FLUSH_INTERVAL_S
            due = hw_due if due is None else min(due, hw_due)
        if self._backlog_since is not None:
            index_at = self._backlog_since + INDEX_BATCH_S
            due = index_at if due is None else min(due, index_at)
        since = self._pending.since
        if since is not None:
            flush_at = since + self.buffer_s
            if self._pending.nbytes >= self.buffer_bytes:
                flush_at = 0.0
            due = flush_at if due is None else min(due, flush_at)
        return due

    def flush_idle(self) -> None:
        if self.failed is not None or self.closed:
            return
        if self._interval.pending:
            try:
                self.journal.sync()
            except OSError as exc:
                self.make_read_only(exc, ReadOnlyReason.FAILED_FSYNC)
                return
            self._interval.synced()
        # Pending rows wait for their deadline even when the worker is idle: they are durable
        # and readable in-process already, and flushing on every lull (which a busy event
        # loop causes too) would cut each shard's rows into many small frames.
        since = self._pending.since
        due = since is not None and (
            time.monotonic() >= since + self.buffer_s or self._pending.nbytes >= self.buffer_bytes
        )
        if due:
            with contextlib.suppress(OSError):  # logged; retried at the next deadline or checkpoint
                self.flush()
        self._index_backlog()
        if any(not s.index_ready for s in self.shards):
            self.index_barrier()
            for s in self.shards:
                s.rebuild_index()
        self.flush_high_watermarks()

    def flush_high_watermarks(self, *, force: bool = False) -> None:
        """Write the high watermarks that moved: lazily, when idle at most once per
        ``HW_FLUSH_INTERVAL_S`` (Kafka's checkpoint interval), by the database's
        :class:`HighWatermarkWriter` (a write is two fsyncs per shard: not on the drain's
        path); and here, at close (``force``), with every earlier failed one."""
        now = time.monotonic()
        if not force and now < self._hw_flushed_at + HW_FLUSH_INTERVAL_S:
            return
        self._hw_flushed_at = now
        # Only this thread takes entries out (the loop only adds): each listed one is there.
        checkpoints = [self.hw_dirty.pop(n).hw for n in list(self.hw_dirty)]
        writer = self.hw_writer
        if writer is not None:
            if not force:
                writer.request(checkpoints)
                return
            writer.wait_idle()  # its write of a checkpoint and this one never overlap
            checkpoints += writer.take_failed()
        for hw in checkpoints:
            try:
                hw.flush()
            except StorageError as exc:
                # A stale checkpoint only hides records until the replica relearns its HW.
                log.warning("%s: writing the high watermark failed (%s)", hw.path, exc)

    def close(self) -> None:
        """Checkpoint (everything into the segments, synced) and close the journal.

        Raises:
            StorageError: The checkpoint failed; the journal keeps the data for the next open.
        """
        if self.closed:
            return
        self.closed = True
        try:
            self.flush_high_watermarks(force=True)
            if self.failed is None:
                self.checkpoint()  # may hand the indexer the frames of the last pending rows
        finally:
            self._index_backlog()
            if self._indexer is not None:
                self._indexer.close()  # every entry written before the index is closed
                self._indexer = None
            self.journal.close()


# --- recovery -----------------------------------------------------------------------------


def journal_path(db_directory: Path, worker: int) -> Path:
    """The journal file of ``worker`` in a database directory."""
    return db_directory / _JOURNAL_DIR / journal_name(worker)


def replay_journals(db_directory: Path, shards: Sequence[_Shard], *, compression: int) -> dict[int, int]:
    """Write what the journals hold past each shard's log end into its segments; sync them.

    Runs at open, before the journals are reused. A crash during replay leaves the journals
    as they were, and segment bytes that a later open validates: replay is idempotent.

    Returns:
        Records replayed per shard.
    """
    directory = db_directory / _JOURNAL_DIR
    if not directory.is_dir():
        return {}
    replayed: dict[int, int] = {}
    touched: dict[int, _Shard] = {}
    for path in sorted(directory.glob("*.journal")):
        journal = Journal(path)
        try:
            for entry in journal.entries():
                if entry.kind == ENTRY_FRAME:
                    _replay_frame(shards, entry.shard, entry.body, touched, replayed)
                else:  # a rows entry's ``shard`` field holds the leader epoch of its rows
                    stamped = entry.kind == ENTRY_ROWS_PRODUCER
                    _replay_rows(shards, entry.body, touched, replayed, compression, entry.shard, stamped)
        finally:
            journal.close()
    for s in touched.values():
        s.log.sync()
        s.log.publish_durable_end()
        s.durable_end = s.log.next_offset
        s.next_offset = s.log.next_offset
    for shard, count in sorted(replayed.items()):
        log.info("shard %d: replayed %d records from the journal", shard, count)
    return replayed


def _replay_frame(
    shards: Sequence[_Shard],
    shard: int,
    body: memoryview,
    touched: dict[int, _Shard],
    replayed: dict[int, int],
) -> None:
    if not 0 <= shard < len(shards):
        log.error("journal entry for shard %d, which this database does not have; skipped", shard)
        return
    s = shards[shard]
    try:
        header = parse_header(body, 0)
        verify_frame(body, 0, header)
    except CorruptFrame as exc:
        log.error("shard %d: a journal frame failed its check (%s); skipped", shard, exc)
        return
    end = s.log.next_offset
    if header.next_offset <= end:
        return
    if header.base_offset != end:
        log.error(
            "shard %d: the journal continues at %d but the log ends at %d; records %d..%d are lost",
            shard,
            header.base_offset,
            end,
            end,
            header.base_offset,
        )
        return
    s.log.append([EncodedFrame(header, (bytes(body[: header.size]),))])
    touched[shard] = s
    replayed[shard] = replayed.get(shard, 0) + header.record_count


def _replay_rows(
    shards: Sequence[_Shard],
    body: memoryview,
    touched: dict[int, _Shard],
    replayed: dict[int, int],
    compression: int,
    epoch: int,
    stamped: bool = False,
) -> None:
    batch = pa.ipc.read_record_batch(pa.py_buffer(body), _ROWS_PRODUCER_SCHEMA if stamped else _ROWS_SCHEMA)
    shard_col = batch.column("shard").to_numpy()
    offset_col = batch.column("offset").to_numpy()
    rows = pa.RecordBatch.from_arrays([batch.column(n) for n in FRAME_SCHEMA.names], schema=FRAME_SCHEMA)
    stamps = (
        ProducerColumns(
            batch.column("producer_id").to_numpy(),
            batch.column("producer_epoch").to_numpy(),
            batch.column("sequence").to_numpy(),
        )
        if stamped
        else None
    )
    if len(shard_col) > 1 and bool((shard_col[1:] < shard_col[:-1]).any()):
        # Rows are journaled in append order; a stable sort keeps each shard's offset order.
        order = np.argsort(shard_col, kind="stable")
        shard_col, offset_col = shard_col[order], offset_col[order]
        rows = rows.take(pa.array(order))
        stamps = None if stamps is None else stamps.take(order)
    bounds = np.flatnonzero(np.diff(shard_col)) + 1
    starts = [0, *bounds.tolist()]
    stops = [*bounds.tolist(), len(shard_col)]
    for lo, hi in zip(starts, stops, strict=True):
        shard = int(shard_col[lo])
        if not 0 <= shard < len(shards):
            log.error("journal rows for shard %d, which this database does not have; skipped", shard)
            continue
        s = shards[shard]
        end = s.log.next_offset
        first, last = int(offset_col[lo]), int(offset_col[hi - 1])
        if last < end:
            continue
        skip = max(0, end - first)
        if first + skip != end:
            log.error(
                "shard %d: the journal continues at %d but the log ends at %d; records are lost",
                shard,
                first + skip,
                end,
            )
            continue
        part = rows.slice(lo + skip, hi - lo - skip)
        frames, _ = encode_rows(
            part,
            end,
            None if stamps is None else stamps.slice(lo + skip, hi),
            compression=compression,
            leader_epoch=epoch,
            frame_bytes=s.log.segment_bytes // 2,
        )
        s.log.append(frames)
        touched[shard] = s
        replayed[shard] = replayed.get(shard, 0) + part.num_rows
