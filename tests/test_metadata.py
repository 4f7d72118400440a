"""Cluster metadata in a real etcd: placement, node leases, shard CAS, controller fencing, ids."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any, TypeVar

import pytest

from seglog.cluster.etcd import EtcdClient, WatchEventType
from seglog.cluster.metadata import (
    NO_LEADER,
    ClusterMetadata,
    DbMeta,
    NodeInfo,
    NodeLease,
    ShardState,
    place_replicas,
)
from seglog.errors import (
    DatabaseExists,
    DatabaseNotFound,
    InvalidArgument,
    InvalidName,
    MetadataError,
    NodeIdInUse,
    StaleMetadata,
)
from tests.etcd_fixtures import EtcdProcess
from tests.helpers import foreign_server

T = TypeVar("T")
Run = Callable[[Coroutine[Any, Any, T]], T]
WAIT_S = 20.0


@pytest.mark.parametrize(("shards", "rf", "nodes"), [(12, 3, 3), (16, 3, 5), (7, 2, 4), (1, 1, 1)])
def test_placement_is_spread_and_leaders_balanced(shards: int, rf: int, nodes: int) -> None:
    ids = [10 * i + 1 for i in range(nodes)]
    placement = place_replicas(shards, rf, ids)
    assert len(placement) == shards
    assert all(len(set(r)) == rf and set(r) <= set(ids) for r in placement)
    leaders = Counter(r[0] for r in placement)
    holds = Counter(n for r in placement for n in r)
    assert max(leaders.values()) - min(leaders.get(n, 0) for n in ids) <= 1
    assert max(holds.values()) - min(holds.get(n, 0) for n in ids) <= 1


def test_placement_needs_enough_nodes() -> None:
    with pytest.raises(InvalidArgument, match="2 are registered"):
        place_replicas(4, 3, [1, 2])


def test_shard_state_invariants() -> None:
    ShardState((1, 2, 3), 1, 0, (1, 2)).validate()
    ShardState((1, 2, 3), NO_LEADER, 4, ()).validate()
    for bad in (
        ShardState((1, 2), 3, 0, (1, 2)),  # leader outside the isr
        ShardState((1, 2), 1, 0, (1, 4)),  # isr outside the replicas
        ShardState((1, 1), 1, 0, (1,)),  # duplicate replicas
    ):
        with pytest.raises(InvalidArgument):
            bad.validate()
    with pytest.raises(MetadataError):
        ShardState.from_json(
            b'{"replicas": [1], "leader": 2, "leader_epoch": 0, "isr": [1], "partition_epoch": 0}'
        )
    state = ShardState((1, 2), 2, 5, (2,), 9)
    assert ShardState.from_json(state.to_json()) == state


def test_nodes_register_under_leases(etcd: EtcdProcess, run: Run[None]) -> None:
    async def main() -> None:
        async with EtcdClient(etcd.url) as client:
            meta = ClusterMetadata(client, b"/c1/")
            one = await meta.register_node(NodeInfo(1, "http://127.0.0.1:7001"), ttl_s=30)
            await meta.register_node(NodeInfo(2, "http://127.0.0.1:7002"), ttl_s=1)
            assert sorted(await meta.live_nodes()) == [1, 2]
            with pytest.raises(NodeIdInUse):
                await meta.register_node(NodeInfo(1, "http://elsewhere"), ttl_s=30)
            assert (await meta.live_nodes())[1].url == "http://127.0.0.1:7001"
            # Node 2 never refreshes its lease: it disappears once the lease expires.
            _, revision = await client.get_prefix(b"/c1/nodes/")

            async def gone() -> None:
                async for events in client.watch_prefix(b"/c1/nodes/", start_revision=revision + 1):
                    if any(e.type is WatchEventType.DELETE and e.kv.key == b"/c1/nodes/2" for e in events):
                        return

            await asyncio.wait_for(gone(), WAIT_S)
            assert sorted(await meta.live_nodes()) == [1]
            # Leaving revokes the lease: the id is free again at once.
            await one.close()
            assert await meta.live_nodes() == {}
            again = await meta.register_node(NodeInfo(1, "http://127.0.0.1:7003"), ttl_s=30)
            await again.close()

    run(main())


def test_keepalive_outlives_the_ttl(etcd: EtcdProcess, run: Run[None]) -> None:
    async def main() -> None:
        async with EtcdClient(etcd.url) as client:
            meta = ClusterMetadata(client)
            node = await meta.register_node(NodeInfo(3, "http://n3"), ttl_s=1)
            node.start_keepalive()
            # Three TTLs pass (waiting on the loss event, which must not fire).
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(node.lost.wait(), 3.5)
            assert 3 in await meta.live_nodes()
            # Revoked behind its back: the keep-alive notices and reports the loss.
            await client.lease_revoke(node.lease)
            await asyncio.wait_for(node.lost.wait(), WAIT_S)
            await node.close(revoke=False)

    run(main())


async def _rides_out_a_short_outage(etcd: EtcdProcess, meta: ClusterMetadata, node: NodeLease) -> None:
    """Start ``node``'s keepalive, stop etcd for less than the lease, start it again: the lease
    is kept and refreshed once etcd answers."""
    node.start_keepalive()
    etcd.kill()
    # Failed refreshes (one every TTL/3) must not give the lease up before it expires.
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(node.lost.wait(), 2.5)
    assert node.unreachable_since is not None, "the keepalive stopped refreshing"
    etcd.start()
    deadline = time.monotonic() + WAIT_S
    while node.unreachable_since is not None:
        assert time.monotonic() < deadline, "the keepalive never reached etcd again"
        await asyncio.sleep(0.05)  # polling the keepalive's state with a deadline
    assert not node.lost.is_set()
    assert node.info.node_id in await meta.live_nodes()


def test_keepalive_rides_out_an_etcd_restart(etcd: EtcdProcess, run: Run[None]) -> None:
    """etcd down for less than the lease: the lease is kept; down for longer: lost at its TTL."""

    async def main() -> None:
        async with EtcdClient(etcd.url) as client:
            meta = ClusterMetadata(client)
            node = await meta.register_node(NodeInfo(4, "http://n4"), ttl_s=6)
            await _rides_out_a_short_outage(etcd, meta, node)
            # Down past the lease: the loss is reported once the TTL ran out by our clock.
            etcd.kill()
            down = time.monotonic()
            await asyncio.wait_for(node.lost.wait(), 6 + 2)
            assert time.monotonic() - down <= 6 + 0.5
            await node.close(revoke=False)

    run(main())


def test_keepalive_rides_out_an_etcd_restart_with_a_wrong_url_listed(
    etcd: EtcdProcess, run: Run[None]
) -> None:
    """``--etcd GOOD,WRONG`` where WRONG is some web page: while etcd is down each refresh
    falls through to that page. The keepalive must keep retrying (it used to end on the
    page's HTML, leaving the node registered in its own eyes and expired in etcd's)."""

    async def main() -> None:
        async with (
            foreign_server("html") as page,
            EtcdClient(f"{etcd.url},{page}", request_timeout_s=2) as client,
        ):
            meta = ClusterMetadata(client)
            node = await meta.register_node(NodeInfo(5, "http://n5"), ttl_s=6)
            await _rides_out_a_short_outage(etcd, meta, node)
            await node.close(revoke=False)

    run(main())


def test_a_campaign_finds_its_own_controller_key(etcd: EtcdProcess, run: Run[None]) -> None:
    """A controller whose loop restarts (an etcd error) gets its role back under the same lease."""

    async def main() -> None:
        async with EtcdClient(etcd.url) as client:
            meta = ClusterMetadata(client)
            lease1 = await client.lease_grant(30)
            lease2 = await client.lease_grant(30)
            first = await meta.campaign(1, lease1)
            assert first is not None
            assert await meta.campaign(1, lease1) == first
            assert await meta.campaign(2, lease2) is None

    run(main())


def test_databases(etcd: EtcdProcess, run: Run[None]) -> None:
    async def main() -> None:
        async with EtcdClient(etcd.url) as client:
            meta = ClusterMetadata(client)
            for n in (1, 2, 3):
                await meta.register_node(NodeInfo(n, f"http://n{n}"), ttl_s=30)
            states = await meta.create_db(DbMeta("telemetry", 300, 3, 2))
            assert len(states) == 300  # more shard keys than one etcd transaction takes
            stored = await meta.shards("telemetry")
            assert [stored[s][0] for s in range(300)] == states
            assert all(s.leader == s.replicas[0] and s.isr == s.replicas for s in states)
            assert await meta.get_db("telemetry") == DbMeta("telemetry", 300, 3, 2)
            with pytest.raises(DatabaseExists):
                await meta.create_db(DbMeta("telemetry", 1, 1, 1))
            with pytest.raises(InvalidArgument):
                await meta.create_db(DbMeta("big", 2, 4, 2))  # 4 replicas, 3 nodes
            with pytest.raises(InvalidArgument):
                await meta.create_db(DbMeta("bad", 2, 3, 4))  # min_insync > rf
            with pytest.raises(InvalidName):
                await meta.create_db(DbMeta("../x", 2, 3, 2))
            assert await meta.list_dbs() == ["telemetry"]
            await meta.drop_db("telemetry")
            assert await meta.list_dbs() == []
            assert await meta.shards("telemetry") == {}
            with pytest.raises(DatabaseNotFound):
                await meta.get_db("telemetry")
            with pytest.raises(DatabaseNotFound):
                await meta.drop_db("telemetry")

    run(main())


def test_a_snapshot_reads_everything_in_one_request(etcd: EtcdProcess, run: Run[None]) -> None:
    """Nodes, databases and shard states at one revision, in one range read however many
    databases exist (every metadata change makes each node and the controller take one);
    a database not whole yet is not listed, a key that does not parse is left out."""

    async def main() -> None:
        async with EtcdClient(etcd.url) as client:
            meta = ClusterMetadata(client, prefix=b"/snap/")
            for n in (1, 2, 3):
                await meta.register_node(NodeInfo(n, f"http://n{n}", unclean_restart=n == 3), ttl_s=30)
            for i in range(20):
                await meta.create_db(DbMeta(f"db{i:02d}", 4, 3, 2, unclean_election=i == 0))
            # A creator that died after the shard keys and before the database key.
            await client.put(b"/snap/shards/half/000000", ShardState((1, 2, 3), 1, 0, (1, 2, 3), 0).to_json())
            await client.put(b"/snap/dbs/broken", b"{not json")
            calls = 0
            real = client.get_prefix

            async def counting(prefix: bytes) -> Any:
                nonlocal calls
                calls += 1
                return await real(prefix)

            client.get_prefix = counting  # type: ignore[method-assign]
            snap = await meta.snapshot()
            assert calls == 1
            assert sorted(snap.nodes) == [1, 2, 3] and snap.nodes[3].unclean_restart
            assert sorted(snap.dbs) == [f"db{i:02d}" for i in range(20)]
            assert snap.dbs["db00"] == DbMeta("db00", 4, 3, 2, unclean_election=True)
            for i in range(20):
                assert snap.shards[f"db{i:02d}"] == await meta.shards(f"db{i:02d}")
            assert "half" not in snap.dbs and list(snap.shards["half"]) == [0]
            assert snap.revision >= max(r for states in snap.shards.values() for _, r in states.values())
            # The next snapshot parses only what changed: the same state objects for the others.
            state, revision = snap.shards["db01"][2]
            isr = tuple(r for r in state.isr if r == state.leader or r != state.isr[-1])
            await meta.update_shard("db01", 2, state, revision, state.with_isr(isr, 2))
            again = await meta.snapshot()
            assert again.shards["db01"][2][0].isr == isr != state.isr
            assert again.shards["db01"][1][0] is snap.shards["db01"][1][0]
            assert again.shards["db05"][0][0] is snap.shards["db05"][0][0]

    run(main())


def test_shard_updates_are_compare_and_swap(etcd: EtcdProcess, run: Run[None]) -> None:
    async def main() -> None:
        async with EtcdClient(etcd.url) as client:
            meta = ClusterMetadata(client)
            await meta.create_db(DbMeta("d", 1, 3, 2), nodes=[1, 2, 3])
            state, rev = await meta.shard("d", 0)
            assert state == ShardState((1, 2, 3), 1, 0, (1, 2, 3), 0)
            # Two deciders read the same state; the first write wins, the second is fenced.
            shrink = replace(state, isr=(1, 2))
            elect = replace(state, leader=2, leader_epoch=1, isr=(2, 3))
            await meta.update_shard("d", 0, state, rev, shrink)
            with pytest.raises(StaleMetadata):
                await meta.update_shard("d", 0, state, rev, elect)
            now, rev2 = await meta.shard("d", 0)
            assert now == ShardState((1, 2, 3), 1, 0, (1, 2), 1)
            with pytest.raises(InvalidArgument, match="bump leader_epoch"):
                await meta.update_shard("d", 0, now, rev2, replace(now, leader=2))
            with pytest.raises(InvalidArgument):
                await meta.update_shard("d", 0, now, rev2, replace(now, leader=3, leader_epoch=1))
            await meta.update_shard("d", 0, now, rev2, replace(now, leader=2, leader_epoch=1))
            final, rev3 = await meta.shard("d", 0)
            assert (final.leader, final.leader_epoch, final.partition_epoch) == (2, 1, 2)
            with pytest.raises(InvalidArgument, match="go back"):
                await meta.update_shard("d", 0, final, rev3, replace(final, leader_epoch=0))

    run(main())


def test_controller_election_and_fencing(etcd: EtcdProcess, run: Run[None]) -> None:
    async def main() -> None:
        async with EtcdClient(etcd.url) as client:
            meta = ClusterMetadata(client)
            await meta.create_db(DbMeta("d", 1, 2, 1), nodes=[1, 2])
            lease1 = await client.lease_grant(30)
            lease2 = await client.lease_grant(30)
            first = await meta.campaign(1, lease1)
            assert first is not None
            assert await meta.campaign(2, lease2) is None
            assert await meta.controller() == (1, first.epoch)
            state, rev = await meta.shard("d", 0)
            rev = await meta.update_shard("d", 0, state, rev, replace(state, isr=(1,)), controller=first)
            state, _ = await meta.shard("d", 0)
            # The controller's lease is gone (it was paused past its TTL): it is deposed and
            # its next write fails even though the shard did not change under it.
            await client.lease_revoke(lease1)
            second = await meta.campaign(2, lease2)
            assert second is not None and second.epoch > first.epoch
            with pytest.raises(StaleMetadata, match="deposed"):
                await meta.update_shard("d", 0, state, rev, replace(state, isr=(1, 2)), controller=first)
            await meta.update_shard("d", 0, state, rev, replace(state, isr=(1, 2)), controller=second)

    run(main())


def test_producer_ids_are_unique_under_contention(etcd: EtcdProcess, run: Run[None]) -> None:
    async def main() -> None:
        async with EtcdClient(etcd.url) as client:
            meta = ClusterMetadata(client)
            ids = await asyncio.gather(*(meta.allocate_producer_id() for _ in range(20)))
            assert sorted(ids) == list(range(20))

    run(main())
