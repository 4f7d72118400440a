"""Cluster metadata in etcd: nodes, databases, shard leadership, the controller, producer ids.

Key layout under a cluster prefix (default ``/seglog/``)::

    nodes/<node_id>             {"node_id", "url"}              under the node's lease
    controller                  {"node_id"}                     under the controller's lease
    dbs/<db>                    DbMeta JSON                     written last: the commit marker
    shards/<db>/<shard:06d>     ShardState JSON
    producer-ids                next producer id (decimal)

Every change to a shard is a compare-and-swap on the shard key's ``mod_revision`` and bumps
its ``partition_epoch``, so an update computed from a stale read (a stale leader shrinking
the ISR, a deposed controller electing) fails instead of overwriting a newer decision
(KIP-497's partition epoch). Controller writes also compare the controller key's
``create_revision`` (the controller epoch): a controller whose lease expired cannot write.
Liveness is a node's lease: a node that stops keeping it alive vanishes from ``nodes/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Final

from seglog.cluster.etcd import Compare, CompareTarget, EtcdClient, KeyValue, Op
from seglog.db_config import validate_db_name
from seglog.errors import (
    DatabaseExists,
    DatabaseNotFound,
    InvalidArgument,
    LeaseNotFound,
    MetadataError,
    NodeIdInUse,
    SeglogError,
    StaleMetadata,
)

__all__ = [
    "DEFAULT_PREFIX",
    "NO_LEADER",
    "ClusterMetadata",
    "ControllerLease",
    "DbMeta",
    "MetadataSnapshot",
    "NodeInfo",
    "NodeLease",
    "ShardState",
    "place_replicas",
]

DEFAULT_PREFIX: Final = b"/seglog/"
# ``leader`` of a shard that has none (every ISR member is down and unclean election is off).
NO_LEADER: Final = -1
DEFAULT_NODE_TTL_S: Final = 6
# etcd's default --max-txn-ops: a database's shard keys are written in chunks of this.
MAX_TXN_OPS: Final = 128
# While etcd does not answer, a lease refresh is retried this often (until the lease expires).
KEEPALIVE_RETRY_S: Final = 0.25

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A live node: its id and the URL other nodes and clients reach it at."""

    node_id: int
    url: str
    # Its store was open when the machine restarted: unsynced writes may be gone, so it may
    # lack records up to the high watermark it had (KIP-966's unclean shutdown).
    unclean_restart: bool = False


@dataclass(frozen=True, slots=True)
class DbMeta:
    """A replicated database's immutable layout and its replication settings."""

    name: str
    shards: int
    replication_factor: int
    min_insync: int
    # Allow electing a replica outside the ISR when no ISR member is alive (may lose data).
    unclean_election: bool = False
    # Options handed to each replica's local ``create_db`` (fsync policy, segment size, ...).
    options: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        """Raise :class:`InvalidArgument` unless the settings are consistent."""
        validate_db_name(self.name)
        if self.shards < 1:
            raise InvalidArgument(f"shards must be >= 1, not {self.shards}")
        if self.replication_factor < 1:
            raise InvalidArgument(f"replication_factor must be >= 1, not {self.replication_factor}")
        if not 1 <= self.min_insync <= self.replication_factor:
            raise InvalidArgument(
                f"min_insync must be in [1, replication_factor={self.replication_factor}], "
                f"not {self.min_insync}"
            )


