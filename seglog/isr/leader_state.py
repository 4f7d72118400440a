"""Leader-side replication state of one shard: follower log ends, ISR changes, high watermark, acks.

Pure bookkeeping with an injected clock: the node feeds it the leader's appends and every
follower fetch, applies the ISR changes it proposes through the metadata compare-and-swap,
and waits on it to acknowledge produces. Kafka's rules (``Partition.scala``,
``ReplicaManager``), with KIP-966's strict minimum ISR:

* a follower's log end is the offset it fetches from (it holds everything before it);
* it is *caught up* at a fetch that asks for the leader's end, or that asks for at least the
  end the leader had at its previous fetch (then it was caught up at that previous fetch);
* an ISR member not caught up for ``replica_lag_time_max_ms`` is proposed for removal (a
  periodic check); a replica outside the ISR whose log end reached the high watermark and the
  start of the current leader epoch is proposed for addition, on the fetch that gets it
  there (:meth:`ShardLeaderState.expansion_due`);
* the high watermark is the minimum log end over the *maximal* ISR (the ISR plus additions
  in flight, so an expansion never lets it run ahead of the new member), only rises, and
  does not move at all while the ISR is below ``min_insync``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Final

from seglog.errors import (
    InvalidArgument,
    NotEnoughReplicas,
    NotEnoughReplicasAfterAppend,
    NotLeader,
    OffsetOutOfRange,
)

__all__ = ["DEFAULT_REPLICA_LAG_TIME_MAX_MS", "Acks", "IsrChange", "ShardLeaderState"]

# Kafka's replica.lag.time.max.ms since 2.5.
DEFAULT_REPLICA_LAG_TIME_MAX_MS: Final = 30_000


class Acks(Enum):
    """When a produce is acknowledged."""

    # The leader's local durable write.
    ONE = "1"
    # A majority of the replicas (leader included) hold the batch.
    QUORUM = "quorum"
    # Every ISR member holds it (the high watermark passed it); refused below min_insync.
    ALL = "all"

    @classmethod
    def parse(cls, value: object) -> Acks:
        """``1``/``"1"``, ``"quorum"`` or ``"all"`` (also ``-1``, Kafka's spelling of all)."""
        if isinstance(value, Acks):
            return value
        text = str(value).strip().lower()
        if text == "-1":
            return cls.ALL
        for acks in cls:
            if acks.value == text:
                return acks
        raise InvalidArgument(f"acks must be 1, 'quorum' or 'all', not {value!r}")


@dataclass(frozen=True, slots=True)
class IsrChange:
    """A proposed ISR change: the node applies it through the metadata CAS."""

    add: frozenset[int]
    remove: frozenset[int]

    def apply(self, isr: Iterable[int]) -> tuple[int, ...]:
        """The ISR after the change (order kept, additions appended in id order)."""
        kept = [r for r in isr if r not in self.remove]
        return tuple(kept + sorted(self.add - set(kept)))


@dataclass(slots=True)
class _Follower:
    log_end: int = 0
    # Monotonic seconds of the last time the follower was caught up.
    last_caught_up_s: float = 0.0
    last_fetch_s: float = 0.0
    # The leader's log end at the follower's previous fetch.
    last_fetch_leader_end: int = -1


class ShardLeaderState:
    """Replication state of one shard on its leader for one leader epoch."""

    def __init__(
        self,
        shard: int,
        *,
        leader: int,
        leader_epoch: int,
        replicas: Iterable[int],
        isr: Iterable[int],
        min_insync: int,
        epoch_start_offset: int,
        log_end: int,
        high_watermark: int,
        replica_lag_time_max_ms: int = DEFAULT_REPLICA_LAG_TIME_MAX_MS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """State for a leader that just took over (or restarted) at ``leader_epoch``.

        Args:
            shard: The shard.
            leader: This node's id.
            leader_epoch: The epoch this leadership runs under.
            replicas: Every replica's node id (the leader included).
            isr: The ISR as the metadata has it (the leader included).
            min_insync: The database's minimum ISR size for ``acks="all"``.
            epoch_start_offset: The leader's log end when the epoch began: a follower rejoins
                the ISR only past it (it then has the new epoch's history).
            log_end: The leader's log end now.
            high_watermark: The high watermark the leader had recorded.
            replica_lag_time_max_ms: How long an ISR member may stay behind.
            clock: Monotonic seconds (tests inject one).
        """
        self.shard = shard
        self.leader = leader
        self.leader_epoch = leader_epoch
        self.replicas = tuple(replicas)
        if leader not in self.replicas:
            raise InvalidArgument(f"leader {leader} is not a replica of shard {shard}: {self.replicas}")
        if not 1 <= min_insync <= len(self.replicas):
            raise InvalidArgument(f"min_insync {min_insync} outside [1, {len(self.replicas)}]")
        if replica_lag_time_max_ms <= 0:
            raise InvalidArgument("replica_lag_time_max_ms must be positive")
        self.isr: tuple[int, ...] = tuple(isr)
        self.min_insync = min_insync
        self.epoch_start_offset = epoch_start_offset
        self.log_end = log_end
        self.high_watermark = min(high_watermark, log_end)
        self._lag_max_s = replica_lag_time_max_ms / 1000
        self._clock = clock
        now = clock()
        # Followers start "caught up now": a new leader gives each a full lag window.
        self._followers = {r: _Follower(last_caught_up_s=now) for r in self.replicas if r != leader}
        self._pending: IsrChange | None = None
        self._resigned: NotLeader | None = None
        self._changed = asyncio.Event()

    # --- inputs -------------------------------------------------------------------------

    def on_leader_append(self, log_end: int) -> None:
        """The leader's log now ends at ``log_end`` (after a durable local append)."""
        self.log_end = max(self.log_end, log_end)
        self._advance()

    def on_fetch(self, follower: int, fetch_offset: int) -> bool:
        """Record a follower's fetch from ``fetch_offset``; whether the high watermark rose.

        Raises:
            InvalidArgument: ``follower`` is not a replica of the shard.
            OffsetOutOfRange: It fetches past the leader's end (it diverged: it must truncate).
        """
        f = self._followers.get(follower)
        if f is None:
            raise InvalidArgument(f"node {follower} is not a follower of shard {self.shard}")
        if not 0 <= fetch_offset <= self.log_end:
            raise OffsetOutOfRange(fetch_offset, 0, self.log_end, shard=self.shard)
        now = self._clock()
        if fetch_offset >= self.log_end:
            f.last_caught_up_s = now
        elif fetch_offset >= f.last_fetch_leader_end >= 0:
            f.last_caught_up_s = max(f.last_caught_up_s, f.last_fetch_s)
        f.last_fetch_leader_end = self.log_end
        f.last_fetch_s = now
        moved = fetch_offset != f.log_end
        f.log_end = fetch_offset
        rose = self._advance()
        if moved and not rose:
            self._notify()  # a quorum waiter counts follower ends, not the high watermark
        return rose

    def replica_report(self) -> list[dict[str, int | bool | float | None]]:
        """Per replica (the leader first): its log end as the leader knows it, its lag in
        records behind the leader's log end, whether it is in the ISR, and the seconds since
        it was last caught up (``None`` for the leader)."""
        now = self._clock()
        out: list[dict[str, int | bool | float | None]] = [
            {"node": self.leader, "log_end": self.log_end, "lag": 0, "in_isr": True, "caught_up_s_ago": None}
        ]
        for r, f in sorted(self._followers.items()):
            out.append(
                {
                    "node": r,
                    "log_end": f.log_end,
                    "lag": max(0, self.log_end - f.log_end),
                    "in_isr": r in self.isr,
                    "caught_up_s_ago": round(now - f.last_caught_up_s, 3),
                }
            )
        return out

    # --- ISR ----------------------------------------------------------------------------

    def proposed_isr_change(self) -> IsrChange | None:
        """The ISR change the current state calls for (``None``: none, or one is in flight)."""
        if self._pending is not None:
            return None
        now = self._clock()
        remove = {
            r
            for r in self.isr
            if r != self.leader and now - self._followers[r].last_caught_up_s > self._lag_max_s
        }
        add = {r for r in self._followers if self._may_join(r, now)}
        if not add and not remove:
            return None
        return IsrChange(frozenset(add), frozenset(remove))

    def _may_join(self, follower: int, now: float) -> bool:
        f = self._followers[follower]
        return (
            follower not in self.isr
            and f.log_end >= self.high_watermark
            and f.log_end >= self.epoch_start_offset
            and now - f.last_caught_up_s <= self._lag_max_s
        )

    def expansion_due(self, follower: int) -> bool:
        """Whether ``follower``, outside the ISR, may join it now and no ISR change is in flight.

        Kafka adds a follower on the fetch that reaches the high watermark (and the current
        epoch's start) rather than waiting for the periodic ISR check: the node asks this
        after each fetch and then proposes the change at once.
        """
        if self._pending is not None or follower not in self._followers:
            return False
        return self._may_join(follower, self._clock())

    def begin_isr_change(self, change: IsrChange) -> None:
        """The node is writing ``change`` to the metadata: additions count for the high watermark now."""
        self._pending = change

    def complete_isr_change(self, isr: Iterable[int]) -> None:
        """The metadata now holds ``isr`` (after a successful CAS, or as read after a failed one)."""
        self._pending = None
        self.isr = tuple(isr)
        self._advance()
        self._notify()

    def abort_isr_change(self) -> None:
        """The CAS failed and the ISR did not change."""
        self._pending = None
        self._notify()

    @property
    def maximal_isr(self) -> tuple[int, ...]:
        """The ISR plus additions in flight (what the high watermark and acks wait for)."""
        if self._pending is None:
            return self.isr
        return self.isr + tuple(sorted(self._pending.add - set(self.isr)))

    # --- high watermark and acks ----------------------------------------------------------

    def _end_of(self, replica: int) -> int:
        return self.log_end if replica == self.leader else self._followers[replica].log_end

    def _advance(self) -> bool:
        if len(self.isr) < self.min_insync:
            return False
        new = min(self._end_of(r) for r in self.maximal_isr)
        if new > self.high_watermark:
            self.high_watermark = new
            self._notify()
            return True
        return False

    def _notify(self) -> None:
        # Waiters hold the event current when they checked; a fresh one catches later changes.
        self._changed.set()
        self._changed = asyncio.Event()

    def check_append(self, acks: Acks) -> None:
        """Raise before writing if ``acks`` cannot be met now.

        Raises:
            NotLeader: This leadership has ended.
            NotEnoughReplicas: ``acks="all"`` and the ISR is below ``min_insync`` (or
                ``"quorum"`` and fewer than a majority are in sync).
        """
        if self._resigned is not None:
            raise self._resigned
        if acks is Acks.ALL and len(self.isr) < self.min_insync:
            raise NotEnoughReplicas(
                f"shard {self.shard}: {len(self.isr)} in-sync replicas {list(self.isr)}, "
                f"min_insync is {self.min_insync}; nothing was written"
            )
        if acks is Acks.QUORUM and len(self.isr) <= len(self.replicas) // 2:
            raise NotEnoughReplicas(
                f"shard {self.shard}: {len(self.isr)} of {len(self.replicas)} replicas in sync, "
                "a majority is needed; nothing was written"
            )

    def replicated(self, end: int, acks: Acks) -> bool:
        """Whether a batch ending at ``end`` (exclusive) meets ``acks`` now."""
        if acks is Acks.ONE:
            return self.log_end >= end
        if acks is Acks.ALL:
            return self.high_watermark >= end
        holders = sum(1 for r in self.replicas if self._end_of(r) >= end)
        return holders > len(self.replicas) // 2

    async def wait_replicated(self, end: int, acks: Acks, timeout_s: float) -> None:
        """Wait until a batch ending at ``end`` meets ``acks``.

        Raises:
            NotLeader: The leadership ended first (the batch may or may not survive).
            NotEnoughReplicasAfterAppend: The ISR fell below ``min_insync`` (``acks="all"``)
                or ``timeout_s`` passed; the batch is written and may become visible.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            changed = self._changed
            if self._resigned is not None:
                raise self._resigned
            if self.replicated(end, acks):
                return
            if acks is Acks.ALL and len(self.isr) < self.min_insync:
                raise NotEnoughReplicasAfterAppend(
                    f"shard {self.shard}: the ISR {list(self.isr)} fell below min_insync "
                    f"{self.min_insync} before offset {end - 1} was replicated"
                )
            left = deadline - loop.time()
            if left <= 0:
                raise NotEnoughReplicasAfterAppend(
                    f"shard {self.shard}: offset {end - 1} not replicated ({acks.value}) "
                    f"within {timeout_s:g} s"
                )
            try:
                await asyncio.wait_for(changed.wait(), left)
            except TimeoutError:
                continue

    def resign(self, leader: int, leader_epoch: int) -> None:
        """Another node leads from ``leader_epoch`` on: fail every waiter with :class:`NotLeader`."""
        self._resigned = NotLeader(
            f"shard {self.shard}: node {self.leader} no longer leads (leader {leader}, epoch {leader_epoch})",
            shard=self.shard,
            leader=leader,
            leader_epoch=leader_epoch,
        )
        self._notify()

    def follower_log_ends(self) -> dict[int, int]:
        """Each follower's last known log end (metrics, describe)."""
        return {r: f.log_end for r, f in self._followers.items()}
