"""Reading every shard of a database in the owning process: ``db.consumer()``.

A :class:`Consumer` keeps one position per shard (the next offset it will deliver), reads the
shards round-robin, and waits for new records without polling (woken by appends, like
``db.tail``). With a group it starts at the group's commits and :meth:`Consumer.commit`
stores its positions durably. The names follow aiokafka's ``AIOKafkaConsumer``
(``getone``, ``getmany``, ``position``, ``seek``, ``commit``, ``committed``), with shards in
the place of partitions.

Records of one shard come in offset order; shards are interleaved batch by batch, not merged
by time.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections import deque
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Literal

from seglog.errors import ClosedResourceError, InvalidArgument, OffsetOutOfRange
from seglog.groups import validate_group_name
from seglog.record import Record

if TYPE_CHECKING:
    from seglog.db import Database

__all__ = ["Consumer", "StartFrom"]

StartFrom = Literal["earliest", "latest"] | dt.datetime | Mapping[int, int] | None
"""Where a :class:`Consumer` starts: see :meth:`seglog.Database.consumer`."""


class Consumer:
    """An async iterator of :class:`~seglog.Record` over every shard of a database.

    Create with :meth:`seglog.Database.consumer`. ``async for rec in consumer`` yields
    records as they become durable and ends when the database closes; :meth:`getmany`
    returns what is there (waiting at most ``timeout_ms``). A position below the shard's
    start (retention deleted those records) moves to the start.
    """

    def __init__(
        self,
        db: Database,
        group: str | None,
        *,
        from_: StartFrom = None,
        batch_records: int = 1000,
    ) -> None:
        if group is not None:
            validate_group_name(group)
        if type(batch_records) is not int or batch_records < 1:
            raise InvalidArgument("batch_records must be an int >= 1")
        if not (from_ is None or from_ in ("earliest", "latest") or isinstance(from_, dt.datetime | Mapping)):
            raise InvalidArgument(
                f"from_ must be 'earliest', 'latest', a datetime or {{shard: offset}}, not {from_!r}"
            )
        self.db = db
        self.group = group
        self._from = from_
        self._batch = batch_records
        self._positions: dict[int, int] = {}
        self._committed: dict[int, int] = {}
        self._buffer: deque[Record] = deque()
        self._next_shard = 0
        self._started = False
        self._closed = False

    # --- lifecycle ---------------------------------------------------------------------

    async def __aenter__(self) -> Consumer:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def start(self) -> None:
        """Resolve the start positions (done by the first read if not called)."""
        if self._started:
            return
        db = self.db
        start = self._from
        positions: dict[int, int] = {}
        if isinstance(start, Mapping):
            for shard, offset in start.items():
                if type(offset) is not int or offset < 0:
                    raise InvalidArgument(f"from_[{shard!r}] must be an int >= 0, not {offset!r}")
                positions[db._check_shard(shard)] = offset
        for shard in range(db.shards):
            if shard in positions:
                continue
            if self.group is not None:
                committed = await db.committed(self.group, shard)
                if committed is not None:
                    self._committed[shard] = committed
                    if start is None:
                        positions[shard] = max(committed, db.start_offset(shard))
                        continue
            if start == "latest":
                positions[shard] = db.end_offset(shard)
            elif isinstance(start, dt.datetime):
                positions[shard] = await db.offset_for_time(shard, start)
            else:
                positions[shard] = db.start_offset(shard)
        self._positions = positions
        self._started = True

    async def close(self) -> None:
        """Stop; buffered records are dropped (positions stay where delivery stopped)."""
        self._closed = True
        self._buffer.clear()

    def _check(self) -> None:
        if self._closed:
            raise ClosedResourceError("the consumer is closed")

    # --- positions ---------------------------------------------------------------------

    def assignment(self) -> list[int]:
        """The shards this consumer reads: all of them."""
        return list(range(self.db.shards))

    def position(self, shard: int) -> int:
        """The next offset the consumer will deliver from ``shard``."""
        self.db._check_shard(shard)
        if not self._started:
            raise InvalidArgument("positions are known once the consumer started (await consumer.start())")
        return self._positions[shard]

    def positions(self) -> dict[int, int]:
        """The next offset to deliver, per shard."""
        return dict(self._positions)

    def seek(self, shard: int, offset: int) -> None:
        """Deliver ``shard`` from ``offset`` next (records of it already fetched are dropped)."""
        self._check()
        self.db._check_shard(shard)
        if type(offset) is not int or offset < 0:
            raise InvalidArgument(f"offset must be an int >= 0, not {offset!r}")
        if not self._started:
            raise InvalidArgument("seek after the consumer started (await consumer.start())")
        self._positions[shard] = offset
        self._buffer = deque(r for r in self._buffer if r.shard != shard)

    # --- reading -----------------------------------------------------------------------

    async def _fetch(self, max_records: int) -> list[Record]:
        """Read up to ``max_records`` past the buffered ones, shards round-robin; never waits."""
        db = self.db
        shards = db.shards
        fetched: dict[int, int] = {}
        for r in self._buffer:
            fetched[r.shard] = r.offset + 1  # type: ignore[index,operator]
        out: list[Record] = []
        first = self._next_shard
        for i in range(shards):
            if len(out) >= max_records:
                break
            shard = (first + i) % shards
            offset = fetched.get(shard, self._positions[shard])
            if offset >= db.end_offset(shard):
                continue
            try:
                recs = await db.read(shard, offset, min(self._batch, max_records - len(out)))
            except OffsetOutOfRange as exc:
                if offset >= exc.start:
                    raise
                self._positions[shard] = offset = db.start_offset(shard)
                recs = await db.read(shard, offset, min(self._batch, max_records - len(out)))
            out.extend(recs)
            self._next_shard = (shard + 1) % shards
        return out

    async def _fill(self, max_records: int, timeout_s: float | None) -> bool:
        """Fetch into the buffer, waiting up to ``timeout_s`` for records; False: none came."""
        from seglog.db import _ANY_SHARD

        await self.start()
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while True:
            self._check()
            if self.db._closed:
                return False
            event = self.db._wakeup(_ANY_SHARD)  # before reading: no lost wake-up
            recs = await self._fetch(max_records)
            if recs:
                self._buffer.extend(recs)
                return True
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return False
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except TimeoutError:
                return False

    def _deliver(self, n: int) -> list[Record]:
        out = [self._buffer.popleft() for _ in range(min(n, len(self._buffer)))]
        for r in out:
            self._positions[r.shard] = r.offset + 1  # type: ignore[index,operator]
        return out

    async def getmany(
        self, *, max_records: int = 10_000, timeout_ms: int | None = 0
    ) -> dict[int, list[Record]]:
        """The records available now (up to ``max_records``), by shard; positions move past them.

        Args:
            max_records: Most records returned.
            timeout_ms: How long to wait when nothing is available (``None``: until
                something is, or the database closes).

        Returns:
            ``{shard: [records in offset order]}``; empty on timeout.
        """
        self._check()
        if type(max_records) is not int or max_records < 1:
            raise InvalidArgument("max_records must be an int >= 1")
        if timeout_ms is not None and (type(timeout_ms) is not int or timeout_ms < 0):
            raise InvalidArgument("timeout_ms must be None or an int >= 0")
        if not self._buffer:
            await self._fill(max_records, None if timeout_ms is None else timeout_ms / 1000)
        out: dict[int, list[Record]] = {}
        for r in self._deliver(max_records):
            out.setdefault(r.shard, []).append(r)  # type: ignore[arg-type]
        return out

    async def getone(self) -> Record:
        """The next record, waiting for one.

        Raises:
            ClosedResourceError: The consumer or its database was closed.
        """
        self._check()
        if not self._buffer and not await self._fill(self._batch, None):
            raise ClosedResourceError(f"database {self.db.name!r} is closed")
        return self._deliver(1)[0]

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> Record:
        if self._closed:
            raise StopAsyncIteration
        if not self._buffer and not await self._fill(self._batch, None):
            raise StopAsyncIteration
        return self._deliver(1)[0]

    # --- groups ------------------------------------------------------------------------

    def _group(self) -> str:
        if self.group is None:
            raise InvalidArgument("this consumer has no group (db.consumer(group=...))")
        return self.group

    async def commit(self, offsets: Mapping[int, int] | None = None) -> None:
        """Store positions for the group durably: ``offsets`` (``{shard: next offset}``) or
        the current position of every shard that moved since the last commit."""
        self._check()
        group = self._group()
        await self.start()
        todo = dict(self._positions) if offsets is None else dict(offsets)
        for shard, offset in sorted(todo.items()):
            if offsets is None and self._committed.get(shard) == offset:
                continue
            await self.db.commit(group, shard, offset)
            self._committed[shard] = offset

    async def committed(self, shard: int) -> int | None:
        """The group's committed offset on ``shard`` (``None``: never committed)."""
        return await self.db.committed(self._group(), shard)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Consumer {self.db.name!r} group={self.group!r} {state} positions={self._positions}>"