@dataclass(frozen=True, slots=True)
class ShardState:
    """Who serves a shard (KRaft's PartitionRecord, minus reassignment)."""

    # Replica node ids; the first is the preferred leader.
    replicas: tuple[int, ...]
    leader: int
    # Bumped on every leadership change and stamped into the frames the leader writes.
    leader_epoch: int
    # In-sync replicas (the leader is always one while it leads).
    isr: tuple[int, ...]
    # Bumped on any change: fences updates computed from an older state.
    partition_epoch: int = 0
    # Eligible leader replicas (KIP-966): removed from an ISR already below min_insync, so
    # they hold everything up to the (frozen) high watermark; electable after the ISR.
    elr: tuple[int, ...] = ()

    def validate(self) -> None:
        """Raise :class:`InvalidArgument` unless the invariants hold."""
        if not self.replicas or len(set(self.replicas)) != len(self.replicas):
            raise InvalidArgument(f"replicas must be distinct and non-empty: {self.replicas}")
        if not set(self.isr) <= set(self.replicas):
            raise InvalidArgument(f"isr {self.isr} is not a subset of replicas {self.replicas}")
        if not set(self.elr) <= set(self.replicas) or set(self.elr) & set(self.isr):
            raise InvalidArgument(f"elr {self.elr} must be replicas outside the isr {self.isr}")
        if self.leader != NO_LEADER and self.leader not in self.isr:
            raise InvalidArgument(f"leader {self.leader} is not in the isr {self.isr}")
        if self.leader_epoch < 0 or self.partition_epoch < 0:
            raise InvalidArgument("epochs are non-negative")

    def with_isr(self, isr: tuple[int, ...], min_insync: int) -> ShardState:
        """This state with ``isr``, keeping KIP-966's eligible leader replicas.

        While the new ISR is below ``min_insync`` the high watermark is frozen, so members
        leaving it hold everything below it: they join the ELR. Once the ISR is back at
        ``min_insync`` the high watermark moves again without them and the ELR is cleared.
        """
        if len(isr) >= min_insync:
            return replace(self, isr=isr, elr=())
        removed = [r for r in self.isr if r not in isr]
        elr = tuple(r for r in dict.fromkeys([*self.elr, *removed]) if r not in isr)
        return replace(self, isr=isr, elr=elr)

    def to_json(self) -> bytes:
        """The stored form."""
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> ShardState:
        """Parse the stored form.

        Raises:
            MetadataError: The value is not a shard state (a foreign writer under our prefix).
        """
        try:
            obj = json.loads(data)
            state = cls(
                replicas=tuple(int(r) for r in obj["replicas"]),
                leader=int(obj["leader"]),
                leader_epoch=int(obj["leader_epoch"]),
                isr=tuple(int(r) for r in obj["isr"]),
                partition_epoch=int(obj["partition_epoch"]),
                elr=tuple(int(r) for r in obj.get("elr", ())),
            )
            state.validate()
        except (ValueError, KeyError, TypeError, InvalidArgument) as exc:
            raise MetadataError(f"not a shard state: {data[:200]!r}") from exc
        return state


def place_replicas(shards: int, replication_factor: int, nodes: Sequence[int]) -> list[tuple[int, ...]]:
    """Replica lists for ``shards`` shards over ``nodes``: spread evenly, leaders balanced.

    Shard ``s`` gets ``nodes[(s + i) % n]`` for ``i < replication_factor`` (Kafka's round
    robin without racks): each node leads ``shards / n`` shards (±1) and holds
    ``shards * rf / n`` replicas (±1).

    Raises:
        InvalidArgument: Fewer distinct nodes than ``replication_factor``.
    """
    ordered = sorted(set(nodes))
    if replication_factor > len(ordered):
        raise InvalidArgument(
            f"replication_factor {replication_factor} needs that many live nodes; "
            f"{len(ordered)} are registered: {ordered}"
        )
    n = len(ordered)
    return [tuple(ordered[(s + i) % n] for i in range(replication_factor)) for s in range(shards)]


