"""Consumer-group membership of a node: who reads which shards, under which generation.

Pure logic, no I/O: the clock is injected (monotonic seconds) so expiry is tested without
waiting. :mod:`seglog.cluster.group_routes` serves it over HTTP; committed offsets live in the
database's durable group store, not here.

Model (Kafka's group coordinator, simplified to one step): a member joins with a session
timeout and gets a server-made member id; the shards of the database are split into
contiguous **ranges** over the members sorted by member id; every change of membership
(join, leave, expiry) bumps the group's **generation**. A member learns of a change from
its next heartbeat (which answers the current generation and its assignment); commits are
accepted only under the current generation, for shards the member owns, so a member that
fell out of the group (a zombie) cannot move the group's offsets.

Membership lives in memory only: after a server restart every group is empty, members get
:class:`~seglog.errors.UnknownMember` on their next heartbeat and rejoin (their committed
offsets are durable and unaffected).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from seglog.errors import InvalidArgument, StaleGeneration, UnknownMember

__all__ = [
    "DEFAULT_MAX_SESSION_TIMEOUT_MS",
    "DEFAULT_MIN_SESSION_TIMEOUT_MS",
    "GroupCoordinator",
    "Membership",
    "range_assignment",
]

DEFAULT_MIN_SESSION_TIMEOUT_MS: Final = 250
DEFAULT_MAX_SESSION_TIMEOUT_MS: Final = 300_000
_MAX_MEMBER_ID_CHARS: Final = 200

GroupKey = tuple[str, str]
"""(database, group)."""


def range_assignment(shards: int, members: list[str]) -> dict[str, list[int]]:
    """Contiguous ranges of ``range(shards)`` over ``members`` in sorted order.

    The first ``shards % len(members)`` members get one shard more; with more members than
    shards the last ones get none.
    """
    ordered = sorted(members)
    if not ordered:
        return {}
    base, extra = divmod(shards, len(ordered))
    out: dict[str, list[int]] = {}
    start = 0
    for i, member in enumerate(ordered):
        n = base + (1 if i < extra else 0)
        out[member] = list(range(start, start + n))
        start += n
    return out


@dataclass(frozen=True)
class Membership:
    """What a member is told: its id, the group's generation and its shards."""

    member_id: str
    generation: int
    assignment: list[int]
    session_timeout_ms: int


@dataclass
class _Member:
    session_timeout_ms: int
    deadline: float


@dataclass
class _Group:
    shards: int
    generation: int = 0
    members: dict[str, _Member] = field(default_factory=dict)
    assignment: dict[str, list[int]] = field(default_factory=dict)

    def rebalance(self) -> None:
        self.generation += 1
        self.assignment = range_assignment(self.shards, list(self.members))


