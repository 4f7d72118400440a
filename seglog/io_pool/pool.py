"""I/O worker threads with batch collection and group commit.

Each shard is served by one worker (``shard % io_workers``), so a shard's writes are ordered.
A worker blocks for its first request, then drains whatever else is queued (up to
``max_items``, optionally waiting ``flush_interval_ms`` for more -- EMQX's flush control),
groups the requests by writer, and calls each writer once for the whole group: one ``writev``,
one ``fdatasync`` per touched file and one index transaction cover every request of the group.
The waiting futures are completed with a single callback on their event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import queue
import threading
import time
from collections.abc import Sequence
from typing import Any, Final, NamedTuple, Protocol

from seglog.errors import ClosedResourceError, InvalidArgument

__all__ = ["DEFAULT_IO_WORKERS", "BatchWriter", "IoPool", "ItemError"]

log = logging.getLogger("seglog.io_pool")

# One worker: its journal makes every shard's part of a drain durable with one fdatasync, and
# its drains gather every producer's appends. More workers multiply the syncs (one journal
# each) and, the write path being mostly Python under the GIL, add no parallel CPU: measured
# with 4 producers of keyed 1000-record batches, 1 worker did 1.5-2.5x the records/s of 4 at
# 4-256 shards (bench/core.py's scaling table). More pay off only where parallel syncs do.
DEFAULT_IO_WORKERS: Final = 1
DEFAULT_MAX_ITEMS: Final = 1024
# A writer whose deadline is still past after its deadline work ran (that work failed, e.g. a
# flush into a full disk) is run again no sooner than this, with the queue served in between.
DEADLINE_RETRY_S: Final = 0.1
_STOP: Final = object()


class ItemError(NamedTuple):
    """A result of ``write_batch`` that fails just its own request with ``error``."""

    error: BaseException


class BatchWriter(Protocol):
    """Something a worker hands a drained group of requests to (one shard's writer)."""

    def write_batch(self, items: Sequence[Any]) -> Sequence[Any]:
        """Write every item durably (per the writer's policy); return one result per item.

        Raising fails every item of the call with that exception; an :class:`ItemError`
        result fails only its item.
        """

    def sync_deadline(self) -> float | None:
        """``time.monotonic()`` by which acknowledged but unsynced writes must be synced.

        ``None`` when nothing is pending. The worker calls :meth:`flush_idle` at that time
        however busy it is with other writers (the ``interval`` fsync policy's bound).
        """

    def flush_idle(self) -> None:
        """Sync what is pending; called when idle and at :meth:`sync_deadline`."""


_Request = tuple[BatchWriter, Any, "asyncio.Future[Any]", asyncio.AbstractEventLoop]


class IoPool:
    """A fixed set of I/O worker threads (see the module docstring).

    Args:
        io_workers: Number of threads; shard ``n`` is served by worker ``n % io_workers``.
        max_items: Most requests one worker drains into one group commit.
        flush_interval_ms: After the first request, how long to keep collecting (0: take
            only what is already queued; latency-optimal, batching comes from fsync time).
        idle_flush_interval_ms: How often an idle worker calls ``flush_idle`` on writers it
            served (drives ``fsync="interval"``).
    """

    def __init__(
        self,
        io_workers: int = DEFAULT_IO_WORKERS,
        *,
        max_items: int = DEFAULT_MAX_ITEMS,
        flush_interval_ms: float = 0.0,
        idle_flush_interval_ms: float = 100.0,
        name: str = "seglog-io",
    ) -> None:
        if io_workers < 1:
            raise InvalidArgument("io_workers must be >= 1")
        if max_items < 1:
            raise InvalidArgument("max_items must be >= 1")
        if flush_interval_ms < 0 or idle_flush_interval_ms <= 0:
            raise InvalidArgument("flush intervals must be positive")
        self.io_workers = io_workers
        self.max_items = max_items
        self.flush_interval_s = flush_interval_ms / 1000
        self.idle_flush_interval_s = idle_flush_interval_ms / 1000
        self._queues: list[queue.SimpleQueue[Any]] = [queue.SimpleQueue() for _ in range(io_workers)]
        self._closed = False
        self._threads = [
            threading.Thread(target=self._run, args=(q,), name=f"{name}-{i}", daemon=True)
            for i, q in enumerate(self._queues)
        ]
        for t in self._threads:
            t.start()

    def submit(self, shard: int, writer: BatchWriter, item: Any) -> asyncio.Future[Any]:
        """Queue ``item`` for ``writer`` on the worker of ``shard``; await the returned future.

        Must be called from a running event loop.
        """
        if self._closed:
            raise ClosedResourceError("the I/O pool is closed")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._queues[shard % self.io_workers].put((writer, item, fut, loop))
        return fut

    def close(self) -> None:
        """Finish queued work, then stop the threads (blocking)."""
        if self._closed:
            return
        self._closed = True
        for q in self._queues:
            q.put(_STOP)
        for t in self._threads:
            t.join()

    # --- worker ------------------------------------------------------------------------

    def _run(self, q: queue.SimpleQueue[Any]) -> None:
        touched: set[BatchWriter] = set()
        deadlines = _Deadlines()
        while True:
            timeout = deadlines.wait_s(time.monotonic())
            if touched:
                timeout = (
                    self.idle_flush_interval_s
                    if timeout is None
                    else min(timeout, self.idle_flush_interval_s)
                )
            try:
                first = q.get(timeout=timeout) if timeout is None or timeout > 0 else q.get_nowait()
            except queue.Empty:
                if deadlines.run_due(time.monotonic()) == 0:
                    idle = list(touched)
                    self._flush_idle(touched)
                    deadlines.clear()
                    # What the idle flush leaves for later (rows buffered until their own
                    # deadline) keeps its deadline: forgetting it would leave them buffered
                    # until the next write, however long that takes.
                    for writer in idle:
                        deadlines.watch(writer)
                continue
            if first is _STOP:
                self._flush_idle(touched)
                return
            batch: list[_Request] = [first]
            stop = self._drain(q, batch)
            self._write(batch, touched, deadlines)
            deadlines.run_due(time.monotonic())
            if stop:
                self._flush_idle(touched)
                return

    def _drain(self, q: queue.SimpleQueue[Any], batch: list[_Request]) -> bool:
        deadline = time.monotonic() + self.flush_interval_s if self.flush_interval_s else 0.0
        while len(batch) < self.max_items:
            try:
                if deadline:
                    remaining = deadline - time.monotonic()
                    item = q.get(timeout=remaining) if remaining > 0 else q.get_nowait()
                else:
                    item = q.get_nowait()
            except queue.Empty:
                break
            if item is _STOP:
                return True
            batch.append(item)
        return False

    @staticmethod
    def _flush_idle(touched: set[BatchWriter]) -> None:
        for writer in touched:
            try:
                writer.flush_idle()
            except Exception:
                log.exception("idle flush of %r failed", writer)
        touched.clear()

    @staticmethod
    def _write(batch: list[_Request], touched: set[BatchWriter], deadlines: _Deadlines) -> None:
        groups: dict[BatchWriter, list[_Request]] = {}
        for req in batch:
            groups.setdefault(req[0], []).append(req)
        completions: dict[
            asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any, BaseException | None]]
        ] = {}
        for writer, reqs in groups.items():
            touched.add(writer)
            outcome: list[tuple[asyncio.Future[Any], Any, BaseException | None]]
            try:
                results = writer.write_batch([r[1] for r in reqs])
                outcome = [
                    (r[2], None, res.error) if isinstance(res, ItemError) else (r[2], res, None)
                    for r, res in zip(reqs, results, strict=True)
                ]
            except BaseException as exc:
                outcome = [(r[2], None, exc) for r in reqs]
            deadlines.watch(writer)
            for req, done in zip(reqs, outcome, strict=True):
                completions.setdefault(req[3], []).append(done)
        for loop, finished in completions.items():
            with contextlib.suppress(RuntimeError):  # a closed loop has nobody waiting
                loop.call_soon_threadsafe(_complete, finished)