class NodeLease:
    """A node's registration: its key lives while :meth:`keep_alive` keeps the lease."""

    def __init__(
        self,
        meta: ClusterMetadata,
        info: NodeInfo,
        lease: int,
        ttl_s: int,
        *,
        granted_at: float | None = None,
    ) -> None:
        """``granted_at``: event-loop time the grant was sent (default: now)."""
        self.meta = meta
        self.info = info
        self.lease = lease
        self.ttl_s = ttl_s
        # Set when etcd reports the lease gone, or when etcd stayed unreachable until the
        # lease expired by this node's clock: the node must stop acting as a cluster member.
        self.lost = asyncio.Event()
        # Event-loop time by which the lease has expired unless refreshed.
        self.deadline = (asyncio.get_running_loop().time() if granted_at is None else granted_at) + ttl_s
        # Event-loop time of the first failed refresh of the current etcd outage.
        self.unreachable_since: float | None = None
        self._task: asyncio.Task[None] | None = None

    def start_keepalive(self) -> None:
        """Refresh the lease every third of its TTL in a background task."""
        if self._task is None:
            self._task = asyncio.create_task(self._keepalive(), name=f"lease-node-{self.info.node_id}")

    async def _keepalive(self) -> None:
        loop = asyncio.get_running_loop()
        # ``deadline``: the lease cannot outlive it (the send time of the grant or of the last
        # refresh etcd answered, plus the TTL it reported); etcd's own expiry is no earlier.
        while True:
            sent = loop.time()
            left = self.deadline - sent
            if left <= 0:
                log.warning("node %d: etcd unreachable until lease %x expired", self.info.node_id, self.lease)
                self.lost.set()
                return
            try:
                # Bounded by the deadline: a hung etcd must not keep the node past it.
                async with asyncio.timeout(left):
                    ttl = await self.meta.etcd.lease_keepalive(self.lease)
            except LeaseNotFound:
                log.warning("node %d: etcd says lease %x is gone", self.info.node_id, self.lease)
                self.lost.set()
                return
            except Exception as exc:
                # etcd unreachable (down, restarting): the lease may well survive (etcd renews
                # every lease when it comes back), so keep trying until it has expired by our
                # own clock, not a moment before. Until then the node keeps its roles: a
                # leader keeps acknowledging acks="all" appends with the ISR it has, which it
                # cannot change without etcd. Anything else is retried the same way: this task
                # ending would leave the node registered in its own eyes and expired in etcd's.
                if not isinstance(exc, (MetadataError, TimeoutError)):
                    log.exception("node %d: refreshing lease %x failed", self.info.node_id, self.lease)
                now = loop.time()
                self.unreachable_since = self.unreachable_since or now
                # A back-off before the next attempt, not synchronisation.
                await asyncio.sleep(min(KEEPALIVE_RETRY_S, max(self.deadline - now, 0.0)))
                continue
            if self.unreachable_since is not None:
                log.info(
                    "node %d: etcd answers again after %.1f s; lease %x kept",
                    self.info.node_id,
                    loop.time() - self.unreachable_since,
                    self.lease,
                )
                self.unreachable_since = None
            self.deadline = sent + ttl
            # A timer, not synchronisation: the refresh period etcd leases require.
            await asyncio.sleep(self.ttl_s / 3)

    async def close(self, *, revoke: bool = True) -> None:
        """Stop refreshing; with ``revoke`` the node leaves at once (its key is deleted)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if revoke:
            await self.meta.etcd.lease_revoke(self.lease)


@dataclass(frozen=True, slots=True)
class ControllerLease:
    """The controller role held by ``node_id``; ``epoch`` is the controller key's create revision."""

    node_id: int
    lease: int
    epoch: int


@dataclass(frozen=True)
class MetadataSnapshot:
    """Every node, database and shard state, read at one etcd revision (one range read).

    Attributes:
        revision: The store revision it was read at (watch from ``revision + 1``).
        nodes: Registered (leased) nodes by id.
        dbs: The databases that exist (their key is written last at creation, so a database
            being created is left out until it is whole), by name.
        shards: Per database, each shard's state and ``mod_revision`` (also of databases not
            whole yet: their shard keys are written first).
    """

    revision: int
    nodes: dict[int, NodeInfo]
    dbs: dict[str, DbMeta]
    shards: dict[str, dict[int, tuple[ShardState, int]]]


