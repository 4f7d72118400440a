"""The controller against a real etcd: failover elections, controller hand-over, last replica standing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest

from seglog.cluster.controller import Controller, decide
from seglog.cluster.etcd import EtcdClient
from seglog.cluster.metadata import NO_LEADER, ClusterMetadata, DbMeta, NodeInfo, NodeLease, ShardState
from tests.etcd_fixtures import EtcdProcess

T = TypeVar("T")
Run = Callable[[Coroutine[Any, Any, T]], T]
WAIT_S = 30.0
SAFE = DbMeta("safe", 6, 3, 2)
UNCLEAN = DbMeta("unclean", 3, 3, 2, unclean_election=True)


@pytest.mark.parametrize(
    ("state", "live", "unclean", "expected"),
    [
        # Everyone alive: nothing to do.
        (ShardState((1, 2, 3), 1, 0, (1, 2, 3)), {1, 2, 3}, False, None),
        # A follower dies: it leaves the ISR, the leader stays, same epoch.
        (ShardState((1, 2, 3), 1, 0, (1, 2, 3)), {1, 2}, False, ShardState((1, 2, 3), 1, 0, (1, 2))),
        # The leader dies: the first live ISR member in replica order leads, epoch + 1.
        (ShardState((1, 2, 3), 1, 4, (1, 2, 3)), {2, 3}, False, ShardState((1, 2, 3), 2, 5, (2, 3))),
        # A live replica outside the ISR is never elected (clean); the ISR falls below
        # min_insync, so the member leaving it becomes an eligible leader replica (KIP-966).
        (ShardState((1, 2, 3), 1, 4, (1, 3)), {2, 3}, False, ShardState((1, 2, 3), 3, 5, (3,), 0, (1,))),
        # An ELR member is elected when no ISR member is alive, ahead of out-of-sync ones.
        (ShardState((1, 2, 3), 1, 4, (1,), 0, (2,)), {2, 3}, False, ShardState((1, 2, 3), 2, 5, (2,))),
        # Last replica standing: the ISR keeps its last member, the shard is leaderless.
        (ShardState((1, 2, 3), 1, 4, (1,)), {2, 3}, False, ShardState((1, 2, 3), NO_LEADER, 5, (1,))),
        # ... and stays so while only out-of-sync replicas are back.
        (ShardState((1, 2, 3), NO_LEADER, 5, (1,)), {2, 3}, False, None),
        # ... until the last ISR member returns and leads again.
        (ShardState((1, 2, 3), NO_LEADER, 5, (1,)), {1, 2}, False, ShardState((1, 2, 3), 1, 6, (1,))),
        # Unclean election: the first live replica takes over as the whole ISR.
        (ShardState((1, 2, 3), 1, 4, (1,)), {2, 3}, True, ShardState((1, 2, 3), 2, 5, (2,))),
        (ShardState((1, 2, 3), NO_LEADER, 5, (1,)), {3}, True, ShardState((1, 2, 3), 3, 6, (3,))),
    ],
)
def test_decide(state: ShardState, live: set[int], unclean: bool, expected: ShardState | None) -> None:
    assert decide(DbMeta("d", 1, 3, 2, unclean_election=unclean), state, live) == expected


def test_an_unclean_restart_is_elected_last() -> None:
    """KIP-966: a replica whose machine restarted may lack its unsynced tail."""
    meta = DbMeta("d", 1, 3, 2)
    leaderless = ShardState((1, 2, 3), NO_LEADER, 5, (1,), 0, (2,))
    # The last ISR member is back but restarted uncleanly: the clean ELR member leads.
    assert decide(meta, leaderless, {1, 2}, {1}) == ShardState((1, 2, 3), 2, 6, (2,))
    # Cleanly back: the last ISR member leads, as before.
    assert decide(meta, leaderless, {1, 2}) == ShardState((1, 2, 3), 1, 6, (1,), 0, (2,))
    # No clean candidate at all: the unclean last member still beats staying down.
    alone = ShardState((1, 2, 3), NO_LEADER, 5, (1,))
    assert decide(meta, alone, {1}, {1}) == ShardState((1, 2, 3), 1, 6, (1,))
    # An ELR member that restarted uncleanly is not eligible.
    assert decide(meta, leaderless, {2}, {2}) is None


def test_the_elr_follows_the_isr() -> None:
    state = ShardState((1, 2, 3), 1, 0, (1, 2, 3))
    shrunk = state.with_isr((1, 2), 2)
    assert shrunk.elr == ()  # still at min_insync: the HW moves on without 3
    below = shrunk.with_isr((1,), 2)
    assert below.elr == (2,)  # left while the HW froze: holds everything below it
    assert below.with_isr((1, 3), 2).elr == ()  # back at min_insync: the HW moves again


async def _until(
    meta: ClusterMetadata, name: str, pred: Callable[[dict[int, ShardState]], bool]
) -> dict[int, ShardState]:
    """The database's shard states once ``pred`` holds, waiting on etcd watch events."""

    async def wait() -> dict[int, ShardState]:
        while True:
            _, revision = await meta.etcd.get_prefix(meta.prefix)
            states = {s: st for s, (st, _) in (await meta.shards(name)).items()}
            if pred(states):
                return states
            async for _ in meta.etcd.watch_prefix(meta.prefix, start_revision=revision + 1):
                break

    return await asyncio.wait_for(wait(), WAIT_S)