class _Deadlines:
    """The sync deadlines of one worker's writers, earliest first (a heap)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, BatchWriter]] = []
        self._pending: dict[BatchWriter, float] = {}
        self._tie = itertools.count()

    def watch(self, writer: BatchWriter, *, not_before: float | None = None) -> None:
        """Schedule ``writer`` if it has a deadline that is not scheduled yet (no earlier than
        ``not_before``)."""
        due = writer.sync_deadline()
        if due is None:
            return
        if not_before is not None:
            due = max(due, not_before)
        if self._pending.get(writer) == due:
            return
        self._pending[writer] = due
        heapq.heappush(self._heap, (due, next(self._tie), writer))

    def wait_s(self, now: float) -> float | None:
        """Seconds until the earliest deadline (``None``: none)."""
        return max(0.0, self._heap[0][0] - now) if self._heap else None

    def run_due(self, now: float) -> int:
        """Sync every writer whose deadline has come, once each; return how many were synced.

        A writer still due afterwards (its work failed and was re-armed) waits
        ``DEADLINE_RETRY_S``: retrying it here at once would loop without ever returning to
        the queue, and the worker would serve no request while the failure lasts.
        """
        count = 0
        ran: list[BatchWriter] = []
        while self._heap and self._heap[0][0] <= now:
            due, _, writer = heapq.heappop(self._heap)
            if self._pending.get(writer) != due:
                continue  # superseded by a later schedule
            del self._pending[writer]
            if writer.sync_deadline() is None:
                continue  # synced on its own meanwhile
            try:
                writer.flush_idle()
            except Exception:
                log.exception("scheduled sync of %r failed", writer)
            count += 1
            ran.append(writer)
        for writer in ran:
            self.watch(writer, not_before=now + DEADLINE_RETRY_S)  # still unsynced: later
        return count

    def clear(self) -> None:
        """Forget every deadline (all writers were just flushed)."""
        self._heap.clear()
        self._pending.clear()


def _complete(done: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
    for fut, result, exc in done:
        if fut.cancelled():
            continue
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(result)