class GroupCoordinator:
    """Every consumer group of a node, keyed by (database, group).

    Every method first expires the sessions of the group it touches (lazily, against the
    injected clock); :meth:`expire_due` does the same for all groups from a timer.

    Args:
        clock: Monotonic seconds (``time.monotonic`` by default; tests inject their own).
        min_session_timeout_ms: Shortest session a member may ask for.
        max_session_timeout_ms: Longest session a member may ask for.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        min_session_timeout_ms: int = DEFAULT_MIN_SESSION_TIMEOUT_MS,
        max_session_timeout_ms: int = DEFAULT_MAX_SESSION_TIMEOUT_MS,
    ) -> None:
        if not 0 < min_session_timeout_ms <= max_session_timeout_ms:
            raise InvalidArgument("need 0 < min_session_timeout_ms <= max_session_timeout_ms")
        self._clock = clock
        self.min_session_timeout_ms = min_session_timeout_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self._groups: dict[GroupKey, _Group] = {}

    # --- membership --------------------------------------------------------------------

    def join(
        self, key: GroupKey, shards: int, *, session_timeout_ms: int, member_id: str | None = None
    ) -> Membership:
        """Join (or rejoin) ``key``; the generation bumps unless ``member_id`` is already a member.

        A rejoin under an unknown ``member_id`` (the session expired, the server restarted)
        is admitted under that id, as a new member.

        Raises:
            InvalidArgument: The session timeout is outside the server's bounds, or the
                member id is not a short printable string.
        """
        if type(session_timeout_ms) is not int or not (
            self.min_session_timeout_ms <= session_timeout_ms <= self.max_session_timeout_ms
        ):
            raise InvalidArgument(
                f"session_timeout_ms must be an int in {self.min_session_timeout_ms}.."
                f"{self.max_session_timeout_ms}, not {session_timeout_ms!r}"
            )
        if member_id is not None and not _valid_member_id(member_id):
            raise InvalidArgument(f"member_id must be 1-{_MAX_MEMBER_ID_CHARS} printable characters")
        group = self._group(key, shards)
        now = self._clock()
        if member_id is None:
            member_id = uuid.uuid4().hex
        member = group.members.get(member_id)
        if member is None:
            group.members[member_id] = _Member(session_timeout_ms, now + session_timeout_ms / 1000)
            group.rebalance()
        else:
            member.session_timeout_ms = session_timeout_ms
            member.deadline = now + session_timeout_ms / 1000
        return self._membership(group, member_id)

    def heartbeat(self, key: GroupKey, member_id: str, generation: int) -> Membership:
        """Keep ``member_id`` alive; answer the current generation and its assignment.

        A heartbeat under an older generation is answered, not refused: it is how a live
        member learns that the group changed (it then adopts the new assignment).

        Raises:
            UnknownMember: Not a member (never joined, left, or its session expired): rejoin.
            StaleGeneration: ``generation`` is newer than the group's (not one it handed out).
        """
        group, member = self._member(key, member_id, generation)
        if generation > group.generation:
            raise StaleGeneration(
                f"generation {generation} was never handed out (group is at {group.generation})",
                generation=generation,
                current=group.generation,
            )
        member.deadline = self._clock() + member.session_timeout_ms / 1000
        return self._membership(group, member_id)

    def leave(self, key: GroupKey, member_id: str) -> bool:
        """Remove ``member_id`` (generation bumps); False if it was not a member."""
        group = self._expired(key)
        if group is None or group.members.pop(member_id, None) is None:
            return False
        # An emptied group stays (its generation too): a zombie's commit must meet a newer one.
        group.rebalance()
        return True

    def check_commit(
        self, key: GroupKey, member_id: str | None, generation: int | None, shards: list[int]
    ) -> None:
        """Whether a commit of ``shards`` may be stored; raises if not.

        Without ``member_id`` a commit is accepted only while the group has no members
        (manual assignment); otherwise only from a current-generation member for shards it owns.

        Raises:
            UnknownMember: Not a member, or no member id while the group has members.
            StaleGeneration: ``generation`` is not the group's current one.
            InvalidArgument: The member does not own one of ``shards``.
        """
        if member_id is None:
            group = self._expired(key)
            if group is not None and group.members:
                raise UnknownMember(
                    f"group {key[1]!r} has members: commit as a member (member_id and generation)",
                    generation=-1 if generation is None else generation,
                    current=group.generation,
                )
            return
        if generation is None:
            raise InvalidArgument("a member's commit needs its generation")
        group, _ = self._member(key, member_id, generation)
        if generation != group.generation:
            raise StaleGeneration(
                f"generation {generation} of group {key[1]!r} is over (now {group.generation}): "
                "the commit is refused",
                generation=generation,
                current=group.generation,
            )
        owned = set(group.assignment.get(member_id, ()))
        foreign = sorted(s for s in shards if s not in owned)
        if foreign:
            raise InvalidArgument(
                f"member {member_id} does not own shards {foreign} in generation {generation}"
            )

    def describe(self, key: GroupKey) -> dict[str, object]:
        """``{"generation", "members": {member_id: assignment}}`` (empty group: generation 0)."""
        group = self._expired(key)
        if group is None:
            return {"generation": 0, "members": {}}
        return {"generation": group.generation, "members": {m: list(a) for m, a in group.assignment.items()}}

    # --- expiry ------------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        """The earliest session deadline of any member (clock seconds), or None."""
        deadlines = [m.deadline for g in self._groups.values() for m in g.members.values()]
        return min(deadlines, default=None)

    def due(self) -> list[GroupKey]:
        """Groups with a member whose session has run out."""
        now = self._clock()
        return [k for k, g in self._groups.items() if any(m.deadline <= now for m in g.members.values())]

    def expire(self, key: GroupKey) -> list[str]:
        """Remove the members of ``key`` whose session ran out (one generation bump); their ids."""
        group = self._groups.get(key)
        if group is None:
            return []
        now = self._clock()
        gone = [m for m, member in group.members.items() if member.deadline <= now]
        if gone:
            for m in gone:
                del group.members[m]
            group.rebalance()
        return gone

    def forget_db(self, db: str) -> None:
        """Drop every group of a dropped database."""
        for key in [k for k in self._groups if k[0] == db]:
            del self._groups[key]

    # --- internals ---------------------------------------------------------------------

    def _group(self, key: GroupKey, shards: int) -> _Group:
        group = self._expired(key)
        if group is None:
            group = self._groups[key] = _Group(shards)
        elif group.shards != shards:
            # The database was dropped and recreated with another shard count.
            group.shards = shards
            group.rebalance()
        return group

    def _expired(self, key: GroupKey) -> _Group | None:
        self.expire(key)
        return self._groups.get(key)

    def _member(self, key: GroupKey, member_id: str, generation: int) -> tuple[_Group, _Member]:
        group = self._expired(key)
        member = None if group is None else group.members.get(member_id)
        if group is None or member is None:
            raise UnknownMember(
                f"member {member_id!r} is not in group {key[1]!r} (session expired, left, or the "
                "server restarted): rejoin",
                generation=generation,
                current=0 if group is None else group.generation,
            )
        return group, member

    @staticmethod
    def _membership(group: _Group, member_id: str) -> Membership:
        return Membership(
            member_id,
            group.generation,
            list(group.assignment.get(member_id, ())),
            group.members[member_id].session_timeout_ms,
        )


def _valid_member_id(member_id: object) -> bool:
    return (
        isinstance(member_id, str)
        and 0 < len(member_id) <= _MAX_MEMBER_ID_CHARS
        and member_id.isprintable()
        and member_id.strip() == member_id
    )
