"""What every request handler of a node shares: the store, shard waiters, limits."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from aiohttp import web

from seglog.cluster.metrics import NodeMetrics
from seglog.cluster.shared_reads import SharedReads
from seglog.db import Database
from seglog.db_config import validate_db_name
from seglog.errors import ClosedResourceError, DatabaseNotFound
from seglog.store import Store

if TYPE_CHECKING:
    from seglog.cluster.node import ClusterNode

__all__ = ["NODE", "NodeContext", "ServerLimits", "ShardWaiters"]

DEFAULT_MAX_BODY_BYTES: Final = 64 << 20
DEFAULT_MAX_WAIT_MS: Final = 30_000
DEFAULT_MAX_FETCH_BYTES: Final = 16 << 20
DEFAULT_MAX_INFLIGHT_APPENDS: Final = 256
DEFAULT_IDLE_TIMEOUT_S: Final = 60.0


@dataclass(frozen=True)
class ServerLimits:
    """Bounds that keep one client from taking the node down.

    Attributes:
        max_body_bytes: Largest request body (413 above it).
        max_wait_ms: Longest long poll a fetch may ask for (longer asks are capped).
        max_fetch_bytes: Largest ``max_bytes`` a fetch may ask for (capped).
        max_inflight_appends: Produce requests being written at once; more get 503.
        idle_timeout_s: A connection that sends nothing for this long is closed (slowloris).
    """

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_wait_ms: int = DEFAULT_MAX_WAIT_MS
    max_fetch_bytes: int = DEFAULT_MAX_FETCH_BYTES
    max_inflight_appends: int = DEFAULT_MAX_INFLIGHT_APPENDS
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S


class ShardWaiters:
    """Long polls parked on (database, shard), woken when the shard's visible end moves.

    Taken before reading the shard so that no wake-up falls between the read and the wait.
    """

    def __init__(self) -> None:
        self._events: dict[tuple[str, int], asyncio.Event] = {}
        # Many-shard polls: one event each, under every shard it watches (see ``watching``).
        self._watchers: dict[tuple[str, int], set[asyncio.Event]] = {}

    def event(self, db: str, shard: int) -> asyncio.Event:
        """The event the next move of ``db``/``shard`` sets."""
        key = (db, shard)
        event = self._events.get(key)
        if event is None:
            event = self._events[key] = asyncio.Event()
        return event

    @contextlib.contextmanager
    def watching(self, keys: Iterable[tuple[str, int]]) -> Iterator[asyncio.Event]:
        """One event the next move of any of ``keys`` (database, shard) sets, while the block runs."""
        event = asyncio.Event()
        keys = list(keys)
        for key in keys:
            self._watchers.setdefault(key, set()).add(event)
        try:
            yield event
        finally:
            for key in keys:
                watchers = self._watchers.get(key)
                if watchers is not None:
                    watchers.discard(event)
                    if not watchers:
                        del self._watchers[key]

    def wake(self, db: str, shard: int) -> None:
        """Wake every long poll on ``db``/``shard``."""
        key = (db, shard)
        event = self._events.pop(key, None)
        if event is not None:
            event.set()
        for watcher in self._watchers.get(key, ()):
            watcher.set()

    def wake_db(self, db: str) -> None:
        """Wake every long poll on ``db`` (dropped)."""
        for key in [k for k in self._events if k[0] == db]:
            self._events.pop(key).set()
        for key, watchers in self._watchers.items():
            if key[0] == db:
                for watcher in watchers:
                    watcher.set()

    def wake_all(self) -> None:
        """Wake everything (shutdown, a dropped database)."""
        events, self._events = self._events, {}
        for event in events.values():
            event.set()
        for watchers in self._watchers.values():
            for watcher in watchers:
                watcher.set()


@dataclass
class NodeContext:
    """The node's shared state, reachable from a request as ``request.app[NODE]``."""

    store: Store
    limits: ServerLimits = field(default_factory=ServerLimits)
    waiters: ShardWaiters = field(default_factory=ShardWaiters)
    metrics: NodeMetrics = field(default_factory=NodeMetrics)
    inflight_appends: int = 0
    closing: bool = False
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    # Set on a node started with --etcd: replicated databases publish through the ISR.
    cluster: ClusterNode | None = None
    # Stream reads (``POST .../next``) that readers at one position share.
    stream_reads: SharedReads = field(init=False)
    # Databases this node opened (and published), by name: every request after the first
    # finds its database here, without the store's config read in a thread.
    _open: dict[str, Database] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.stream_reads = SharedReads(self.metrics.stream_read_started)

    async def database(self, name: str) -> Database:
        """The open database ``name`` (opened on first use; :class:`DatabaseNotFound` if none)."""
        if self.closing:
            raise ClosedResourceError("the server is shutting down")
        db = self._open.get(name)
        if db is not None:
            return db
        validate_db_name(name)
        try:
            db = await self.store.open_db(name)
        except DatabaseNotFound:
            if self.cluster is not None:
                # Created in the metadata but not yet applied here (the watch lags the
                # controller that already named this node a leader): retriable, not absent.
                await self.cluster.raise_if_pending(name)
            raise
        if name not in self._open:
            # Whatever the store held before this node served it is durable: committed.
            self.publish(db, list(range(db.shards)))
            self._open[name] = db
        return db

    def forget(self, name: str) -> None:
        """A database was dropped: wake its long polls, open and publish afresh if it is recreated."""
        self._open.pop(name, None)
        self.waiters.wake_db(name)

    def publish(self, db: Database, shards: list[int]) -> None:
        """Make what was appended to ``shards`` visible: move the high watermark, wake fetches.

        A standalone node is an ISR of one: everything durable is committed. A cluster
        database's high watermark moves only through its leader's ISR (the cluster node
        publishes it); here its long polls are only woken.
        """
        if self.cluster is not None and self.cluster.replicated(db.name):
            for shard in shards:
                self.waiters.wake(db.name, shard)
            return
        for shard in shards:
            db.update_high_watermark(shard, db.end_offset(shard))
            self.waiters.wake(db.name, shard)


NODE: Final = web.AppKey("seglog_node", NodeContext)
