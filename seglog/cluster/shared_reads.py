"""Stream reads over the network that many readers at one position share (single flight).

The embedded :meth:`~seglog.db.Database.subscribe` reads a stream once for all its
subscribers at one position (EMQX's beamformer). Network readers long-poll ``POST .../next``
instead: when an append wakes the readers of a stream, every one of them would read the same
new records for itself. Here a read is keyed by what decides its answer — the database, the
iterator (stream, filter and position: its bytes), the record budget and the high watermark
it stops at — and concurrent requests with the same key await one read. A thousand
dashboards tailing one topic filter then cost one read per append, not a thousand.

Only reads in flight are shared (nothing is cached): a reader arriving after a read finished
reads for itself, so a truncation between two reads can never be answered from before it.
The read runs as a task of its own, so a reader that disconnects does not cancel it for the
others.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable

import pyarrow as pa

from seglog.db import Database
from seglog.iterators import Iterator

__all__ = ["SharedReads"]

_Key = tuple[str, bytes, int, int]


class SharedReads:
    """Single-flight ``Database.next_arrow`` calls (see the module docstring).

    Args:
        on_read: Called with the database's name and whether the caller joined a read
            already in flight (``True``) or started one (metrics).
    """

    def __init__(self, on_read: Callable[[str, bool], None] | None = None) -> None:
        self._inflight: dict[_Key, asyncio.Task[tuple[Iterator, pa.Table]]] = {}
        self._on_read = on_read

    async def next_arrow(self, db: Database, it: Iterator, n: int, upper: int) -> tuple[Iterator, pa.Table]:
        """``db.next_arrow(it, n, upper=upper)``, shared with the same call in flight."""
        key = (db.name, it.to_bytes(), n, upper)
        task = self._inflight.get(key)
        joined = task is not None
        if task is None:
            task = asyncio.ensure_future(db.next_arrow(it, n, upper=upper))
            self._inflight[key] = task
            task.add_done_callback(functools.partial(self._done, key))
        if self._on_read is not None:
            self._on_read(db.name, joined)
        return await asyncio.shield(task)

    def _done(self, key: _Key, task: asyncio.Task[tuple[Iterator, pa.Table]]) -> None:
        if self._inflight.get(key) is task:
            del self._inflight[key]
        if not task.cancelled():
            task.exception()  # retrieved: every reader that still waits gets it raised

    @property
    def in_flight(self) -> int:
        """Reads running now."""
        return len(self._inflight)
