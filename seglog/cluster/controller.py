"""The controller: one node at a time elects shard leaders when nodes come and go.

Every node runs a :class:`Controller`; the one whose campaign wins (an etcd transaction on
the controller key, see :mod:`seglog.cluster.metadata`) reconciles every shard against the
live nodes whenever a node lease appears or disappears, and the others wait for the key to
go. Its writes compare the controller key's create revision, so a controller that was
paused past its lease cannot overwrite its successor's decisions.

Election rules (Kafka's, with KIP-966's last-replica guard):

* a dead node leaves the ISR of every shard, except the last ISR member: it stays, as the
  only replica known to hold everything up to the high watermark, and the shard is
  leaderless until it returns (or an unclean election, below);
* a shard whose leader is dead (or that has none) gets the first live ISR member, in replica
  order, as leader, with ``leader_epoch + 1``;
* no live ISR member: the shard stays leaderless unless the database enables
  ``unclean_election``, which elects the first live replica and makes it the whole ISR
  (acknowledged records it lacks are lost; that is what the setting trades for availability).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import replace
from typing import Final

from seglog.cluster.etcd import EtcdClient, WatchEventType
from seglog.cluster.metadata import NO_LEADER, ClusterMetadata, ControllerLease, DbMeta, ShardState
from seglog.errors import LeaseNotFound, MetadataError, StaleMetadata

__all__ = ["Controller", "decide"]

log = logging.getLogger(__name__)

# After an etcd error the loop starts over (re-read, re-watch) after this pause.
RETRY_DELAY_S: Final = 0.5


def decide(
    meta: DbMeta, state: ShardState, live: set[int], unclean: frozenset[int] | set[int] = frozenset()
) -> ShardState | None:
    """The state ``state`` should move to given the ``live`` nodes, or ``None`` to keep it.

    ``unclean`` are live nodes whose store was open when their machine restarted (they may
    have lost unsynced writes): elected only when no clean candidate is left.
    """
    isr = tuple(r for r in state.isr if r in live)
    if not isr and state.isr:
        # Last replica standing: keep the last ISR member on record (not in live).
        isr = (state.isr[-1],) if state.leader == NO_LEADER else (state.leader,)
    new = state.with_isr(isr, meta.min_insync)
    leader, epoch, elr = state.leader, state.leader_epoch, new.elr
    if leader not in live:
        in_sync = [r for r in state.replicas if r in isr and r in live]
        eligible = [r for r in state.replicas if r in elr and r in live and r not in unclean]
        clean = [r for r in in_sync if r not in unclean]
        if clean:
            leader, epoch = clean[0], epoch + 1
        elif eligible:
            # KIP-966: an ELR member holds everything up to the high watermark.
            leader, epoch = eligible[0], epoch + 1
            isr, elr = (leader,), tuple(r for r in elr if r != leader)
        elif in_sync:
            leader, epoch = in_sync[0], epoch + 1  # the last known in-sync replica, unclean
        elif meta.unclean_election and any(r in live for r in state.replicas):
            leader = next(r for r in state.replicas if r in live)
            isr, elr, epoch = (leader,), (), epoch + 1
        elif leader != NO_LEADER:
            leader, epoch = NO_LEADER, epoch + 1
    new = replace(new, leader=leader, leader_epoch=epoch, isr=isr, elr=elr)
    return None if new == state else new


class Controller:
    """Campaigns for the controller role with ``lease`` and, while holding it, reconciles."""

    def __init__(self, meta: ClusterMetadata, node_id: int, lease: int) -> None:
        self.meta = meta
        self.node_id = node_id
        self.lease = lease
        # Set while this node holds the role (tests and /metrics read it).
        self.active = asyncio.Event()
        # Bumped after every completed reconciliation pass (tests wait on it).
        self.passes = 0
        self.reconciled = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    @property
    def etcd(self) -> EtcdClient:
        """The metadata store's client."""
        return self.meta.etcd

    def start(self) -> None:
        """Run the campaign/reconcile loop in a background task."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"controller-{self.node_id}")

    async def close(self) -> None:
        """Stop the loop (the role is released when the lease goes)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.active.clear()

    async def _run(self) -> None:
        while True:
            try:
                held = await self.meta.campaign(self.node_id, self.lease)
                if held is None:
                    await self._wait_for_vacancy()
                    continue
                self.active.set()
                log.info("node %d is the controller (epoch %d)", self.node_id, held.epoch)
                await self._lead(held)
            except LeaseNotFound:
                # The node's lease is gone: it is no longer a cluster member and must
                # register again (with a new lease and a new controller) before it acts.
                self.active.clear()
                log.warning("controller %d: the node lease expired; not campaigning", self.node_id)
                return
            except (MetadataError, StaleMetadata) as exc:
                self.active.clear()
                log.warning("controller %d: %s; starting over", self.node_id, exc)
                # A back-off timer after a failure, not synchronisation.
                await asyncio.sleep(RETRY_DELAY_S)
            except Exception:
                # A bug must not silently end the node's controller: log it and start over.
                self.active.clear()
                log.exception("controller %d failed; starting over", self.node_id)
                await asyncio.sleep(RETRY_DELAY_S)

    async def _wait_for_vacancy(self) -> None:
        kv = await self.etcd.get(self.meta.controller_key)
        if kv is None:
            return
        async for events in self.etcd.watch_prefix(
            self.meta.controller_key, start_revision=kv.mod_revision + 1
        ):
            if any(e.type is WatchEventType.DELETE for e in events):
                return

    async def _lead(self, held: ControllerLease) -> None:
        nodes_prefix = self.meta.prefix + b"nodes/"
        while True:
            _, revision = await self.etcd.get_prefix(nodes_prefix)
            await self.reconcile(held)
            async for events in self.etcd.watch_prefix(self.meta.prefix, start_revision=revision + 1):
                if any(e.kv.key == self.meta.controller_key for e in events):
                    current = await self.meta.controller()
                    if current is None or current[1] != held.epoch:
                        raise StaleMetadata(f"controller {self.node_id} was deposed")
                if any(e.kv.key.startswith(nodes_prefix) or self._is_db_key(e.kv.key) for e in events):
                    await self.reconcile(held)

    def _is_db_key(self, key: bytes) -> bool:
        return key.startswith(self.meta.prefix + b"dbs/")

    async def reconcile(self, held: ControllerLease) -> None:
        """One pass: move every shard to the state :func:`decide` gives for the live nodes."""
        snap = await self.meta.snapshot()  # one read, whatever the number of databases
        live = set(snap.nodes)
        unclean = {n for n, info in snap.nodes.items() if info.unclean_restart}
        for name, db in snap.dbs.items():
            for shard, (state, revision) in sorted(snap.shards[name].items()):
                new = decide(db, state, live, unclean)
                if new is None:
                    continue
                try:
                    await self.meta.update_shard(name, shard, state, revision, new, controller=held)
                except StaleMetadata:
                    # A leader changed the ISR meanwhile (or we were deposed: the watch on the
                    # controller key ends the role); the next pass sees the new state.
                    if (await self.meta.controller() or (None, None))[1] != held.epoch:
                        raise
                    continue
                log.info(
                    "%s/%d: leader %d -> %d (epoch %d), isr %s",
                    name,
                    shard,
                    state.leader,
                    new.leader,
                    new.leader_epoch,
                    list(new.isr),
                )
        async with self.reconciled:
            self.passes += 1
            self.reconciled.notify_all()
