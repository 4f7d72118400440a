"""Idempotent appends of a database: each shard's producer state, checked and kept per append.

The rules are :mod:`seglog.segment.producer_state`'s; this module holds one
:class:`~seglog.segment.producer_state.ShardProducers` per shard, built lazily from the
shard's frame headers (the first idempotent append to a shard after open, after a follower
stored frames, or after a truncation), and serialises the appends of one producer to one
shard: a retry waits for the attempt still in flight, then finds it stored. Appends of
different producers to a shard run concurrently (and share group commits).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pyarrow as pa

from seglog.engines.base import Engine, Quota
from seglog.errors import InvalidArgument
from seglog.segment.producer_state import ProducerStamp, ShardProducers, check_stamp

__all__ = ["Producers"]


class Producers:
    """The producer state of one database's shards (event-loop thread only)."""

    def __init__(self) -> None:
        self._tables: dict[int, ShardProducers] = {}
        # Bumped whenever a shard's log changes under the state (frames from a leader, a cut).
        self._versions: dict[int, int] = {}
        self._loading: dict[int, asyncio.Lock] = {}
        # (shard, producer) pairs an append holds -> the appends waiting for them.
        self._turns: dict[tuple[int, int], list[asyncio.Future[None]]] = {}

    def forget(self, shard: int) -> None:
        """The log of ``shard`` changed other than by an idempotent append here: rebuild later."""
        self._tables.pop(shard, None)
        self._versions[shard] = self._versions.get(shard, 0) + 1

    def known(self, shard: int) -> ShardProducers | None:
        """The state of ``shard`` if it is built (for tests and stats)."""
        return self._tables.get(shard)

    async def _table(self, engine: Engine, shard: int) -> ShardProducers:
        table = self._tables.get(shard)
        if table is not None:
            return table
        lock = self._loading.setdefault(shard, asyncio.Lock())
        async with lock:
            table = self._tables.get(shard)
            if table is None:
                while True:
                    version = self._versions.get(shard, 0)
                    headers = await engine.producer_headers(shard)
                    if self._versions.get(shard, 0) == version:
                        break
                table = self._tables[shard] = ShardProducers.from_headers(headers)
            return table

    @asynccontextmanager
    async def _turn(self, keys: list[tuple[int, int]]) -> AsyncIterator[None]:
        """Hold the (shard, producer) pairs of ``keys`` for one append (all or none at once,
        so two appends never hold parts of each other's)."""
        busy = self._turns
        while True:
            clash = next((k for k in keys if k in busy), None)
            if clash is None:
                break
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            busy[clash].append(waiter)
            await waiter  # then look again: another waiter may have taken it first
        for k in keys:
            busy[k] = []
        try:
            yield
        finally:
            for k in keys:
                for waiter in busy.pop(k):
                    if not waiter.done():
                        waiter.set_result(None)

    async def append(
        self,
        engine: Engine,
        batch: pa.RecordBatch,
        routes: np.ndarray[Any, np.dtype[np.int32]],
        stamp: ProducerStamp,
        quota: Quota | None,
        leader_epoch: int,
    ) -> np.ndarray[Any, np.dtype[np.int64]]:
        """Append what of ``batch`` the shards do not hold yet; every row's offset
        (:data:`~seglog.segment.producer_state.UNKNOWN_OFFSET` for a duplicate too old to place).

        Raises:
            InvalidArgument: ``stamp`` does not name exactly the shards the rows go to.
            OutOfOrderSequence, ProducerFenced: A shard refused its part; nothing was written.
        """
        check_stamp(stamp)
        n = batch.num_rows
        order = np.argsort(routes, kind="stable")
        by_shard = routes[order]
        starts = np.flatnonzero(np.r_[True, by_shard[1:] != by_shard[:-1]])
        shards = by_shard[starts].tolist()
        counts = np.diff(np.r_[starts, n]).tolist()
        if set(stamp.sequences) != set(shards):
            raise InvalidArgument(
                f"the producer's sequences name shards {sorted(stamp.sequences)}; the rows go to {shards}"
            )
        pid, epoch = stamp.producer_id, stamp.producer_epoch
        async with self._turn([(s, pid) for s in shards]):
            tables = [await self._table(engine, s) for s in shards]
            # Every shard is checked before anything is written: a refusal writes nothing.
            admissions = [
                t.check(pid, epoch, stamp.sequences[s], c)
                for t, s, c in zip(tables, shards, counts, strict=True)
            ]
            offsets = np.empty(n, np.int64)
            keep: list[np.ndarray[Any, Any]] = []
            fresh: dict[int, int] = {}
            for s, start, c, adm in zip(shards, starts.tolist(), counts, admissions, strict=True):
                rows = order[start : start + c]
                at = 0
                for base, k in adm.stored:
                    offsets[rows[at : at + k]] = np.arange(base, base + k) if base >= 0 else base
                    at += k
                if adm.skip < c:
                    keep.append(rows[adm.skip :])
                    fresh[s] = stamp.sequences[s] + adm.skip
            if not keep:
                return offsets
            kept = np.concatenate(keep)
            whole = len(kept) == n
            part = batch if whole else batch.take(pa.array(kept))
            part_routes = routes if whole else routes[kept]
            try:
                written = await engine.append_routed(
                    part,
                    part_routes,
                    quota,
                    leader_epoch=leader_epoch,
                    producer=ProducerStamp(pid, epoch, fresh),
                )
            except BaseException:
                for s in fresh:
                    self.forget(s)  # what was written (if anything) is read back from the log
                raise
            if whole:
                offsets = written  # in the batch's row order
            else:
                offsets[kept] = written
            # Grouped by shard in ``shards`` order, each shard's new rows come in offset order:
            # its first one is where its run starts.
            grouped = written[order] if whole else written
            at = 0
            for s, c, adm, t in zip(shards, counts, admissions, tables, strict=True):
                if s not in fresh:
                    continue
                k = c - adm.skip
                if self._tables.get(s) is t:
                    t.record(pid, epoch, fresh[s], k, int(grouped[at]))
                at += k
            return offsets
