"""Leader-side ISR bookkeeping with an injected clock: caught-up rule, ISR changes, HW, acks."""

from __future__ import annotations

import asyncio

import pytest

from seglog.errors import (
    InvalidArgument,
    NotEnoughReplicas,
    NotEnoughReplicasAfterAppend,
    NotLeader,
    OffsetOutOfRange,
)
from seglog.isr import Acks, IsrChange, ShardLeaderState

LAG_MS = 10_000


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def leader(
    clock: Clock, *, isr: tuple[int, ...] = (1, 2, 3), min_insync: int = 2, end: int = 0
) -> ShardLeaderState:
    return ShardLeaderState(
        0,
        leader=1,
        leader_epoch=3,
        replicas=(1, 2, 3),
        isr=isr,
        min_insync=min_insync,
        epoch_start_offset=0,
        log_end=end,
        high_watermark=0,
        replica_lag_time_max_ms=LAG_MS,
        clock=clock,
    )


def test_acks_parsing() -> None:
    assert Acks.parse(1) is Acks.ONE
    assert Acks.parse("all") is Acks.ALL
    assert Acks.parse(-1) is Acks.ALL
    assert Acks.parse("QUORUM") is Acks.QUORUM
    with pytest.raises(InvalidArgument):
        Acks.parse(2)


def test_high_watermark_is_min_over_isr_and_only_rises() -> None:
    clock = Clock()
    state = leader(clock)
    state.on_leader_append(100)
    assert state.high_watermark == 0
    assert not state.on_fetch(2, 100)
    assert state.on_fetch(3, 60)
    assert state.high_watermark == 60
    # A follower that truncated and fetches from lower does not pull the HW back.
    state.on_fetch(3, 40)
    assert state.high_watermark == 60
    state.on_fetch(3, 100)
    assert state.high_watermark == 100
    with pytest.raises(OffsetOutOfRange):
        state.on_fetch(2, 101)
    with pytest.raises(InvalidArgument):
        state.on_fetch(9, 0)


def test_lagging_follower_leaves_and_rejoins() -> None:
    clock = Clock()
    state = leader(clock)
    state.on_leader_append(100)
    state.on_fetch(2, 100)
    state.on_fetch(3, 100)
    assert state.proposed_isr_change() is None
    # Follower 3 keeps fetching but never reaches the leader's moving end.
    for step in range(12):
        state.on_leader_append(200 + 100 * step)
        state.on_fetch(2, 200 + 100 * step)
        state.on_fetch(3, 150 + 10 * step)
        clock.advance(1)
    change = state.proposed_isr_change()
    assert change == IsrChange(frozenset(), frozenset({3}))
    state.begin_isr_change(change)
    assert state.proposed_isr_change() is None  # one change in flight at a time
    state.complete_isr_change(change.apply(state.isr))
    assert state.isr == (1, 2)
    # Without 3 the HW follows 2.
    assert state.high_watermark == 1300
    # 3 catches up to the HW: proposed for the ISR again, counted for the HW while in flight.
    state.on_fetch(3, 1300)
    change = state.proposed_isr_change()
    assert change == IsrChange(frozenset({3}), frozenset())
    state.begin_isr_change(change)
    assert state.maximal_isr == (1, 2, 3)
    state.on_leader_append(1400)
    state.on_fetch(2, 1400)
    assert state.high_watermark == 1300  # waits for 3, which is joining
    state.on_fetch(3, 1400)
    assert state.high_watermark == 1400
    state.complete_isr_change(change.apply(state.isr))
    assert state.isr == (1, 2, 3)


def test_caught_up_at_previous_fetch_counts() -> None:
    """A follower always one batch behind a busy leader stays in sync (Kafka's rule)."""
    clock = Clock()
    state = leader(clock)
    end = 0
    for _ in range(30):
        state.on_fetch(2, end)  # asks for exactly what the leader had at its previous fetch
        state.on_fetch(3, end)
        end += 50
        state.on_leader_append(end)
        clock.advance(1)
    assert state.proposed_isr_change() is None


