"""Subscriptions: stream iterators that push, with one read serving many subscribers.

``db.subscribe(iterator, max_unacked=N)`` returns a :class:`Subscription`, an async iterator
of :class:`SubscriptionBatch` (EMQX Durable Storage's ``subscribe``/``suback``). Each batch
carries a cumulative ``seqno`` (records delivered so far, EMQX's counting), the records, and
the iterator that goes on after them. At most ``max_unacked`` records are delivered and not
acknowledged: :meth:`Subscription.suback` acknowledges up to a seqno and lets delivery go on.

The shared read (EMQX's beamformer, simplified to one process): per ``(shard, stream)`` of a
database there is one :class:`_Beam`, a task woken by appends to the shard (the engine's
append listener, as ``db.tail`` is; never a timer). Its subscribers are on the shared path
(*members*) or *lagging*:

* The beam keeps a position in the shard. When an append wakes it and it has members, it
  reads the stream from there **once**, without a filter, and hands every member the rows
  its own filter and start time select (filters are grouped, so equal filters cost one
  regex pass). ``SubscriptionStats.shared_reads`` counts these reads. The engine notes
  where subscribed streams are stamped (``watch_stream``), so an append wakes only the
  beams whose stream it stamped; the others are not woken at all, and one woken for
  another reason whose stream the appends missed moves to the end without reading (both
  count as ``skipped_reads``): reads, and task switches, per append follow the streams it
  touched, not the subscribers nor the streams.
* A subscriber whose position is behind the beam (it started behind, or its window filled
  so it got only part of a batch) catches up with its own ``next_arrow`` reads
  (``catchup_reads``; lagging subscribers at the same iterator share one), and rejoins the
  shared path once it reaches the beam's position (``joins``).
* A member whose window is full leaves the path when a batch has rows for it: it never
  holds the beam back, so one slow subscriber does not stall the others.

Catch-up reads run in the beam's task, at most :data:`_CATCHUP_PER_STEP` groups between two
shared reads, round-robin, so catching up does not starve the members either.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from seglog.errors import (
    BusyResourceError,
    ClosedResourceError,
    InvalidArgument,
    InvalidIterator,
    SubackOutOfRange,
)
from seglog.iterators import Iterator
from seglog.record import Record, records_from_table
from seglog.topics import structure_regex

if TYPE_CHECKING:
    from seglog.db import Database

__all__ = [
    "Subscription",
    "SubscriptionBatch",
    "SubscriptionManager",
    "SubscriptionSelector",
    "SubscriptionStats",
]

# Records one shared or catch-up read asks for (EMQX's beamformer batch_size).
BATCH_RECORDS: Final = 1000
# Catch-up reads (groups of lagging subscribers) a beam does between two shared reads.
_CATCHUP_PER_STEP: Final = 4
_MIN_TS: Final = -(1 << 63)


class SubscriptionBatch:
    """Records delivered to a subscription at once (read-only by convention).

    Attributes:
        seqno: Records delivered to the subscription so far, this batch included (pass it to
            :meth:`Subscription.suback`).
        iterator: The iterator that goes on after this batch (store it to resume).
        table: The records, with the columns of ``Database.read_arrow``.
        lagging: Whether the batch came from the subscriber's own catch-up read rather than
            the shared read.
    """

    # A plain class with slots: one is made per subscriber and batch, and a frozen
    # dataclass's __init__ cost a fifth of a delivery.
    __slots__ = ("_records", "iterator", "lagging", "seqno", "table")

    def __init__(self, seqno: int, iterator: Iterator, table: pa.Table, lagging: bool = False) -> None:
        self.seqno = seqno
        self.iterator = iterator
        self.table = table
        self.lagging = lagging
        self._records: list[Record] | None = None

    def __len__(self) -> int:
        return int(self.table.num_rows)

    @property
    def records(self) -> list[Record]:
        """The records as :class:`~seglog.Record` objects (built on first access)."""
        if self._records is None:
            self._records = records_from_table(self.table, self.iterator.shard)
        return self._records

    def __repr__(self) -> str:
        return (
            f"SubscriptionBatch(seqno={self.seqno}, records={len(self)}, "
            f"iterator={self.iterator!r}, lagging={self.lagging})"
        )


@dataclass(frozen=True)
class SubscriptionStats:
    """What the subscriptions of a database cost (``Database.subscription_stats``).

    Attributes:
        subscriptions: Open subscriptions.
        beams: Streams with at least one subscription (one task each).
        shared_reads: Stream reads done once for every member of a beam.
        catchup_reads: Stream reads done for lagging subscribers.
        skipped_reads: Shared reads not done because the appends since the last one missed
            the stream (the engine notes where subscribed streams are stamped).
        joins: Times a subscriber joined a shared path (when subscribing at the head, or
            after catching up).
        records_delivered: Records handed to subscriptions in total.
    """

    subscriptions: int
    beams: int
    shared_reads: int
    catchup_reads: int
    skipped_reads: int
    joins: int
    records_delivered: int


@dataclass
class _Counters:
    shared_reads: int = 0
    catchup_reads: int = 0
    skipped_reads: int = 0
    joins: int = 0
    records_delivered: int = 0


class Subscription:
    """Batches of one stream iterator as they become durable; see the module docstring.

    Made by ``Database.subscribe``. ``async for batch in sub`` yields
    :class:`SubscriptionBatch` es and ends when the subscription or the database is closed
    (or the stream ends); a failed read is raised from the iteration, after the batches
    delivered before it, and ends the subscription.
    """

    def __init__(self, manager: SubscriptionManager, iterator: Iterator, max_unacked: int) -> None:
        self._manager = manager
        self.max_unacked = max_unacked
        self._it = iterator  # the position after everything handed to the queue
        # On a shared path, the beam's position is also the subscription's when that is
        # further: reads with nothing for it move it without touching it (see iterator).
        self._beam: _Beam | None = None
        self._sent = 0  # seqno of the last batch queued
        self._seqno = 0  # seqno of the last batch the subscriber took
        self._acked = 0
        self._queue: deque[SubscriptionBatch] = deque()
        self._ready = asyncio.Event()
        self._error: BaseException | None = None
        self._failure: BaseException | None = None  # kept for ``error`` after it was raised
        self._done = False
        self._selector: SubscriptionSelector | None = None
        self._marked = False  # in its selector's ready queue
        self._closed = False
        self._lagging = True
        self.joins = 0

    # --- what EMQX's subscription_info reports ------------------------------------------

    @property
    def seqno(self) -> int:
        """Records delivered so far (the ``seqno`` of the last batch taken)."""
        return self._seqno

    @property
    def acked(self) -> int:
        """The last acknowledged seqno."""
        return self._acked

    @property
    def unacked(self) -> int:
        """Records handed out (queued included) and not acknowledged: at most ``max_unacked``."""
        return self._sent - self._acked

    @property
    def stuck(self) -> bool:
        """Whether the window is full (nothing more is delivered until a suback)."""
        return self.unacked >= self.max_unacked

    @property
    def lagging(self) -> bool:
        """Whether the subscription reads on its own (not on its stream's shared path)."""
        return self._lagging

    @property
    def iterator(self) -> Iterator:
        """The iterator after everything delivered (queued batches included)."""
        beam = self._beam
        if beam is not None and self._it.position < beam.position:
            self._it = self._it.advanced(beam.position)  # moved on by reads with nothing for it
        return self._it

    @property
    def closed(self) -> bool:
        """Whether the subscription was closed (by :meth:`close` or the database)."""
        return self._closed

    @property
    def done(self) -> bool:
        """Whether delivery has ended (closed, end of stream, or a failed read: see ``error``)."""
        return self._done

    @property
    def error(self) -> BaseException | None:
        """The failed read that ended delivery, if one did."""
        return self._failure

    def _room(self) -> int:
        return self.max_unacked - (self._sent - self._acked)

    # --- flow control -----------------------------------------------------------------

    def suback(self, seqno: int) -> None:
        """Acknowledge the records up to ``seqno`` (a batch's ``seqno``); delivery goes on.

        Raises:
            InvalidArgument: ``seqno`` is not an int.
            SubackOutOfRange: ``seqno`` is beyond the last batch taken, or below an earlier
                suback.
            ClosedResourceError: The subscription is closed.
        """
        if type(seqno) is not int:
            raise InvalidArgument(f"suback takes an int seqno, not {type(seqno).__name__}")
        if self._closed:
            raise ClosedResourceError("the subscription is closed")
        if seqno > self._seqno:
            raise SubackOutOfRange(
                f"suback({seqno}) is beyond the {self._seqno} records delivered",
                seqno=seqno,
                acked=self._acked,
                delivered=self._seqno,
            )
        if seqno < self._acked:
            raise SubackOutOfRange(
                f"suback({seqno}) goes back from the acknowledged {self._acked}",
                seqno=seqno,
                acked=self._acked,
                delivered=self._seqno,
            )
        if seqno > self._acked:
            self._acked = seqno
            if self._lagging:
                # A parked subscriber may have room again. One on the shared path gets its
                # rows from the next shared read whatever its acks (a full window makes it
                # leave the path): nothing to wake.
                self._manager._wake_for(self)

    # --- iteration --------------------------------------------------------------------

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> SubscriptionBatch:
        if self._selector is not None:
            raise BusyResourceError("the subscription is read through a SubscriptionSelector")
        while True:
            if self._queue:
                batch = self._queue.popleft()
                self._seqno = batch.seqno
                return batch
            if self._error is not None:
                error, self._error = self._error, None
                raise error
            if self._done:
                raise StopAsyncIteration
            self._ready.clear()
            await self._ready.wait()

    # --- delivery (called by the beam) ---------------------------------------------------

    def _deliver(self, table: pa.Table, iterator: Iterator, *, lagging: bool) -> None:
        self._it = iterator
        if not table.num_rows:
            return
        self._sent += table.num_rows
        self._manager._counters.records_delivered += table.num_rows
        self._queue.append(SubscriptionBatch(self._sent, iterator, table, lagging))
        if self._selector is not None:
            if not self._marked:
                self._selector._mark(self)
        else:
            self._ready.set()

    def _finish(self, error: BaseException | None = None) -> None:
        """End delivery: the batches queued are still taken, then ``error`` or the end."""
        if self._done:
            return
        self._done = True
        self._error = self._failure = error
        self._ready.set()
        if self._selector is not None and not self._marked:
            self._selector._mark(self)

    # --- lifecycle --------------------------------------------------------------------

    async def close(self) -> None:
        """Stop delivery; batches not yet taken are dropped and the iteration ends."""
        if self._closed:
            return
        self._closed = True
        self._queue.clear()
        self._error = None
        self._finish()
        self._manager._remove(self)

    async def unsubscribe(self) -> None:
        """Same as :meth:`close` (EMQX's name)."""
        await self.close()

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        it = self.iterator
        state = "closed" if self._closed else "lagging" if self._lagging else "shared"
        return (
            f"<Subscription shard={it.shard} stream={it.stream} position={it.position} "
            f"seqno={self._seqno} acked={self._acked} window={self.max_unacked} {state}>"
        )


class SubscriptionSelector:
    """Many subscriptions read by one task: what a server's connection handler wants.

    ``async for batch in sub`` costs a task switch per subscriber and batch (about 40 µs of
    Python per delivery on a 2-core VM); with thousands of subscribers that, not the reads,
    is the limit. A selector collects the batches of all its subscriptions as the shared
    reads hand them out, and :meth:`poll` returns every one queued in one wake-up.

    A subscription belongs to at most one selector, and while it does it cannot be iterated
    with ``async for`` (``BusyResourceError``). Flow control is the subscription's own:
    ``sub.suback(batch.seqno)`` as before.
    """

    def __init__(self, subscriptions: Iterable[Subscription] = ()) -> None:
        self._subs: set[Subscription] = set()
        self._ready: deque[Subscription] = deque()
        self._wake = asyncio.Event()
        self._closed = False
        for sub in subscriptions:
            self.add(sub)

    def __len__(self) -> int:
        return len(self._subs)

    def add(self, sub: Subscription) -> None:
        """Read ``sub`` through this selector (batches it already queued included).

        Raises:
            InvalidArgument: Not a subscription.
            BusyResourceError: It belongs to another selector.
            ClosedResourceError: The selector is closed.
        """
        if not isinstance(sub, Subscription):
            raise InvalidArgument(f"a selector takes Subscriptions, not {type(sub).__name__}")
        if self._closed:
            raise ClosedResourceError("the selector is closed")
        if sub._selector is self:
            return
        if sub._selector is not None:
            raise BusyResourceError("the subscription belongs to another selector")
        sub._selector = self
        self._subs.add(sub)
        if sub._queue or sub._done:
            self._mark(sub)

    def remove(self, sub: Subscription) -> None:
        """Stop reading ``sub`` here (it stays open; ``async for`` reads it again)."""
        if sub._selector is not self:
            return
        sub._selector = None
        self._subs.discard(sub)
        if sub._queue or sub._done:
            sub._ready.set()  # an iteration waiting on it (none may) finds what is queued

    def _mark(self, sub: Subscription) -> None:
        sub._marked = True
        self._ready.append(sub)
        self._wake.set()

    async def poll(
        self, max_batches: int | None = None
    ) -> list[tuple[Subscription, SubscriptionBatch | None]]:
        """Wait for batches; return every one queued (at most ``max_batches``), oldest
        subscription first, each as ``(subscription, batch)``.

        A subscription whose delivery ended (closed, end of stream, or a failed read, then
        in ``sub.error``) comes once as ``(subscription, None)`` after its last batch and
        leaves the selector. An empty list means the selector is closed or has no
        subscriptions left.

        Raises:
            InvalidArgument: ``max_batches`` is not an int >= 1.
        """
        if max_batches is not None and (type(max_batches) is not int or max_batches < 1):
            raise InvalidArgument(f"max_batches must be an int >= 1 or None, not {max_batches!r}")
        limit = max_batches if max_batches is not None else 1 << 62
        ready = self._ready
        while not ready:
            if self._closed or not self._subs:
                return []
            self._wake.clear()
            await self._wake.wait()
        out: list[tuple[Subscription, SubscriptionBatch | None]] = []
        while ready and len(out) < limit:
            sub = ready.popleft()
            sub._marked = False
            if sub._selector is not self:
                continue  # removed after it was marked
            queue = sub._queue
            while queue and len(out) < limit:
                batch = queue.popleft()
                sub._seqno = batch.seqno
                out.append((sub, batch))
            if queue or (sub._done and len(out) >= limit):
                self._mark(sub)  # the rest at the next poll, after the others queued now
            elif sub._done:
                out.append((sub, None))
                sub._selector = None
                self._subs.discard(sub)
        return out

    def close(self) -> None:
        """Let go of every subscription (they stay open) and end a waiting :meth:`poll`."""
        self._closed = True
        for sub in list(self._subs):
            self.remove(sub)
        self._ready.clear()
        self._wake.set()

    async def __aenter__(self) -> SubscriptionSelector:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


@dataclass
class _FilterGroup:
    """Members of a beam with one filter and start time: their rows are selected once per read."""

    pattern: str | None
    min_ts: int
    members: dict[Subscription, None] = field(default_factory=dict)
    # The iterator after the read, for members that were at the read's start (built once:
    # with thousands of members, building one each was a third of the fan-out).
    next_iterator: Iterator | None = None

    def select(self, table: pa.Table, oldest_ts: int) -> pa.Table:
        """The rows of ``table`` (whose oldest ``ts`` is ``oldest_ts``) the group wants."""
        mask: np.ndarray[Any, np.dtype[np.bool_]] | None = None
        if self.min_ts > oldest_ts:
            ts_mask = table.column("ts").to_numpy() >= self.min_ts
            if not ts_mask.all():  # live data is rarely older than a start time
                mask = ts_mask
        if self.pattern is not None:
            matched = pc.match_substring_regex(table.column("topic"), self.pattern).to_numpy(
                zero_copy_only=False
            )
            mask = matched if mask is None else mask & matched
        return table if mask is None else table.filter(pa.array(mask))


class _Beam:
    """The shared read of one stream of one shard, and the catch-up of its laggards."""

    def __init__(
        self,
        manager: SubscriptionManager,
        shard: int,
        stream: int,
        check: int,
        structure: tuple[str, ...],
        generation: int = 1,
    ) -> None:
        self.manager = manager
        self.shard = shard
        self.stream = stream
        self.generation = generation
        self.structure = structure
        width = structure.count("+")
        # Reads every row of the stream: each member's filter is applied to the result.
        self.iterator = Iterator(
            manager.db.id, shard, stream, check, 0, _MIN_TS, (None,) * width, generation=generation
        )
        manager.db._watch_stream(shard, stream, True)  # before the end is read: nothing slips by
        self.position = manager.db.end_offset(shard)  # the head, when the first one subscribes
        self.members: dict[Subscription, None] = {}  # insertion-ordered sets
        self.lagging: dict[Subscription, None] = {}
        # The members by (varying filter, start time): kept as they join and leave, since
        # every read hands out rows group by group.
        self.groups: dict[tuple[tuple[str | None, ...], int], _FilterGroup] = {}
        self.wake = asyncio.Event()
        self.closed = False
        self._rr = 0
        self.task = asyncio.get_running_loop().create_task(
            self._run(), name=f"seglog-beam-{manager.db.name}-{shard}-{stream}"
        )

    @property
    def subscribers(self) -> int:
        return len(self.members) + len(self.lagging)

    def add(self, sub: Subscription) -> None:
        self.lagging[sub] = None
        self.wake.set()

    def remove(self, sub: Subscription) -> None:
        sub.iterator  # noqa: B018 -- settles its position before it leaves the path
        self._off_path(sub)
        self.lagging.pop(sub, None)

    def _off_path(self, sub: Subscription) -> None:
        sub._beam = None
        if self.members.pop(sub, 0) is None:
            key = (sub.iterator.varying_filter, sub.iterator.start_time_us)
            group = self.groups[key]
            del group.members[sub]
            if not group.members:
                del self.groups[key]

    def _join(self, sub: Subscription) -> None:
        if not self.members and sub.iterator.position > self.position:
            self.position = sub.iterator.position  # nobody on the path: it moves to the newcomer
        self.lagging.pop(sub, None)
        self.members[sub] = None
        key = (sub.iterator.varying_filter, sub.iterator.start_time_us)
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = _FilterGroup(structure_regex(self.structure, key[0]), key[1])
        group.members[sub] = None
        sub._lagging = False
        sub._beam = self
        sub.joins += 1
        self.manager._counters.joins += 1

    def _retire(self, sub: Subscription, error: BaseException | None = None) -> None:
        """End a subscription from here (its stream ended, or a read failed)."""
        sub._finish(error)
        self.manager._remove(sub)

    def _leave(self, sub: Subscription) -> None:
        self._off_path(sub)
        self.lagging[sub] = None
        sub._lagging = True

    async def _run(self) -> None:
        try:
            while not self.closed:
                self.wake.clear()  # before looking: a wake-up during the step is kept
                if not await self._step():
                    await self.wake.wait()
        except Exception as exc:  # a bug here must reach the subscribers, not vanish in a task
            for sub in [*self.members, *self.lagging]:
                sub._finish(exc)
            self.manager._drop_beam(self)

    async def _step(self) -> bool:
        """One shared read (if there is news) and a few catch-up reads; whether it did any."""
        worked = False
        end = self.manager.db.end_offset(self.shard)
        # A log cut back below the beam (truncate_to) moves it back to the end, as an
        # iterator moves on its next call.
        self.position = min(self.position, end)
        for sub in list(self.lagging):
            if sub.iterator.position >= self.position and not sub.stuck:
                self._join(sub)
        if self.members and self.position < end:
            if self.manager.db._stream_stamped_since(self.shard, self.stream, self.position, self.generation):
                worked = await self._shared_read()
            else:
                self._skip_to(end)
        if self.closed:
            return worked
        groups: dict[Iterator, list[Subscription]] = {}
        for sub in self.lagging:
            if sub._room() > 0 and not sub._done:
                groups.setdefault(sub.iterator, []).append(sub)
        if groups:
            order = list(groups.values())
            start = self._rr % len(order)
            self._rr += _CATCHUP_PER_STEP
            for i in range(min(_CATCHUP_PER_STEP, len(order))):
                if self.closed:
                    break
                worked |= await self._catch_up(order[(start + i) % len(order)])
        return worked

    def _skip_to(self, end: int) -> None:
        """Move the path to ``end`` without reading: the appends since missed the stream."""
        self.manager._counters.skipped_reads += 1
        self.position = end  # the members follow (Subscription.iterator): no work per member

    async def _shared_read(self) -> bool:
        """Read the stream once for every member; whether that moved anything."""
        manager = self.manager
        read_from = self.position
        try:
            it, table = await manager.db.next_arrow(self.iterator.advanced(read_from), BATCH_RECORDS)
        except Exception as exc:
            if not self.closed:  # closing waits for this read: a failure then is no news
                for sub in list(self.members):
                    self._retire(sub, exc)
            return True
        manager._counters.shared_reads += 1
        if self.closed:
            return True
        self.position = it.position
        if it.end_of_stream and not table.num_rows:
            for sub in list(self.members):
                sub._deliver(
                    table, replace(sub.iterator, position=it.position, end_of_stream=True), lagging=False
                )
                self._retire(sub)
            return True
        # Live rows are rarely older than a start time: one min over the read spares every
        # group its own pass over the timestamps.
        oldest_ts = int(pc.min(table.column("ts")).as_py()) if table.num_rows else 0
        for group in list(self.groups.values()):
            group.next_iterator = None
            rows = group.select(table, oldest_ts) if table.num_rows else table
            n = rows.num_rows
            if not n:
                continue  # its members follow the path's position (Subscription.iterator)
            after: Iterator | None = None
            for sub in list(group.members):
                if sub._it.position <= read_from and sub.max_unacked - (sub._sent - sub._acked) >= n:
                    # The common case, inline (thousands of members): at the read's start,
                    # with room for every row.
                    if after is None:
                        after = group.next_iterator = sub._it.advanced(it.position, it.epoch)
                    sub._deliver(rows, after, lagging=False)
                else:
                    self._hand_out(group, sub, rows, it, read_from)
        return bool(table.num_rows) or it.position != read_from

    def _hand_out(
        self, group: _FilterGroup, sub: Subscription, rows: pa.Table, read: Iterator, read_from: int
    ) -> None:
        """Give a member its rows of a shared read (``read``: the iterator the read returned),
        within its window (else it leaves)."""
        next_pos = read.position
        # Its own position, or the read's start when reads with nothing for it moved it on
        # (not ``sub.iterator``: the path has already moved past this read).
        pos = max(sub._it.position, read_from)
        if pos == read_from:
            if group.next_iterator is None:
                group.next_iterator = sub._it.advanced(next_pos, read.epoch)
            after = group.next_iterator
        else:
            if rows.num_rows:
                # It joined ahead of the beam (caught up past it): rows it has had are skipped.
                first = int(np.searchsorted(rows.column("offset").to_numpy(), pos))
                rows = rows.slice(first)
            after = sub._it.advanced(next_pos, read.epoch) if next_pos >= pos else sub._it.advanced(pos)
        if not rows.num_rows or sub._room() >= rows.num_rows:
            sub._deliver(rows, after, lagging=False)
            return
        room = sub._room()
        # The window cuts the batch: deliver what fits, go on alone after the last row given.
        if room > 0:
            part = rows.slice(0, room)
            last = int(part.column("offset")[room - 1].as_py())
            sub._deliver(part, sub._it.advanced(last + 1), lagging=False)
        else:
            first_offset = int(rows.column("offset")[0].as_py())
            sub._deliver(rows.slice(0, 0), sub._it.advanced(first_offset), lagging=False)
        self._leave(sub)

    async def _catch_up(self, subs: list[Subscription]) -> bool:
        """One read for lagging subscribers at the same iterator, each taking what fits;
        whether that moved anything (else they wait for an append)."""
        manager = self.manager
        iterator = subs[0].iterator
        n = min(BATCH_RECORDS, max(s._room() for s in subs))
        try:
            it, table = await manager.db.next_arrow(iterator, n)
        except Exception as exc:
            if not self.closed:
                for sub in subs:
                    self._retire(sub, exc)
            return True
        manager._counters.catchup_reads += 1
        if self.closed:
            return True
        moved = bool(table.num_rows) or it.position != iterator.position
        for sub in subs:
            if sub not in self.lagging or sub.iterator != iterator:
                continue  # closed (or moved) while the read ran
            room = sub._room()
            if table.num_rows > room:
                part = table.slice(0, room)
                last = int(part.column("offset")[room - 1].as_py())
                sub._deliver(part, iterator.advanced(last + 1), lagging=True)
                continue
            sub._deliver(table, it, lagging=True)
            if it.end_of_stream and not table.num_rows:
                self._retire(sub)
            elif it.position >= self.position and not sub.stuck:
                self._join(sub)
                moved = True  # the next step may read for it on the shared path
        return moved


class SubscriptionManager:
    """The beams of one database (one per subscribed stream); ``Database`` owns one."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._beams: dict[int, dict[tuple[int, int], _Beam]] = {}  # shard -> (generation, stream) -> beam
        self._subs: dict[Subscription, _Beam] = {}
        self._counters = _Counters()
        self._closed = False

    def subscribe(self, iterator: Iterator, max_unacked: int) -> Subscription:
        """A subscription from ``iterator``'s position (the checks are ``Database.subscribe``'s)."""
        if self._closed:
            raise ClosedResourceError(f"database {self.db.name!r} is closed")
        if not isinstance(iterator, Iterator):
            raise InvalidArgument(f"subscribe takes an Iterator, not {type(iterator).__name__}")
        if type(max_unacked) is not int or max_unacked < 1:
            raise InvalidArgument(f"max_unacked must be an int >= 1, not {max_unacked!r}")
        structure, _special = self.db._owned_stream(
            iterator.db_id, iterator.shard, iterator.stream, iterator.check, iterator.generation
        )
        if len(iterator.varying_filter) != structure.count("+"):
            raise InvalidIterator("the iterator's filter does not fit its stream")
        sub = Subscription(self, iterator, max_unacked)
        if iterator.end_of_stream:
            sub._finish()
            return sub
        by_stream = self._beams.setdefault(iterator.shard, {})
        key = (iterator.generation, iterator.stream)
        beam = by_stream.get(key)
        if beam is None:
            beam = by_stream[key] = _Beam(
                self, iterator.shard, iterator.stream, iterator.check, structure, iterator.generation
            )
        self._subs[sub] = beam
        beam.add(sub)
        return sub

    def notify(self, shard: int) -> None:
        """An append to ``shard`` completed: wake its beams that have news (called on the
        event loop).

        A beam with members only wakes when the append stamped its stream: with a hundred
        subscribed streams an append touching five would otherwise switch to a hundred
        tasks to find nothing (the beam's position then stays put; its next read starts
        there and the stream index skips the frames without the stream). A beam with
        lagging subscribers always wakes: they may be waiting at the head.
        """
        beams = self._beams.get(shard)
        if beams:
            # Once per append, not once per beam: the current generation (a beam of an older
            # one always wakes, to find its end) and the stamper's watch lookup.
            current = self.db._current_generation()
            stamped_since = self.db._streams().stream_stamped_since
            for beam in beams.values():
                if (
                    beam.lagging
                    or beam.generation != current
                    or stamped_since(shard, beam.stream, beam.position)
                ):
                    beam.wake.set()
                elif beam.members:
                    self._counters.skipped_reads += 1

    def truncated(self, shard: int, end: int) -> None:
        """``shard`` was cut back to ``end``: positions past it move back to it, so the
        records appended from there on are delivered (the ones cut are gone)."""
        for beam in (self._beams.get(shard) or {}).values():
            for sub in [*beam.members, *beam.lagging]:
                if sub.iterator.position > end:  # settled first: where it truly was
                    sub._it = sub._it.advanced(end)
            beam.position = min(beam.position, end)
            beam.wake.set()

    def _wake_for(self, sub: Subscription) -> None:
        beam = self._subs.get(sub)
        if beam is not None:
            beam.wake.set()

    def _remove(self, sub: Subscription) -> None:
        beam = self._subs.pop(sub, None)
        if beam is None:
            return
        beam.remove(sub)
        if not beam.subscribers:
            self._drop_beam(beam)

    def _drop_beam(self, beam: _Beam) -> None:
        if beam.closed:
            return
        for sub in list(beam.members):
            sub.iterator  # noqa: B018 -- settles its position: the path goes away
            sub._beam = None
        beam.closed = True
        beam.wake.set()
        if not self._closed:  # a closing database's engine forgets its watches itself
            self.db._watch_stream(beam.shard, beam.stream, False)
        by_stream = self._beams.get(beam.shard)
        if by_stream is not None and by_stream.get((beam.generation, beam.stream)) is beam:
            del by_stream[beam.generation, beam.stream]
            if not by_stream:
                del self._beams[beam.shard]
        for sub in [s for s, b in self._subs.items() if b is beam]:
            del self._subs[sub]

    def stats(self) -> SubscriptionStats:
        """The counters (cumulative for the database) and what is open now."""
        c = self._counters
        beams = sum(len(b) for b in self._beams.values())
        return SubscriptionStats(
            len(self._subs),
            beams,
            c.shared_reads,
            c.catchup_reads,
            c.skipped_reads,
            c.joins,
            c.records_delivered,
        )

    async def close(self) -> None:
        """End every subscription; waits for the reads in flight (before the engine closes)."""
        self._closed = True
        beams: Iterable[_Beam] = [b for by in self._beams.values() for b in by.values()]
        subs = list(self._subs)
        tasks = []
        for beam in list(beams):
            tasks.append(beam.task)
            self._drop_beam(beam)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for sub in subs:
            sub._closed = True
            sub._finish()