def test_failover_handover_and_last_replica_standing(etcd: EtcdProcess, run: Run[None]) -> None:
    async def main() -> None:
        async with EtcdClient(etcd.url) as client:
            meta = ClusterMetadata(client)
            nodes: dict[int, NodeLease] = {}
            for n in (1, 2, 3, 8, 9):
                nodes[n] = await meta.register_node(NodeInfo(n, f"http://n{n}"), ttl_s=60)
            await meta.create_db(SAFE, nodes=[1, 2, 3])
            await meta.create_db(UNCLEAN, nodes=[1, 2, 3])
            # Nodes 8 and 9 only run controllers: replica nodes can then all die.
            ctl = {n: Controller(meta, n, nodes[n].lease) for n in (8, 9)}
            for c in ctl.values():
                c.start()
            try:
                done, _ = await asyncio.wait(
                    [asyncio.create_task(c.active.wait()) for c in ctl.values()],
                    timeout=WAIT_S,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                assert done
                active = [n for n, c in ctl.items() if c.active.is_set()]
                assert len(active) == 1
                first = active[0]
                standby = 17 - first
                assert (await meta.controller() or (0, 0))[0] == first

                # Node 3 dies: it leaves every ISR, its shards get new leaders at epoch 1.
                await nodes[3].close()
                states = await _until(meta, "safe", lambda s: all(3 not in st.isr for st in s.values()))
                for st in states.values():
                    assert st.leader in (1, 2) and st.leader in st.isr
                    assert st.leader_epoch == (1 if st.replicas[0] == 3 else 0)

                # The controller's node dies: the standby takes over and keeps reconciling.
                await nodes[first].close()
                await asyncio.wait_for(ctl[standby].active.wait(), WAIT_S)
                await nodes[1].close()
                states = await _until(meta, "safe", lambda s: all(st.isr == (2,) for st in s.values()))
                assert all(st.leader == 2 for st in states.values())

                # The last ISR member dies: leaderless, but the ISR remembers it.
                await nodes[2].close()
                states = await _until(
                    meta, "safe", lambda s: all(st.leader == NO_LEADER for st in s.values())
                )
                assert all(st.isr == (2,) for st in states.values())
                # The unclean database has nobody alive to elect either.
                await _until(meta, "unclean", lambda s: all(st.leader == NO_LEADER for st in s.values()))

                # An out-of-sync replica returns: the clean database stays leaderless, the
                # unclean one elects it (and the ISR is just that replica).
                nodes[3] = await meta.register_node(NodeInfo(3, "http://n3"), ttl_s=60)
                states = await _until(meta, "unclean", lambda s: all(st.leader == 3 for st in s.values()))
                assert all(st.isr == (3,) for st in states.values())
                # Databases are reconciled in name order: "safe" was decided in the same pass.
                safe = {s: st for s, (st, _) in (await meta.shards("safe")).items()}
                assert all(st.leader == NO_LEADER for st in safe.values())

                # The last ISR member returns: it leads again with a new epoch.
                nodes[2] = await meta.register_node(NodeInfo(2, "http://n2"), ttl_s=60)
                states = await _until(meta, "safe", lambda s: all(st.leader == 2 for st in s.values()))
                assert all(st.leader_epoch > safe[s].leader_epoch for s, st in states.items())
            finally:
                for c in ctl.values():
                    await c.close()

    run(main())