def test_rejoin_needs_the_current_epoch_start() -> None:
    clock = Clock()
    state = ShardLeaderState(
        0,
        leader=1,
        leader_epoch=4,
        replicas=(1, 2, 3),
        isr=(1, 2),
        min_insync=2,
        epoch_start_offset=500,
        log_end=500,
        high_watermark=400,
        replica_lag_time_max_ms=LAG_MS,
        clock=clock,
    )
    state.on_fetch(3, 450)  # past the HW, before the epoch start
    state.on_fetch(2, 500)
    change = state.proposed_isr_change()
    assert change is None or 3 not in change.add
    state.on_fetch(3, 500)
    assert state.proposed_isr_change() == IsrChange(frozenset({3}), frozenset())


def test_strict_min_insync_freezes_the_high_watermark_and_refuses_acks_all() -> None:
    clock = Clock()
    state = leader(clock, isr=(1,), min_insync=2)
    with pytest.raises(NotEnoughReplicas):
        state.check_append(Acks.ALL)
    state.check_append(Acks.ONE)
    state.on_leader_append(10)
    assert state.high_watermark == 0  # the leader alone may not advance it (KIP-966)
    with pytest.raises(NotEnoughReplicas):
        state.check_append(Acks.QUORUM)


def test_waiters() -> None:
    async def main() -> None:
        clock = Clock()
        state = leader(clock)
        state.check_append(Acks.ALL)
        state.on_leader_append(10)
        await state.wait_replicated(10, Acks.ONE, 1)
        all_task = asyncio.create_task(state.wait_replicated(10, Acks.ALL, 30))
        quorum_task = asyncio.create_task(state.wait_replicated(10, Acks.QUORUM, 30))
        await asyncio.sleep(0)
        assert not all_task.done() and not quorum_task.done()
        state.on_fetch(2, 10)
        await asyncio.wait_for(quorum_task, 5)  # leader + 2 of 3
        await asyncio.sleep(0)
        assert not all_task.done()
        state.on_fetch(3, 10)
        await asyncio.wait_for(all_task, 5)
        # The ISR shrinks under a waiter: written, not acknowledged.
        state.on_leader_append(20)
        waiter = asyncio.create_task(state.wait_replicated(20, Acks.ALL, 30))
        await asyncio.sleep(0)
        state.complete_isr_change((1,))
        with pytest.raises(NotEnoughReplicasAfterAppend):
            await asyncio.wait_for(waiter, 5)
        # A deposed leader fails its waiters and refuses appends.
        state.complete_isr_change((1, 2, 3))
        waiter = asyncio.create_task(state.wait_replicated(20, Acks.ALL, 30))
        await asyncio.sleep(0)
        state.resign(2, 4)
        with pytest.raises(NotLeader) as err:
            await asyncio.wait_for(waiter, 5)
        assert (err.value.leader, err.value.leader_epoch) == (2, 4)
        with pytest.raises(NotLeader):
            state.check_append(Acks.ONE)
        # Timeout: written, not replicated in time.
        fresh = leader(clock)
        fresh.on_leader_append(5)
        with pytest.raises(NotEnoughReplicasAfterAppend, match="within"):
            await fresh.wait_replicated(5, Acks.ALL, 0.05)

    asyncio.run(main())


def test_expansion_is_due_on_the_fetch_that_reaches_the_high_watermark() -> None:
    """The node proposes an addition right after such a fetch, not at the periodic check."""
    clock = Clock()
    state = leader(clock, isr=(1, 2))
    state.on_leader_append(100)
    state.on_fetch(2, 100)
    assert state.high_watermark == 100
    state.on_fetch(3, 60)
    assert not state.expansion_due(3)  # below the HW
    assert not state.expansion_due(2)  # already in the ISR
    assert not state.expansion_due(9)  # not a follower
    state.on_fetch(3, 100)
    assert state.expansion_due(3)
    change = state.proposed_isr_change()
    assert change == IsrChange(frozenset({3}), frozenset())
    state.begin_isr_change(change)
    assert not state.expansion_due(3)  # one change in flight at a time
    state.on_leader_append(150)
    state.on_fetch(2, 150)
    assert state.high_watermark == 100  # the joining member counts: never pulled back, not ahead
    state.complete_isr_change(change.apply(state.isr))
    assert not state.expansion_due(3)
    state.on_fetch(3, 150)
    assert state.high_watermark == 150