class ClusterMetadata:
    """Typed access to the cluster's keys in etcd (see the module docstring for the layout)."""

    def __init__(self, etcd: EtcdClient, prefix: bytes = DEFAULT_PREFIX) -> None:
        """Metadata under ``prefix`` (one etcd can hold several clusters under different prefixes)."""
        if not prefix.endswith(b"/"):
            raise InvalidArgument("the metadata prefix must end with '/'")
        self.etcd = etcd
        self.prefix = prefix
        # Shard states the last snapshot parsed, by key, with their mod_revision: the next
        # one parses only the keys that changed (a snapshot follows every metadata change).
        self._parsed: dict[bytes, tuple[int, ShardState]] = {}

    # --- keys -----------------------------------------------------------------------------

    def _node_key(self, node_id: int) -> bytes:
        return self.prefix + b"nodes/%d" % node_id

    def _db_key(self, name: str) -> bytes:
        return self.prefix + b"dbs/" + name.encode()

    def _shard_prefix(self, name: str) -> bytes:
        return self.prefix + b"shards/" + name.encode() + b"/"

    def _shard_key(self, name: str, shard: int) -> bytes:
        return self._shard_prefix(name) + b"%06d" % shard

    @property
    def controller_key(self) -> bytes:
        """The key whose holder is the controller."""
        return self.prefix + b"controller"

    # --- nodes ----------------------------------------------------------------------------

    async def register_node(self, info: NodeInfo, *, ttl_s: int = DEFAULT_NODE_TTL_S) -> NodeLease:
        """Register a live node under a fresh lease (call ``start_keepalive`` on the result).

        Raises:
            NodeIdInUse: Another live process registered this node id.
        """
        if info.node_id < 0:
            raise InvalidArgument(f"node ids are non-negative, not {info.node_id}")
        granted_at = asyncio.get_running_loop().time()
        lease = await self.etcd.lease_grant(ttl_s)
        value = json.dumps(
            {"node_id": info.node_id, "url": info.url, "unclean_restart": info.unclean_restart}
        ).encode()
        if not await self.etcd.cas(self._node_key(info.node_id), 0, value, lease=lease):
            await self.etcd.lease_revoke(lease)
            raise NodeIdInUse(f"node id {info.node_id} is registered by a live process")
        return NodeLease(self, info, lease, ttl_s, granted_at=granted_at)

    async def live_nodes(self) -> dict[int, NodeInfo]:
        """Registered (leased) nodes by id."""
        kvs, _ = await self.etcd.get_prefix(self.prefix + b"nodes/")
        nodes = {}
        for kv in kvs:
            obj = json.loads(kv.value)
            nodes[int(obj["node_id"])] = NodeInfo(
                int(obj["node_id"]), str(obj["url"]), bool(obj.get("unclean_restart", False))
            )
        return nodes

    async def snapshot(self) -> MetadataSnapshot:
        """Nodes, databases and shard states in one consistent read (one request however
        many databases there are; a database whose settings or shards do not parse, or that
        is not whole yet, is left out and logged)."""
        kvs, revision = await self.etcd.get_prefix(self.prefix)
        nodes_p, dbs_p, shards_p = (self.prefix + p for p in (b"nodes/", b"dbs/", b"shards/"))
        nodes: dict[int, NodeInfo] = {}
        metas: dict[str, DbMeta] = {}
        states: dict[str, dict[int, tuple[ShardState, int]]] = {}
        parsed: dict[bytes, tuple[int, ShardState]] = {}
        for kv in kvs:
            key = kv.key
            try:
                if key.startswith(nodes_p):
                    obj = json.loads(kv.value)
                    info = NodeInfo(
                        int(obj["node_id"]), str(obj["url"]), bool(obj.get("unclean_restart", False))
                    )
                    nodes[info.node_id] = info
                elif key.startswith(dbs_p):
                    meta = DbMeta(**json.loads(kv.value))
                    metas[meta.name] = meta
                elif key.startswith(shards_p):
                    name, _, number = key[len(shards_p) :].decode().rpartition("/")
                    known = self._parsed.get(key)
                    state = known[1] if known is not None and known[0] == kv.mod_revision else None
                    if state is None:
                        state = ShardState.from_json(kv.value)
                    parsed[key] = (kv.mod_revision, state)
                    states.setdefault(name, {})[int(number)] = (state, kv.mod_revision)
            except (ValueError, TypeError, KeyError, SeglogError) as exc:
                log.warning("metadata key %r does not parse (%s); left out", key, exc)
        self._parsed = parsed
        dbs = {n: m for n, m in metas.items() if len(states.get(n, {})) == m.shards}
        return MetadataSnapshot(revision, nodes, dbs, states)

    # --- databases ------------------------------------------------------------------------

    async def create_db(self, meta: DbMeta, nodes: Sequence[int] | None = None) -> list[ShardState]:
        """Place ``meta``'s replicas over ``nodes`` (default: the live ones) and record it.

        Shard keys are written first (create-if-absent, in chunks of etcd's transaction
        limit) and the database key last: readers treat a database as existing only once its
        key is there, so a creator that dies half way leaves nothing visible, and a retry
        reuses the shard keys it finds.

        Raises:
            DatabaseExists: The database key already exists.
            InvalidArgument: Bad settings or too few nodes.
        """
        meta.validate()
        if await self.etcd.get(self._db_key(meta.name)) is not None:
            raise DatabaseExists(f"database {meta.name!r} exists in the cluster")
        if nodes is None:
            nodes = sorted(await self.live_nodes())
        placement = place_replicas(meta.shards, meta.replication_factor, nodes)
        states = [ShardState(r, r[0], 0, r, 0) for r in placement]
        for start in range(0, meta.shards, MAX_TXN_OPS):
            chunk = range(start, min(start + MAX_TXN_OPS, meta.shards))
            await self.etcd.txn(
                [],
                [Op(self._shard_key(meta.name, s), states[s].to_json()) for s in chunk],
            )
        if not await self.etcd.cas(self._db_key(meta.name), 0, json.dumps(asdict(meta)).encode()):
            raise DatabaseExists(f"database {meta.name!r} was created concurrently")
        return states

    async def get_db(self, name: str) -> DbMeta:
        """A database's settings.

        Raises:
            DatabaseNotFound: No such database in the cluster.
        """
        kv = await self.etcd.get(self._db_key(name))
        if kv is None:
            raise DatabaseNotFound(f"no database {name!r} in the cluster")
        obj = json.loads(kv.value)
        return DbMeta(**obj)

    async def list_dbs(self) -> list[str]:
        """Names of the cluster's databases."""
        kvs, _ = await self.etcd.get_prefix(self.prefix + b"dbs/")
        return [kv.key[len(self.prefix) + 4 :].decode() for kv in kvs]

    async def drop_db(self, name: str) -> None:
        """Remove a database: its key first (it stops existing), then its shard keys."""
        if not await self.etcd.delete(self._db_key(name)):
            raise DatabaseNotFound(f"no database {name!r} in the cluster")
        kvs, _ = await self.etcd.get_prefix(self._shard_prefix(name))
        for start in range(0, len(kvs), MAX_TXN_OPS):
            await self.etcd.txn([], [Op(kv.key) for kv in kvs[start : start + MAX_TXN_OPS]])

    # --- shards ---------------------------------------------------------------------------

    async def shard(self, name: str, shard: int) -> tuple[ShardState, int]:
        """A shard's state and the ``mod_revision`` to pass to :meth:`update_shard`."""
        kv = await self.etcd.get(self._shard_key(name, shard))
        if kv is None:
            raise DatabaseNotFound(f"no shard {shard} of {name!r} in the cluster")
        return ShardState.from_json(kv.value), kv.mod_revision

    async def shards(self, name: str) -> dict[int, tuple[ShardState, int]]:
        """Every shard of a database with its ``mod_revision``."""
        kvs, _ = await self.etcd.get_prefix(self._shard_prefix(name))
        return {int(kv.key.rsplit(b"/", 1)[1]): self._state(kv) for kv in kvs}

    @staticmethod
    def _state(kv: KeyValue) -> tuple[ShardState, int]:
        return ShardState.from_json(kv.value), kv.mod_revision

    async def update_shard(
        self,
        name: str,
        shard: int,
        old: ShardState,
        mod_revision: int,
        new: ShardState,
        *,
        controller: ControllerLease | None = None,
    ) -> int:
        """Replace ``old`` (read at ``mod_revision``) by ``new``; the new ``mod_revision``.

        ``new.partition_epoch`` is set to ``old.partition_epoch + 1`` here, and a leader
        change must bump ``leader_epoch``. With ``controller`` the write also requires that
        lease to still hold the controller role.

        Raises:
            StaleMetadata: The shard changed since it was read, or the controller was deposed.
            InvalidArgument: ``new`` breaks an invariant (leader outside the ISR, epoch going back).
        """
        new = replace(new, partition_epoch=old.partition_epoch + 1)
        new.validate()
        if new.leader_epoch < old.leader_epoch:
            raise InvalidArgument(f"leader_epoch would go back from {old.leader_epoch} to {new.leader_epoch}")
        if new.leader != old.leader and new.leader_epoch == old.leader_epoch:
            raise InvalidArgument("a leader change must bump leader_epoch")
        key = self._shard_key(name, shard)
        compares = [Compare(key, mod_revision)]
        if controller is not None:
            compares.append(Compare(self.controller_key, controller.epoch, CompareTarget.CREATE))
        result = await self.etcd.txn(compares, [Op(key, new.to_json())])
        if not result.succeeded:
            raise StaleMetadata(
                f"shard {shard} of {name!r} changed since partition_epoch {old.partition_epoch}"
                + (" or the controller was deposed" if controller is not None else "")
            )
        return result.revision

    # --- controller -----------------------------------------------------------------------

    async def campaign(self, node_id: int, lease: int) -> ControllerLease | None:
        """Take the controller role if nobody holds it; ``None`` if someone else does.

        A key already held under ``lease`` is this node's own role: a campaign after an etcd
        error (the watch broke while etcd restarted, the lease survived) gets it back rather
        than waiting for its own key to be deleted, which would happen only when the lease
        expires, and never while the node keeps it alive.
        """
        value = json.dumps({"node_id": node_id}).encode()
        result = await self.etcd.txn(
            [Compare(self.controller_key, 0, CompareTarget.CREATE)],
            [Op(self.controller_key, value, lease)],
        )
        if result.succeeded:
            return ControllerLease(node_id, lease, result.revision)
        kv = await self.etcd.get(self.controller_key)
        if kv is not None and kv.lease == lease:
            return ControllerLease(node_id, lease, kv.create_revision)
        return None

    async def controller(self) -> tuple[int, int] | None:
        """``(node_id, epoch)`` of the current controller, or ``None``."""
        kv = await self.etcd.get(self.controller_key)
        if kv is None:
            return None
        return int(json.loads(kv.value)["node_id"]), kv.create_revision

    # --- producer ids ---------------------------------------------------------------------

    async def allocate_producer_id(self) -> int:
        """A cluster-unique producer id (a CAS-incremented counter; never reused)."""
        key = self.prefix + b"producer-ids"
        while True:
            kv = await self.etcd.get(key)
            current = 0 if kv is None else int(kv.value)
            if await self.etcd.cas(key, 0 if kv is None else kv.mod_revision, b"%d" % (current + 1)):
                return current
