"""A node's membership in a cluster: metadata watch, shard roles, leader state, follower fetchers.

:class:`ClusterNode` joins the cluster in etcd (a node lease), runs the controller campaign,
and watches the shard metadata. For each shard it is a replica of it takes a role:

* **leader** (the metadata names it at ``leader_epoch``): a :class:`ShardLeaderState` tracks
  the followers' fetches, moves the high watermark (published to the local store and to
  long polls), proposes ISR changes, which this node writes with a compare-and-swap on the
  shard key, and waits for produces to meet their ``acks``;
* **follower**: one :class:`_Fetcher` per leader node pulls every followed shard's frames in
  one long-polled request, after truncating each shard by leader epoch (on every epoch
  change, never to its own high watermark), and stores them byte for byte.

The metadata decides roles; a node that learns of a newer epoch resigns at once, so a
paused leader that wakes up acknowledges nothing (its waiters fail with ``NotLeader``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from dataclasses import dataclass, field, replace
from typing import Any, Final

import aiohttp

from seglog.cluster import fetch_wire, protocol, replica_wire
from seglog.cluster.context import ShardWaiters
from seglog.cluster.controller import Controller
from seglog.cluster.etcd import EtcdClient
from seglog.cluster.fetch_wire import FetchPart
from seglog.cluster.metadata import NO_LEADER, ClusterMetadata, DbMeta, NodeInfo, NodeLease, ShardState
from seglog.cluster.replica_wire import PartRequest
from seglog.db import Database
from seglog.errors import (
    CorruptFrame,
    DatabaseNotFound,
    InvalidArgument,
    LeaseNotFound,
    MetadataError,
    NodeIdInUse,
    NotLeader,
    OffsetMismatch,
    OffsetOutOfRange,
    SeglogError,
    ServerUnavailable,
    StaleMetadata,
    TierError,
)
from seglog.isr import Acks, ShardLeaderState
from seglog.isr.leader_state import DEFAULT_REPLICA_LAG_TIME_MAX_MS
from seglog.isr.truncation import truncate_to_leader
from seglog.store import Shutdown, Store

__all__ = ["ClusterConfig", "ClusterNode"]

log = logging.getLogger("seglog.cluster")

DEFAULT_FETCH_WAIT_MS: Final = 500
DEFAULT_FETCH_MAX_BYTES: Final = 4 << 20
DEFAULT_ACK_TIMEOUT_MS: Final = 30_000
# A failed fetch or metadata read is retried after this (a back-off, not synchronisation).
RETRY_DELAY_S: Final = 0.2
REQUEST_TIMEOUT_S: Final = 10.0

ShardKey = tuple[str, int]


@dataclass(frozen=True)
class ClusterConfig:
    """How a node joins a cluster.

    Attributes:
        node_id: This node's id (unique among live nodes).
        advertise_url: The URL other nodes and clients reach this node at.
        etcd: etcd endpoints (``http://host:port``).
        prefix: The cluster's key prefix in etcd.
        node_ttl_s: The node lease's TTL: a node silent this long is dead to the cluster.
        replica_lag_time_max_ms: How long an ISR member may stay behind before it is dropped.
        fetch_wait_ms: A follower's long-poll wait (Kafka's ``replica.fetch.wait.max.ms``).
        fetch_max_bytes: Bytes a follower asks for per fetch (over all its shards).
        ack_timeout_ms: Longest a produce waits for its ``acks``.
        token: Bearer token for requests to other nodes (their ``--tokens``).
    """

    node_id: int
    advertise_url: str
    etcd: tuple[str, ...]
    prefix: bytes = b"/seglog/"
    node_ttl_s: int = 6
    replica_lag_time_max_ms: int = DEFAULT_REPLICA_LAG_TIME_MAX_MS
    fetch_wait_ms: int = DEFAULT_FETCH_WAIT_MS
    fetch_max_bytes: int = DEFAULT_FETCH_MAX_BYTES
    ack_timeout_ms: int = DEFAULT_ACK_TIMEOUT_MS
    token: str | None = None


@dataclass
class _Following:
    leader: int
    leader_epoch: int
    # Truncated against this leader epoch yet (redone on every epoch change).
    truncated: bool = False


@dataclass
class _Fetcher:
    leader: int
    url: str
    task: asyncio.Task[None] | None = None
    # Set when the shards this node follows from ``leader`` change while a fetch is out: the
    # fetch, long-polled for up to ``fetch_wait_ms`` on the shards it named, gives way to one
    # that names the new set (a new database's shards would otherwise wait out the poll).
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    # The shards (and their following records) of the fetch out now, if any.
    inflight: dict[ShardKey, _Following] | None = None


class ClusterNode:
    """This node's part in the cluster (see the module docstring)."""

    def __init__(self, config: ClusterConfig, store: Store, waiters: ShardWaiters) -> None:
        if config.node_id < 0:
            raise InvalidArgument(f"node ids are non-negative, not {config.node_id}")
        self.config = config
        self.node_id = config.node_id
        self.store = store
        # Consumer long polls (woken when the high watermark moves).
        self.waiters = waiters
        # Follower long polls (woken when a led shard's log end moves).
        self.end_waiters = ShardWaiters()
        self.etcd = EtcdClient(config.etcd)
        self.meta = ClusterMetadata(self.etcd, config.prefix)
        self.dbs: dict[str, DbMeta] = {}
        self.shards: dict[ShardKey, ShardState] = {}
        self.nodes: dict[int, NodeInfo] = {}
        self.leading: dict[ShardKey, ShardLeaderState] = {}
        self.following: dict[ShardKey, _Following] = {}
        self._fetchers: dict[int, _Fetcher] = {}
        # Local databases of cluster databases, opened by the metadata watch.
        self._open: dict[str, Database] = {}
        # One change of the local state from the metadata at a time: the watch's refresh and
        # a drop request on this node both create, open and drop local databases, and one
        # interleaved with the other could open a database the other just dropped.
        self._apply_lock = asyncio.Lock()
        self._lease: NodeLease | None = None
        self._controller: Controller | None = None
        self._tasks: list[asyncio.Task[None]] = []
        # ISR expansions started by a follower's fetch: at most one per shard at a time.
        self._expanding: dict[ShardKey, asyncio.Task[None]] = {}
        # Shards whose local copy holds a damaged frame: repairs in flight, and where to cut
        # the log before the next fetch (the damaged frame's offset).
        self._repairing: dict[ShardKey, asyncio.Task[None]] = {}
        self._damaged: dict[ShardKey, int] = {}
        # A metadata re-read after a shard's leadership could not be taken up (see
        # ``_start_at_tier_end``); one at a time.
        self._retry_apply: asyncio.Task[None] | None = None
        self._http: aiohttp.ClientSession | None = None
        # Set once the first metadata snapshot was applied (roles known).
        self.ready = asyncio.Event()
        # Set while the node holds a lease: only then may it lead.
        self._registered = asyncio.Event()
        self._closing = False

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Register, campaign for controller, and start following the metadata."""
        headers = {} if self.config.token is None else {"Authorization": f"Bearer {self.config.token}"}
        self._http = aiohttp.ClientSession(
            headers=headers, timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        )
        await self._register()
        self._tasks.append(asyncio.create_task(self._watch_loop(), name=f"metadata-{self.node_id}"))
        self._tasks.append(asyncio.create_task(self._isr_loop(), name=f"isr-{self.node_id}"))
        self._tasks.append(asyncio.create_task(self._lease_watch(), name=f"lease-{self.node_id}"))

    async def close(self) -> None:
        """Leave the cluster: stop fetchers and loops, resign leaderships, revoke the lease."""
        self._closing = True
        for state in self.leading.values():
            state.resign(NO_LEADER, state.leader_epoch)
        tasks = [
            *self._tasks,
            *self._expanding.values(),
            *self._repairing.values(),
            *([self._retry_apply] if self._retry_apply is not None else []),
            *(f.task for f in self._fetchers.values() if f.task is not None),
        ]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._controller is not None:
            await self._controller.close()
        if self._lease is not None:
            with contextlib.suppress(MetadataError):
                await self._lease.close(revoke=True)
        if self._http is not None:
            await self._http.close()
        await self.etcd.close()
        self.end_waiters.wake_all()

    async def _register(self) -> None:
        """Register under a fresh lease, reclaim leaderships under new epochs, start the controller.

        A node never leads under an epoch from before its current registration: whatever
        it led before (this process before a lost lease, or a crashed predecessor) gets a
        new leader epoch first, so followers truncate against this incarnation's log.
        """
        info = NodeInfo(
            self.node_id,
            self.config.advertise_url,
            unclean_restart=self.store.last_shutdown is Shutdown.MACHINE_RESTART,
        )
        await self._leave_isrs()
        deadline = asyncio.get_running_loop().time() + 3 * self.config.node_ttl_s + 5
        while True:
            try:
                lease = await self.meta.register_node(info, ttl_s=self.config.node_ttl_s)
                break
            except NodeIdInUse:
                # Our previous incarnation's key lives until its lease expires (a crash
                # restarted within the TTL): wait it out, bounded.
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(RETRY_DELAY_S)
        lease.start_keepalive()
        try:
            await self._reclaim_leaderships()
        except BaseException:
            # etcd failed half way: give the registration back, or the next attempt would
            # find this node's own key and wait for a lease it keeps alive itself.
            with contextlib.suppress(MetadataError):
                await lease.close(revoke=True)  # stops the keepalive even if etcd is gone again
            raise
        self._lease = lease
        self._registered.set()
        self._controller = Controller(self.meta, self.node_id, lease.lease)
        self._controller.start()

    async def _leave_isrs(self) -> None:
        """Before (re-)registering, leave the ISR of every shard this node is a follower of.

        A replica that starts (or comes back after losing its lease) may hold less than the
        high watermark: recovery cut its log at a bit-flipped or torn frame, or a machine
        restart lost unsynced writes. Until a fetch shows it caught up (it then rejoins at
        once, see :meth:`_expand_soon`) it must not count as in sync, or the controller could
        elect it and the good replicas would truncate acknowledged records to its log
        (Jepsen's NATS 2.12.1 case; Kafka fences a restarted broker out of the ISR the same
        way, KIP-903). This runs before the node is live, so no election can pick it in
        between. Left alone: a shard it leads (reclaimed under a new epoch after
        registering) and one whose ISR it is the only member of (the last replica standing
        stays on record: nothing better is known).
        """
        for name, states in (await self.meta.snapshot()).shards.items():
            for shard, (state, revision) in states.items():
                await self._leave_isr(name, shard, state, revision)

    async def _leave_isr(self, name: str, shard: int, state: ShardState, revision: int) -> None:
        """Remove this node from the shard's ISR unless it leads it or is its only member."""
        while self.node_id in state.isr and state.leader != self.node_id and len(state.isr) > 1:
            new = replace(state, isr=tuple(r for r in state.isr if r != self.node_id))
            try:
                await self.meta.update_shard(name, shard, state, revision, new)
            except StaleMetadata:
                state, revision = await self.meta.shard(name, shard)
                continue
            log.info(
                "node %d leaves the ISR of %s/%d until it catches up: %s -> %s",
                self.node_id,
                name,
                shard,
                list(state.isr),
                list(new.isr),
            )
            return

    async def _reclaim_leaderships(self) -> None:
        for name, states in (await self.meta.snapshot()).shards.items():
            for shard, (state, revision) in states.items():
                while state.leader == self.node_id:
                    try:
                        new = replace(state, leader_epoch=state.leader_epoch + 1)
                        await self.meta.update_shard(name, shard, state, revision, new)
                        log.info(
                            "node %d reclaims %s/%d at epoch %d", self.node_id, name, shard, new.leader_epoch
                        )
                        break
                    except StaleMetadata:
                        state, revision = await self.meta.shard(name, shard)

    async def _lease_watch(self) -> None:
        while True:
            assert self._lease is not None
            await self._lease.lost.wait()
            # Without its lease the node is dead to the cluster: it must not act as a leader.
            log.error("node %d lost its etcd lease: resigning, then registering again", self.node_id)
            self._registered.clear()
            for key, state in list(self.leading.items()):
                state.resign(NO_LEADER, state.leader_epoch)
                del self.leading[key]
            if self._controller is not None:
                await self._controller.close()
                self._controller = None
            old = self._lease
            await old.close(revoke=False)
            while True:
                try:
                    # The old registration is dead to this node (it resigned everything):
                    # revoke it, or after an etcd restart (which renews every lease) its key
                    # would block the new registration for a whole TTL.
                    await old.meta.etcd.lease_revoke(old.lease)
                    await self._register()
                    break
                except (MetadataError, NodeIdInUse) as exc:
                    log.warning("node %d: registering again failed: %s", self.node_id, exc)
                    # A back-off after a failure, not synchronisation.
                    await asyncio.sleep(RETRY_DELAY_S)
                except Exception:
                    # This loop is the node's only way back into the cluster: never let it end.
                    log.exception("node %d: registering again failed", self.node_id)
                    await asyncio.sleep(RETRY_DELAY_S)

    # --- metadata -------------------------------------------------------------------------

    def replicated(self, db: str) -> bool:
        """Whether ``db`` is a cluster database (its offsets become visible through the ISR)."""
        return db in self.dbs

    async def raise_if_pending(self, db: str) -> None:
        """Raise :class:`NotLeader` if ``db`` exists in the cluster but this node holds no copy.

        A client routed here by the metadata (or one that picked this node at random) should
        ask the metadata again and retry, not conclude that the database does not exist.
        """
        if db not in self.dbs:
            try:
                await self.meta.get_db(db)
            except DatabaseNotFound:
                return
        raise NotLeader(
            f"node {self.node_id} holds no replica of database {db!r} (yet): ask the metadata for its leaders"
        )

    def describe_db(self, db: str) -> list[dict[str, Any]]:
        """Per shard of ``db``: its metadata state and, where this node leads it, the high
        watermark and each replica's log end and lag as the leader sees them."""
        meta = self.dbs.get(db)
        if meta is None:
            return []
        out = []
        for shard in range(meta.shards):
            state = self.shards.get((db, shard))
            if state is None:
                continue  # not learned from the metadata yet
            item: dict[str, Any] = {"shard": shard, **_state_json(state)}
            lead = self.leading.get((db, shard))
            item["led_here"] = lead is not None
            if lead is not None:
                item["high_watermark"] = lead.high_watermark
                item["replica_state"] = lead.replica_report()
            out.append(item)
        return out

    def not_leader(self, db: str, shard: int) -> NotLeader | None:
        """``NotLeader`` (naming the leader this node knows) unless this node leads ``db``/``shard``."""
        if (db, shard) in self.leading:
            return None
        state = self.shards.get((db, shard))
        return NotLeader(
            f"node {self.node_id} does not lead shard {shard} of {db!r}",
            shard=shard,
            leader=None if state is None else state.leader,
            leader_epoch=None if state is None else state.leader_epoch,
        )

    async def _watch_loop(self) -> None:
        while True:
            try:
                _, revision = await self.etcd.get_prefix(self.meta.prefix + b"nodes/")
                await self._refresh()
                self.ready.set()
                async for _ in self.etcd.watch_prefix(self.meta.prefix, start_revision=revision + 1):
                    await self._refresh()
            except (MetadataError, StaleMetadata) as exc:
                log.warning("node %d: metadata watch: %s; re-reading", self.node_id, exc)
                # A back-off after a failure, not synchronisation.
                await asyncio.sleep(RETRY_DELAY_S)
            except Exception:
                # This loop is how the node learns every database, leader and ISR change: a
                # local failure while applying one (a database that cannot be created here)
                # must not end it, or the node would never follow anything again.
                log.exception("node %d: applying the metadata failed; re-reading", self.node_id)
                await asyncio.sleep(RETRY_DELAY_S)

    async def _refresh(self) -> None:
        """Re-read the metadata and move every shard to the role it gives this node."""
        async with self._apply_lock:
            await self._refresh_locked()

    async def _refresh_locked(self) -> None:
        snap = await self.meta.snapshot()  # one read, whatever the number of databases
        self.nodes = snap.nodes
        dbs = snap.dbs
        shards: dict[ShardKey, ShardState] = {
            (name, shard): state for name in dbs for shard, (state, _) in snap.shards[name].items()
        }
        gone = set(self.dbs) - set(dbs)
        self.dbs, self.shards = dbs, shards
        for name in gone:
            await self._dropped_locked(name)
        for name, meta in dbs.items():
            if any(self.node_id in shards[(name, s)].replicas for s in range(meta.shards)):
                await self.store.create_db(name, meta.shards, exist_ok=True, **meta.options)
                db = self._open[name] = await self.store.open_db(name)
                db.set_replicated()
                db.tier_leads(functools.partial(self._tier_leads, name))
        for key, state in shards.items():
            await self._apply(key, state)
        for key in [k for k in self.leading if k not in shards]:
            self.leading.pop(key).resign(NO_LEADER, 0)
        for key in [k for k in self.following if k not in shards]:
            del self.following[key]
        self._sync_fetchers()

    async def _apply(self, key: ShardKey, state: ShardState) -> None:
        name, shard = key
        lead = self.leading.get(key)
        if state.leader == self.node_id and self._registered.is_set():
            self.following.pop(key, None)
            if lead is not None and lead.leader_epoch == state.leader_epoch:
                if lead.isr != state.isr and lead.maximal_isr == lead.isr:
                    lead.complete_isr_change(state.isr)
                    self._publish(name, shard, lead)
                return
            if lead is not None:
                lead.resign(state.leader, state.leader_epoch)
                del self.leading[key]
            db = await self.store.open_db(name)
            may_lack = self.dbs[name].unclean_election or self.store.last_shutdown is Shutdown.MACHINE_RESTART
            if may_lack and db.tiered and not await self._start_at_tier_end(db, shard):
                self._apply_again_soon()
                return
            end = db.end_offset(shard)
            self.leading[key] = ShardLeaderState(
                shard,
                leader=self.node_id,
                leader_epoch=state.leader_epoch,
                replicas=state.replicas,
                isr=state.isr,
                min_insync=self.dbs[name].min_insync,
                epoch_start_offset=end,
                log_end=end,
                high_watermark=db.high_watermark(shard),
                replica_lag_time_max_ms=self.config.replica_lag_time_max_ms,
            )
            log.info(
                "node %d leads %s/%d at epoch %d (isr %s)",
                self.node_id,
                name,
                shard,
                state.leader_epoch,
                state.isr,
            )
            self._publish(name, shard, self.leading[key])
            return
        if lead is not None:
            self.leading.pop(key).resign(state.leader, state.leader_epoch)
        if self.node_id in state.replicas and state.leader not in (NO_LEADER, self.node_id):
            current = self.following.get(key)
            if current is None or (current.leader, current.leader_epoch) != (
                state.leader,
                state.leader_epoch,
            ):
                self.following[key] = _Following(state.leader, state.leader_epoch)
        else:
            self.following.pop(key, None)

    async def _start_at_tier_end(self, db: Database, shard: int) -> bool:
        """Before leading a shard of a tiered database that allows unclean election, or on a
        node whose machine restarted under it: start the log over at the tier's end if it
        ends below it.

        An unclean election (or an election of the last replica standing after a machine
        restart took its unsynced tail, KIP-966) can make a leader of a replica that lacks
        records its predecessor tiered. Taking writes at its own end would put a second
        record at offsets the tier holds, its uploads would overlap the tier's objects, and
        local retention would drop the new records as if tiered. Its records below the
        tier's end are in the tier (or were cut by its retention), so starting over there
        loses none of them. The tier is read under the metadata lock: only such shards pay
        for it, at the moment they change leader.

        Returns:
            False when the tier could not be read: the shard then has no acting leader here
            until a later try reads it.
        """
        try:
            tier_end = await db.tier_committed_end(shard)
        except TierError as exc:
            log.warning(
                "node %d: not taking up %s/%d yet: its tier could not be read (%s); retrying",
                self.node_id,
                db.name,
                shard,
                exc,
            )
            return False
        end = db.end_offset(shard)
        if tier_end > end:
            await db.restart_at(shard, tier_end)
            log.warning(
                "node %d: %s/%d ends at %d, below the tier's end %d (an unclean election): it "
                "starts its log over at the tier's end",
                self.node_id,
                db.name,
                shard,
                end,
                tier_end,
            )
        return True

    def _apply_again_soon(self) -> None:
        """Re-read the metadata after :data:`RETRY_DELAY_S` (once, however many shards ask)."""
        if self._retry_apply is None or self._retry_apply.done():
            self._retry_apply = asyncio.create_task(self._apply_later(), name=f"reapply-{self.node_id}")

    async def _apply_later(self) -> None:
        await asyncio.sleep(RETRY_DELAY_S)  # a back-off before retrying, not synchronisation
        try:
            await self._refresh()
        except Exception:  # the watch loop's next change re-reads it too
            log.exception("node %d: re-reading the metadata failed", self.node_id)

    def _tier_leads(self, name: str) -> dict[int, int]:
        """The shards of ``name`` this node leads now, with their leader epochs: the ones its
        tier uploads (a store opened with ``tier_shared``)."""
        if not self._registered.is_set():
            return {}
        return {shard: lead.leader_epoch for (db, shard), lead in self.leading.items() if db == name}

    async def dropped(self, name: str) -> None:
        """A cluster database left the metadata: resign its shards, drop the local copy."""
        async with self._apply_lock:
            await self._dropped_locked(name)

    async def _dropped_locked(self, name: str) -> None:
        self.dbs.pop(name, None)
        for key in [k for k in self.leading if k[0] == name]:
            self.leading.pop(key).resign(NO_LEADER, 0)
        for key in [k for k in self.following if k[0] == name]:
            del self.following[key]
        self.shards = {k: v for k, v in self.shards.items() if k[0] != name}
        if self._open.pop(name, None) is not None or name in self.store.list_dbs():
            with contextlib.suppress(DatabaseNotFound):
                await self.store.drop_db(name)
        self.waiters.wake_db(name)
        self.end_waiters.wake_db(name)

    def _publish(self, name: str, shard: int, lead: ShardLeaderState) -> None:
        """Move the local high watermark to the leader state's and wake consumer long polls."""
        db = self._open.get(name)
        if db is not None and db.update_high_watermark(shard, min(lead.high_watermark, db.end_offset(shard))):
            self.waiters.wake(name, shard)

    # --- produce (leader) -----------------------------------------------------------------

    def leader_for_append(self, db: str, shard: int, acks: Acks) -> ShardLeaderState:
        """The leader state to append under, after the pre-write checks.

        Raises:
            NotLeader: This node does not lead the shard (names the leader it knows).
            NotEnoughReplicas: ``acks="all"`` with the ISR below ``min_insync``.
        """
        lead = self.leading.get((db, shard))
        if lead is None:
            state = self.shards.get((db, shard))
            raise NotLeader(
                f"node {self.node_id} does not lead shard {shard} of {db!r}",
                shard=shard,
                leader=None if state is None else state.leader,
                leader_epoch=None if state is None else state.leader_epoch,
            )
        lead.check_append(acks)
        return lead

    async def appended(self, db: Database, shard: int, lead: ShardLeaderState, end: int, acks: Acks) -> None:
        """After a local durable append ending at ``end``: wake followers, wait for ``acks``."""
        lead.on_leader_append(end)
        self.end_waiters.wake(db.name, shard)
        await lead.wait_replicated(end, acks, self.config.ack_timeout_ms / 1000)
        self._publish(db.name, shard, lead)

    # --- replica fetch (leader side) ------------------------------------------------------

    async def serve_fetch(
        self, follower: int, parts: list[PartRequest], wait_ms: int, max_bytes: int
    ) -> bytes:
        """Answer a follower's fetch: per shard, frames from its offset (long-polled when none)."""
        answer = await self._fetch_parts(follower, parts, max_bytes)
        if wait_ms and not any(p.frames for p in answer) and not self._closing:
            with self.end_waiters.watching((p.db, p.shard) for p in parts) as moved:
                answer = await self._fetch_parts(follower, parts, max_bytes)  # re-check after arming
                if not any(p.frames for p in answer):
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(moved.wait(), wait_ms / 1000)
                    answer = await self._fetch_parts(follower, parts, max_bytes)
        return fetch_wire.encode_reply(answer)

    async def _fetch_parts(self, follower: int, parts: list[PartRequest], max_bytes: int) -> list[FetchPart]:
        out = []
        budget = max_bytes
        for p in parts:
            try:
                lead = self._check_fetch(p)
                if lead.on_fetch(follower, p.offset):
                    self._publish(p.db, p.shard, lead)
                if follower in self.nodes and lead.expansion_due(follower):
                    self._expand_soon((p.db, p.shard), lead)
                db = await self.store.open_db(p.db)
                frames = b""
                if p.offset < db.end_offset(p.shard) and budget > 0:
                    frames = await db.read_frames(p.shard, p.offset, budget)
                    budget -= len(frames)
                out.append(
                    FetchPart(
                        p.db,
                        p.shard,
                        frames,
                        high_watermark=lead.high_watermark,
                        log_start=db.start_offset(p.shard),
                        log_end=db.end_offset(p.shard),
                        leader_epoch=lead.leader_epoch,
                    )
                )
            except CorruptFrame as exc:
                # Never shipped: the follower gets the error, and this copy gets repaired.
                out.append(FetchPart(p.db, p.shard, error=exc))
                self.frame_damaged(p.db, p.shard, p.offset)
            except SeglogError as exc:
                out.append(FetchPart(p.db, p.shard, error=exc))
        return out

    def _check_fetch(self, p: PartRequest) -> ShardLeaderState:
        lead = self.leading.get((p.db, p.shard))
        state = self.shards.get((p.db, p.shard))
        if lead is None or p.leader_epoch != lead.leader_epoch:
            raise NotLeader(
                f"node {self.node_id} does not lead shard {p.shard} of {p.db!r} at epoch {p.leader_epoch}",
                shard=p.shard,
                leader=None if state is None else state.leader,
                leader_epoch=None if state is None else state.leader_epoch,
            )
        return lead

    def epoch_end(self, db: Database, shard: int, epoch: int, leader_epoch: int) -> tuple[int, int]:
        """OffsetsForLeaderEpoch, answered only by the leader of ``leader_epoch``."""
        self._check_fetch(PartRequest(db.name, shard, 0, leader_epoch))
        return db.end_offset_for_epoch(shard, epoch)

    # --- damaged frames -------------------------------------------------------------------

    def frame_damaged(self, db: str, shard: int, offset: int) -> None:
        """A read found the local frame holding ``offset`` damaged (CRC): repair this copy.

        The frame was not served (:meth:`seglog.db.Database.read_frames` checks every CRC).
        A leader hands the shard to the ISR member that holds the most past ``offset``
        (a new leader epoch, this node out of the ISR), then, as a follower, cuts its log
        at the damaged frame and refetches it. A follower leaves the ISR, cuts and refetches.
        With no ISR member holding the frame the leader keeps the shard and keeps refusing
        to serve the frame (logged): nothing better is known. One repair per shard at a time.
        """
        key = (db, shard)
        if key in self._repairing or key in self._damaged or self._closing or key not in self.shards:
            return  # a repair is running, or the cut waits for the next fetch
        task = asyncio.create_task(self._repair(key, offset), name=f"repair-{self.node_id}-{db}-{shard}")
        self._repairing[key] = task

    async def _repair(self, key: ShardKey, offset: int) -> None:
        name, shard = key
        try:
            lead = self.leading.get(key)
            state, revision = await self.meta.shard(name, shard)
            if lead is None:
                if state.leader == self.node_id:
                    return  # leadership not taken up yet: the next read that hits it retries
                await self._leave_isr(name, shard, state, revision)
                self._damaged[key] = min(offset, self._damaged.get(key, offset))
                following = self.following.get(key)
                if following is not None:
                    following.truncated = False
                log.error(
                    "%s/%d: local frame at offset %d is damaged: cutting and refetching", name, shard, offset
                )
                return
            if state.leader != self.node_id or state.leader_epoch != lead.leader_epoch:
                return
            ends = lead.follower_log_ends()
            holders = [
                r for r in state.isr if r != self.node_id and r in self.nodes and ends.get(r, -1) > offset
            ]
            if not holders:
                log.error(
                    "%s/%d: the leader's frame at offset %d is damaged and no in-sync replica "
                    "holds it (follower ends %s): it is not served",
                    name,
                    shard,
                    offset,
                    ends,
                )
                return
            successor = max(holders, key=lambda r: ends[r])
            isr = tuple(r for r in state.isr if r != self.node_id)
            elr = (
                ()
                if len(isr) >= self.dbs[name].min_insync
                else tuple(r for r in state.elr if r != self.node_id)
            )
            new = replace(state, leader=successor, leader_epoch=state.leader_epoch + 1, isr=isr, elr=elr)
            # Cut before the first fetch as a follower (set before the role can change).
            self._damaged[key] = min(offset, self._damaged.get(key, offset))
            try:
                await self.meta.update_shard(name, shard, state, revision, new)
            except BaseException:
                self._damaged.pop(key, None)
                raise
            log.error(
                "%s/%d: the leader's frame at offset %d is damaged: node %d leads at epoch %d; "
                "this copy is cut there and refetched",
                name,
                shard,
                offset,
                successor,
                new.leader_epoch,
            )
            if self.leading.get(key) is lead:
                del self.leading[key]
            lead.resign(successor, new.leader_epoch)
        except (StaleMetadata, MetadataError, LeaseNotFound) as exc:
            log.warning("%s/%d: repair of the damaged frame at %d deferred: %s", name, shard, offset, exc)
        finally:
            self._repairing.pop(key, None)

    # --- ISR maintenance (leader side) ----------------------------------------------------

    async def _isr_loop(self) -> None:
        period_s = max(0.05, self.config.replica_lag_time_max_ms / 4000)
        while True:
            # A periodic check (Kafka's isr-expiration task), not synchronisation.
            await asyncio.sleep(period_s)
            for key, lead in list(self.leading.items()):
                try:
                    await self._maybe_change_isr(key, lead)
                except Exception:
                    # One shard's failed check must not end the checks of every shard.
                    log.exception("node %d: %s/%d: ISR check failed", self.node_id, *key)

    def _expand_soon(self, key: ShardKey, lead: ShardLeaderState) -> None:
        """Propose the ISR change now (a follower's fetch reached the high watermark).

        Kafka's ``maybeExpandIsr`` on the fetch path: a caught-up replica rejoins within one
        fetch round instead of at the next periodic check. One expansion per shard at a time;
        a failed one is retried by the follower's next fetch.
        """
        if key in self._expanding or self._closing:
            return
        task = asyncio.create_task(self._expand(key, lead), name=f"expand-{self.node_id}-{key[0]}-{key[1]}")
        self._expanding[key] = task

    async def _expand(self, key: ShardKey, lead: ShardLeaderState) -> None:
        try:
            if self.leading.get(key) is lead:
                await self._maybe_change_isr(key, lead)
        except Exception:
            log.exception("%s/%d: ISR expansion failed", *key)
        finally:
            self._expanding.pop(key, None)

    async def _maybe_change_isr(self, key: ShardKey, lead: ShardLeaderState) -> None:
        change = lead.proposed_isr_change()
        if change is None:
            return
        name, shard = key
        lead.begin_isr_change(change)
        try:
            state, revision = await self.meta.shard(name, shard)
            if state.leader != self.node_id or state.leader_epoch != lead.leader_epoch:
                lead.abort_isr_change()
                return
            # Only registered nodes may join (a node whose lease lapsed rejoins after it
            # registers again: KIP-903's fencing of stale brokers).
            live = set(self.nodes)
            change = replace(change, add=frozenset(r for r in change.add if r in live))
            if not change.add and not change.remove:
                lead.abort_isr_change()
                return
            new = state.with_isr(change.apply(state.isr), self.dbs[name].min_insync)
            await self.meta.update_shard(name, shard, state, revision, new)
        except (StaleMetadata, MetadataError, LeaseNotFound) as exc:
            log.info("%s/%d: ISR change %s not applied: %s", name, shard, change, exc)
            lead.abort_isr_change()
            return
        log.info("%s/%d: ISR %s -> %s", name, shard, list(state.isr), list(new.isr))
        lead.complete_isr_change(new.isr)
        self._publish(name, shard, lead)

    # --- follower fetchers ----------------------------------------------------------------

    def _followed_from(self, leader: int) -> dict[ShardKey, _Following]:
        """The shards this node follows from ``leader``, with their following records."""
        return {k: f for k, f in self.following.items() if f.leader == leader}

    def _sync_fetchers(self) -> None:
        wanted = {f.leader for f in self.following.values()}
        for leader, fetcher in self._fetchers.items():
            inflight = fetcher.inflight
            if inflight is None:
                continue
            now = self._followed_from(leader)
            # A new following record (by identity: a new leader epoch) is a change too.
            if now.keys() != inflight.keys() or any(now[k] is not f for k, f in inflight.items()):
                fetcher.wake.set()
        for leader in [n for n in self._fetchers if n not in wanted or n not in self.nodes]:
            gone = self._fetchers.pop(leader)
            if gone.task is not None:
                gone.task.cancel()
        for leader in wanted:
            info = self.nodes.get(leader)
            if info is None:
                continue
            old = self._fetchers.get(leader)
            if old is None or old.url != info.url:
                if old is not None and old.task is not None:
                    old.task.cancel()
                fetcher = _Fetcher(leader, info.url)
                fetcher.task = asyncio.create_task(
                    self._fetch_loop(fetcher), name=f"fetch-{self.node_id}-{leader}"
                )
                self._fetchers[leader] = fetcher

    async def _post(self, url: str, path: str, body: bytes, timeout_s: float) -> bytes:
        assert self._http is not None
        try:
            async with self._http.post(
                url + path,
                data=body,
                headers={"Content-Type": protocol.JSON},
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as resp:
                data = await resp.read()
                if resp.status >= 400:
                    raise protocol.error_from_reply(resp.status, data)
                return data
        except SeglogError:
            raise
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise ServerUnavailable(f"POST {url}{path}: {exc or type(exc).__name__}") from exc

    async def _ask_epoch_end(
        self, fetcher: _Fetcher, name: str, shard: int, epoch: int, leader_epoch: int
    ) -> tuple[int, int]:
        assert self._http is not None
        path = f"{protocol.API_PREFIX}/dbs/{name}/shards/{shard}/epoch-end"
        try:
            async with self._http.get(
                fetcher.url + path, params={"epoch": str(epoch), "leader_epoch": str(leader_epoch)}
            ) as resp:
                data = await resp.read()
                if resp.status >= 400:
                    raise protocol.error_from_reply(resp.status, data)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise ServerUnavailable(f"GET {fetcher.url}{path}: {exc}") from exc
        obj = json.loads(data)
        return int(obj["epoch"]), int(obj["end_offset"])

    async def _fetch_loop(self, fetcher: _Fetcher) -> None:
        while True:
            try:
                await self._fetch_once(fetcher)
            except asyncio.CancelledError:
                raise
            except SeglogError as exc:
                log.info("node %d: fetch from %d: %s", self.node_id, fetcher.leader, exc)
                # A back-off after a failed fetch, not synchronisation.
                await asyncio.sleep(RETRY_DELAY_S)
            except Exception:
                log.exception("node %d: fetch from %d failed", self.node_id, fetcher.leader)
                await asyncio.sleep(RETRY_DELAY_S)

    async def _fetch_once(self, fetcher: _Fetcher) -> None:
        fetcher.wake.clear()  # before reading the set: a change from here on cuts the fetch short
        mine = self._followed_from(fetcher.leader)
        if not mine:
            await asyncio.sleep(RETRY_DELAY_S)
            return
        parts = []
        for (name, shard), following in mine.items():
            db = await self.store.open_db(name)
            damaged = self._damaged.get((name, shard))
            if damaged is not None:
                end = await db.truncate_to(shard, min(damaged, db.end_offset(shard)), force=True)
                del self._damaged[(name, shard)]
                log.warning("node %d: %s/%d cut to %d at a damaged frame", self.node_id, name, shard, end)
            if not following.truncated:

                async def ask(
                    epoch: int, name: str = name, shard: int = shard, le: int = following.leader_epoch
                ) -> tuple[int, int]:
                    return await self._ask_epoch_end(fetcher, name, shard, epoch, le)

                end = await truncate_to_leader(db, shard, ask)
                following.truncated = True
                log.info(
                    "node %d: %s/%d truncated to %d for epoch %d",
                    self.node_id,
                    name,
                    shard,
                    end,
                    following.leader_epoch,
                )
            parts.append(PartRequest(name, shard, db.end_offset(shard), following.leader_epoch))
        body = replica_wire.encode_request(
            self.node_id, parts, wait_ms=self.config.fetch_wait_ms, max_bytes=self.config.fetch_max_bytes
        )
        post = asyncio.ensure_future(
            self._post(
                fetcher.url,
                protocol.API_PREFIX + "/replica/fetch",
                body,
                REQUEST_TIMEOUT_S + self.config.fetch_wait_ms / 1000,
            )
        )
        changed = asyncio.ensure_future(fetcher.wake.wait())
        fetcher.inflight = mine
        try:
            done, _ = await asyncio.wait((post, changed), return_when=asyncio.FIRST_COMPLETED)
        finally:
            fetcher.inflight = None
            changed.cancel()
            if not post.done():
                # The set changed (or this task is being cancelled): nothing of this fetch was
                # stored, so dropping its reply loses nothing; the next round asks again.
                post.cancel()
                post.add_done_callback(lambda f: f.cancelled() or f.exception())
        if post not in done:
            return
        reply = post.result()
        # All shards at once: their durable appends share the I/O worker's drain (one journal
        # sync for the round) instead of one fsync after another.
        await asyncio.gather(*(self._store_part(part, mine) for part in fetch_wire.decode_reply(reply)))

    async def _store_part(self, part: FetchPart, mine: dict[ShardKey, _Following]) -> None:
        key = (part.db, part.shard)
        following = self.following.get(key)
        if following is None or following is not mine.get(key):
            return  # the role changed while the fetch was out
        if part.error is not None:
            if isinstance(part.error, OffsetOutOfRange) and await self._restart_below_leader(part):
                return
            if isinstance(part.error, NotLeader | OffsetOutOfRange):
                following.truncated = False  # re-learn and re-truncate at the next round
            log.info("node %d: %s/%d: %s", self.node_id, part.db, part.shard, part.error)
            return
        db = await self.store.open_db(part.db)
        if part.frames:
            try:
                await db.append_frames(part.shard, part.frames, expected_base=db.end_offset(part.shard))
            except OffsetMismatch:
                following.truncated = False
                return
        if db.update_high_watermark(part.shard, min(part.high_watermark, db.end_offset(part.shard))):
            self.waiters.wake(part.db, part.shard)

    async def _restart_below_leader(self, part: FetchPart) -> bool:
        """The leader's log starts past this copy's end (retention, or local copies it dropped
        once tiered): what lies between is gone from it, so this copy starts over, empty, at
        the leader's start (Kafka's ``truncateFullyAndStartAt``) and fetches on from there.
        Everything it drops is below the leader's start, so below what the leader still
        serves; its own records there were committed (and tiered, if the leader tiers) or
        never were. Returns whether it restarted."""
        error = part.error
        assert isinstance(error, OffsetOutOfRange)
        db = await self.store.open_db(part.db)
        leader_start = error.start
        end = db.end_offset(part.shard)
        if leader_start is None or leader_start <= end:
            return False
        await db.restart_at(part.shard, leader_start)
        log.warning(
            "node %d: %s/%d ended at %d, below the leader's start %d: restarted empty there",
            self.node_id,
            part.db,
            part.shard,
            end,
            leader_start,
        )
        if db.tiered:
            # What it dropped is in the tier: read the manifest now, so that reads below the
            # new start go there at once, not only after this node's next tier pass.
            try:
                await db.tier_committed_end(part.shard)
            except TierError as exc:
                log.info("node %d: %s: the tier is read at the next pass (%s)", self.node_id, part.db, exc)
        return True

    # --- describe ---------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """This node's view: nodes, controller activity, every shard's state and local role."""
        return {
            "node_id": self.node_id,
            "controller": self._controller is not None and self._controller.active.is_set(),
            "nodes": {str(n): i.url for n, i in sorted(self.nodes.items())},
            "dbs": {
                name: {
                    "shards": meta.shards,
                    "replication_factor": meta.replication_factor,
                    "min_insync": meta.min_insync,
                    "state": [_state_json(self.shards[(name, s)]) for s in range(meta.shards)],
                }
                for name, meta in sorted(self.dbs.items())
            },
            "leading": [
                {"db": k[0], "shard": k[1], "high_watermark": v.high_watermark, "isr": list(v.isr)}
                for k, v in sorted(self.leading.items())
            ],
        }


def _state_json(state: ShardState) -> dict[str, Any]:
    return {
        "replicas": list(state.replicas),
        "leader": state.leader,
        "leader_epoch": state.leader_epoch,
        "isr": list(state.isr),
        "partition_epoch": state.partition_epoch,
        "elr": list(state.elr),
    }
