"""A 3-node cluster on real processes and a real etcd: replication, acks, failover, rejoin."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pyarrow as pa
import pytest

from seglog.client._http import NodeSession
from seglog.cluster import protocol
from seglog.errors import (
    DatabaseNotFound,
    NotEnoughReplicas,
    NotEnoughReplicasAfterAppend,
    NotLeader,
    SeglogError,
)
from seglog.record import decode_frames
from tests.etcd_fixtures import EtcdProcess
from tests.server_fixtures import ServerFactory, ServerProcess

T = TypeVar("T")
Run = Callable[[Coroutine[Any, Any, T]], T]
DB = "telemetry"
TS0 = 1_700_000_000_000_000
WAIT_S = 60.0
POLL_S = 0.05


async def until(check: Callable[[], Awaitable[T | None]], what: str, timeout_s: float = WAIT_S) -> T:
    """Poll a remote condition until it holds (a deadline, not a fixed sleep)."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            value = await check()
            if value is not None and value is not False:
                return value
        except SeglogError as exc:
            last = exc
        await asyncio.sleep(POLL_S)
    raise AssertionError(f"timed out waiting for {what} (last error: {last!r})")


def start_cluster(
    server_factory: ServerFactory,
    etcd: EtcdProcess,
    n: int = 3,
    *,
    ttl_s: int = 2,
    extra: tuple[str, ...] = (),
) -> dict[int, ServerProcess]:
    return {
        i: server_factory(
            "--etcd",
            etcd.url,
            "--node-id",
            str(i),
            "--node-ttl-s",
            str(ttl_s),
            "--replica-lag-time-max-ms",
            "1500",
            "--log-level",
            "info",
            *extra,
        )
        for i in range(1, n + 1)
    }


async def cluster_view(session: NodeSession) -> dict[str, Any]:
    reply = await session.request("GET", "/v1/cluster")
    view: dict[str, Any] = reply.json()
    return view


async def create_replicated(
    session: NodeSession, shards: int, rf: int, min_insync: int, **extra: Any
) -> None:
    """Create the test database on the cluster (``extra``: more create settings)."""
    body = {"name": DB, "shards": shards, "replication_factor": rf, "min_insync": min_insync, **extra}
    await session.request("POST", "/v1/dbs", json_body=body)


async def all_led(session: NodeSession) -> dict[str, Any] | None:
    """The node's cluster view once every shard of the test database has a leader, else None."""
    view = await cluster_view(session)
    ok = DB in view["dbs"] and all(s["leader"] > 0 for s in view["dbs"][DB]["state"])
    return view if ok else None


async def leading_node(sessions: dict[int, NodeSession], among: list[int]) -> int | None:
    """The node among ``among`` that leads shard 0 of the test database by its own account."""
    for i in among:
        view = await cluster_view(sessions[i])
        if any(p["db"] == DB for p in view["leading"]):
            return i
    return None


async def produce(session: NodeSession, shard: int, values: list[str], acks: str = "all") -> dict[str, Any]:
    body = "".join(json.dumps({"topic": "dev/1", "value": v}) + "\n" for v in values).encode()
    reply = await session.request(
        "POST",
        f"/v1/dbs/{DB}/records",
        params={"shard": shard, "acks": acks},
        data=body,
        content_type=protocol.NDJSON,
    )
    out: dict[str, Any] = reply.json()
    return out


async def produce_idempotent(
    session: NodeSession, shard: int, values: list[str], producer_id: int, seq: int, acks: str = "all"
) -> dict[str, Any]:
    """``produce`` as an idempotent producer: records numbered from ``seq`` (an Arrow body)."""
    table = pa.table(
        {
            "ts": pa.array([TS0] * len(values), pa.int64()),
            "topic": ["dev/1"] * len(values),
            "value": [v.encode() for v in values],
        }
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    reply = await session.request(
        "POST",
        f"/v1/dbs/{DB}/records",
        params={"shard": shard, "acks": acks, "producer_id": producer_id, "producer_epoch": 0, "seqs": seq},
        data=sink.getvalue().to_pybytes(),
        content_type=protocol.ARROW_STREAM,
    )
    out: dict[str, Any] = reply.json()
    return out


async def producer_id(session: NodeSession) -> int:
    """A producer id allocated by the cluster (etcd) through any node."""
    return int((await session.request("POST", f"/v1/dbs/{DB}/producer-id")).json()["producer_id"])


async def read_all(session: NodeSession, shard: int, start: int = 0) -> tuple[list[tuple[int, bytes]], int]:
    """Every record from ``start`` below the node's high watermark: (offset, value), and that watermark."""
    out: list[tuple[int, bytes]] = []
    offset = start
    while True:
        reply = await session.request(
            "GET", f"/v1/dbs/{DB}/shards/{shard}/frames", params={"offset": offset, "max_bytes": 1 << 20}
        )
        hw = int(reply.headers[protocol.HEADER_HIGH_WATERMARK])
        if not reply.body:
            return out, hw
        if reply.headers.get("Content-Type", "").startswith(protocol.ARROW_STREAM):
            table = pa.ipc.open_stream(reply.body).read_all()  # tiered rows, below the local start
        else:
            table = decode_frames(reply.body, offset, hw)
        for o, v in zip(table.column("offset").to_pylist(), table.column("value").to_pylist(), strict=True):
            out.append((o, v))
        if not len(table):
            return out, hw
        offset = out[-1][0] + 1


def test_replication_failover_and_rejoin(
    server_factory: ServerFactory, etcd: EtcdProcess, run: Run[None]
) -> None:
    nodes = start_cluster(server_factory, etcd)

    async def main() -> None:
        sessions = {i: NodeSession(p.url) for i, p in nodes.items()}
        try:
            await create_replicated(sessions[1], 2, 3, 2)

            async def leader_of(shard: int, among: list[int]) -> tuple[int, int] | None:
                for i in among:
                    view = await cluster_view(sessions[i])
                    if DB not in view["dbs"]:
                        return None
                    state = view["dbs"][DB]["state"][shard]
                    if state["leader"] in among:
                        lead_view = await cluster_view(sessions[state["leader"]])
                        if any(p["db"] == DB and p["shard"] == shard for p in lead_view["leading"]):
                            return int(state["leader"]), int(state["leader_epoch"])
                return None

            leader, epoch = await until(lambda: leader_of(0, [1, 2, 3]), "a leader of shard 0")
            acked: list[str] = []
            for b in range(20):
                values = [f"a{b}-{i}" for i in range(50)]
                reply = await produce(sessions[leader], 0, values)
                assert reply["parts"] == [{"shard": 0, "base_offset": b * 50, "count": 50}]
                acked.extend(values)
            # acks=all: every ISR member already holds them; all three serve them below the HW.
            for i in (1, 2, 3):
                records, _ = await until(
                    lambda i=i: _when_hw(sessions[i], 0, 1000), f"node {i} to reach the high watermark"
                )
                assert [v.decode() for _, v in records] == acked, i
            # A produce to a follower is refused with the leader's id.
            follower = next(i for i in (1, 2, 3) if i != leader)
            with pytest.raises(NotLeader) as err:
                await produce(sessions[follower], 0, ["nope"])
            assert err.value.leader == leader

            # The leader crashes: a new leader from the ISR, a higher epoch, nothing acked lost.
            nodes[leader].kill()
            await sessions[leader].close()
            alive = [i for i in (1, 2, 3) if i != leader]
            new_leader, new_epoch = await until(
                lambda: _new_leader(leader_of, alive, epoch), "a new leader of shard 0"
            )
            assert new_leader in alive and new_epoch > epoch
            more = [f"b{i}" for i in range(100)]
            await until(lambda: _produce_ok(sessions[new_leader], more), "a produce to the new leader")
            acked.extend(more)

            # The old leader restarts: it follows, truncates by epoch, catches up and rejoins.
            nodes[leader].restart()
            sessions[leader] = NodeSession(nodes[leader].url)

            async def rejoined() -> bool:
                view = await cluster_view(sessions[new_leader])
                return len(view["dbs"][DB]["state"][0]["isr"]) == 3

            await until(rejoined, "the restarted node back in the ISR")
            for i in (1, 2, 3):
                records, _ = await until(
                    lambda i=i: _when_hw(sessions[i], 0, len(acked)), f"node {i} caught up"
                )
                values = [v.decode() for _, v in records]
                assert values == acked, i  # no acked write lost, none duplicated, same order
                assert [o for o, _ in records] == list(range(len(acked)))
        finally:
            for s in sessions.values():
                await s.close()

    run(main())


async def _when_hw(session: NodeSession, shard: int, hw: int) -> tuple[list[tuple[int, bytes]], int] | None:
    records, got = await read_all(session, shard)
    return (records, got) if got >= hw else None


async def _new_leader(
    leader_of: Callable[[int, list[int]], Awaitable[tuple[int, int] | None]], alive: list[int], old_epoch: int
) -> tuple[int, int] | None:
    found = await leader_of(0, alive)
    return found if found is not None and found[1] > old_epoch else None


async def _produce_ok(session: NodeSession, values: list[str]) -> bool:
    try:
        await produce(session, 0, values)
    except (NotLeader, NotEnoughReplicas):
        return False
    return True


def test_acks_all_refused_below_min_insync(
    server_factory: ServerFactory, etcd: EtcdProcess, run: Run[None]
) -> None:
    nodes = start_cluster(server_factory, etcd, 2)

    async def main() -> None:
        sessions = {i: NodeSession(p.url) for i, p in nodes.items()}
        try:
            await create_replicated(sessions[1], 1, 2, 2)

            lead = await until(lambda: leading_node(sessions, list((1, 2))), "a leader")
            await until(lambda: _produce_ok(sessions[lead], ["x"]), "a first acks=all produce")
            other = 3 - lead
            nodes[other].kill()

            async def isr_of_one() -> bool:
                view = await cluster_view(sessions[lead])
                return view["dbs"][DB]["state"][0]["isr"] == [lead]

            await until(isr_of_one, "the dead follower out of the ISR")
            before, hw_before = await read_all(sessions[lead], 0)
            with pytest.raises(NotEnoughReplicas):
                await produce(sessions[lead], 0, ["refused"])
            # acks=1 is written, but the high watermark stays (strict min ISR): nobody sees it.
            await produce(sessions[lead], 0, ["local-only"], acks="1")
            after, hw_after = await read_all(sessions[lead], 0)
            assert (after, hw_after) == (before, hw_before)
            # The follower returns: it catches up, rejoins, and the acks=1 record becomes visible.
            nodes[other].restart()
            records, _ = await until(
                lambda: _when_hw(sessions[lead], 0, hw_before + 1), "the HW to move again"
            )
            assert [v for _, v in records] == [b"x", b"local-only"]
        finally:
            for s in sessions.values():
                await s.close()

    run(main())


def test_a_deposed_leaders_unreplicated_tail_is_truncated(
    server_factory: ServerFactory, etcd: EtcdProcess, run: Run[None]
) -> None:
    """KIP-101 on processes: a tail only the old leader had is cut when it rejoins.

    With ``min_insync=1`` and unclean election enabled (both opt-in), the leader alone
    acknowledges a tail, dies, and an out-of-sync replica is elected: the tail is lost (what
    those settings trade) and must also vanish from the old leader's own log.
    """
    nodes = start_cluster(server_factory, etcd)

    async def main() -> None:
        sessions = {i: NodeSession(p.url) for i, p in nodes.items()}
        try:
            await create_replicated(sessions[1], 1, 3, 1, unclean_election=True)

            async def leader(among: list[int], above: int = -1) -> tuple[int, int] | None:
                for i in among:
                    view = await cluster_view(sessions[i])
                    state = view["dbs"].get(DB, {}).get("state", [{}])[0]
                    leads = any(p["db"] == DB for p in view["leading"])
                    if leads and state.get("leader") == i and state["leader_epoch"] > above:
                        return i, int(state["leader_epoch"])
                return None

            old, epoch = await until(lambda: leader([1, 2, 3]), "a leader")
            shared = [f"a{i}" for i in range(10)]
            await until(lambda: _produce_ok(sessions[old], shared), "acks=all produce")
            followers = [i for i in (1, 2, 3) if i != old]
            for i in followers:
                nodes[i].kill()
                await sessions[i].close()

            async def alone() -> bool:
                view = await cluster_view(sessions[old])
                return view["dbs"][DB]["state"][0]["isr"] == [old]

            await until(alone, "the ISR down to the leader")
            await produce(sessions[old], 0, [f"stale{i}" for i in range(5)])  # acks=all, ISR of one
            nodes[old].kill()
            await sessions[old].close()
            for i in followers:
                nodes[i].restart()
                sessions[i] = NodeSession(nodes[i].url)
            new, _ = await until(lambda: leader(followers, epoch), "an unclean leader")
            fresh = [f"b{i}" for i in range(7)]
            await until(lambda: _produce_ok(sessions[new], fresh), "a produce to the new leader")
            nodes[old].restart()
            sessions[old] = NodeSession(nodes[old].url)
            expected = shared + fresh
            for i in (1, 2, 3):
                records, _ = await until(lambda i=i: _when_hw(sessions[i], 0, len(expected)), f"node {i}")
                assert [v.decode() for _, v in records] == expected, i
            # The stale tail is gone from the old leader's log itself, not only hidden by the HW.
            described = await sessions[old].request("GET", f"/v1/dbs/{DB}")
            assert described.json()["offsets"][0]["end"] == len(expected)
        finally:
            for s in sessions.values():
                await s.close()

    run(main())


def test_clients_find_leaders_from_any_node(
    server_factory: ServerFactory, etcd: EtcdProcess, run: Run[None]
) -> None:
    from seglog.client._metadata import LeaderCache

    nodes = start_cluster(server_factory, etcd)

    async def main() -> None:
        cache = LeaderCache([nodes[2].url, "http://127.0.0.1:9"])
        try:
            admin = cache.session(nodes[1].url)
            await create_replicated(admin, 3, 2, 1)

            async def all_led() -> bool:
                view = await cache.refresh(force=True)
                return DB in view.leaders and all(leader > 0 for leader, _ in view.leaders[DB])

            await until(all_led, "leaders for every shard")
            urls = {i: p.url for i, p in nodes.items()}
            for shard in range(3):
                url = await cache.leader_url(DB, shard)
                leader = next(i for i, u in urls.items() if u == url)
                assert cache.view.leaders[DB][shard][0] == leader
                await until(
                    lambda url=url, shard=shard: _produce_shard_ok(cache, url, shard), f"produce {shard}"
                )
            with pytest.raises(DatabaseNotFound):
                await cache.leader_url("nope", 0)
            # The leader of shard 0 dies: after a refresh the cache names a live node.
            first = await cache.leader_url(DB, 0)
            dead = next(i for i, u in urls.items() if u == first)
            nodes[dead].kill()

            async def moved() -> str | None:
                await cache.refresh(force=True)
                url = await cache.leader_url(DB, 0)
                return url if url != urls[dead] else None

            url = await until(moved, "shard 0 to move")
            await until(lambda: _produce_shard_ok(cache, url, 0), "a produce to the new leader")
        finally:
            await cache.close()

    run(main())


async def _produce_shard_ok(cache: Any, url: str, shard: int) -> bool:
    body = (json.dumps({"topic": "t", "value": "x"}) + "\n").encode()
    try:
        await cache.session(url).request(
            "POST", f"/v1/dbs/{DB}/records", params={"shard": shard}, data=body, content_type=protocol.NDJSON
        )
    except (NotLeader, NotEnoughReplicas):
        return False
    return True


@contextlib.contextmanager
def _proxied_cluster(
    server_factory: ServerFactory, etcd: EtcdProcess
) -> Iterator[tuple[dict[int, ServerProcess], dict[int, Any]]]:
    """Three nodes that reach each other only through a fault proxy each (peers use the
    advertised proxy URL; tests talk to the nodes directly)."""
    from tests.fault_proxy import FaultProxy

    proxies = {i: FaultProxy() for i in (1, 2, 3)}
    try:
        nodes = {
            i: server_factory(
                "--etcd",
                etcd.url,
                "--node-id",
                str(i),
                "--node-ttl-s",
                "2",
                "--replica-lag-time-max-ms",
                "1500",
                "--advertise",
                proxies[i].url,  # peers reach each node only through its proxy
            )
            for i in (1, 2, 3)
        }
        for i, proxy in proxies.items():
            proxy.set_target(nodes[i].url)
        yield nodes, proxies
    finally:
        for proxy in proxies.values():
            proxy.close()


async def _isr_is(session: NodeSession, isr: list[int]) -> bool:
    view = await cluster_view(session)
    return sorted(view["dbs"][DB]["state"][0]["isr"]) == isr


def test_a_leader_cut_off_from_its_followers_acknowledges_nothing(
    server_factory: ServerFactory, etcd: EtcdProcess, run: Run[None]
) -> None:
    """The leader keeps its etcd lease and its producer but loses its followers (a partition)."""
    with _proxied_cluster(server_factory, etcd) as (nodes, proxies):

        async def main() -> None:
            sessions = {i: NodeSession(p.url) for i, p in nodes.items()}
            try:
                await create_replicated(sessions[1], 1, 3, 2)

                lead = await until(lambda: leading_node(sessions, list((1, 2, 3))), "a leader")
                before = [f"a{i}" for i in range(20)]
                await until(lambda: _produce_ok(sessions[lead], before), "acks=all before the cut")
                proxies[lead].cut()
                await until(
                    lambda: _isr_is(sessions[lead], [lead]), "the followers dropped from the leader's ISR"
                )
                # The producer still reaches the leader, which acknowledges nothing.
                with pytest.raises(NotEnoughReplicas):
                    await produce(sessions[lead], 0, ["during"])
                proxies[lead].heal()
                await until(lambda: _isr_is(sessions[lead], [1, 2, 3]), "the followers back in the ISR")
                after = [f"b{i}" for i in range(5)]
                await until(lambda: _produce_ok(sessions[lead], after), "acks=all after healing")
                for i in (1, 2, 3):
                    records, _ = await until(
                        lambda i=i: _when_hw(sessions[i], 0, len(before) + len(after)), f"node {i}"
                    )
                    assert [v.decode() for _, v in records] == before + after, i
            finally:
                for s in sessions.values():
                    await s.close()

        run(main())


def test_a_batch_written_then_not_replicated_is_retried_without_a_duplicate(
    server_factory: ServerFactory, etcd: EtcdProcess, run: Run[None]
) -> None:
    """Kafka's ambiguous ``NOT_ENOUGH_REPLICAS_AFTER_APPEND``: the leader wrote the batch, lost
    its followers before they had it, and answered an error. Healed, the batch replicates; the
    idempotent producer's retry gets the batch's first offset instead of a second copy."""
    with _proxied_cluster(server_factory, etcd) as (nodes, proxies):

        async def main() -> None:
            sessions = {i: NodeSession(p.url) for i, p in nodes.items()}
            try:
                await create_replicated(sessions[1], 1, 3, 2)
                lead = await until(lambda: leading_node(sessions, list((1, 2, 3))), "a leader")
                pid = await producer_id(sessions[lead])
                before = [f"a{i}" for i in range(20)]
                await until(lambda: _produce_idempotent_ok(sessions[lead], before, pid, 0), "acks=all")
                proxies[lead].cut()
                with pytest.raises(NotEnoughReplicas) as info:
                    await produce_idempotent(sessions[lead], 0, ["x0", "x1"], pid, 20)
                # Written, not refused: the leader holds it and will replicate it when healed.
                assert isinstance(info.value, NotEnoughReplicasAfterAppend), info.value
                proxies[lead].heal()
                await until(lambda: _isr_is(sessions[lead], [1, 2, 3]), "the followers back in the ISR")
                reply = await until(
                    lambda: _produce_idempotent_ok(sessions[lead], ["x0", "x1"], pid, 20), "the retry"
                )
                assert reply["parts"] == [{"shard": 0, "base_offset": 20, "count": 2}]
                for i in (1, 2, 3):
                    records, _ = await until(lambda i=i: _when_hw(sessions[i], 0, 22), f"node {i}")
                    assert [v.decode() for _, v in records] == [*before, "x0", "x1"], i
            finally:
                for s in sessions.values():
                    await s.close()

        run(main())


async def _produce_idempotent_ok(
    session: NodeSession, values: list[str], pid: int, seq: int
) -> dict[str, Any] | None:
    try:
        return await produce_idempotent(session, 0, values, pid, seq)
    except (NotLeader, NotEnoughReplicas):
        return None


def test_producer_follows_leaders_through_a_failover(
    server_factory: ServerFactory, etcd: EtcdProcess, run: Run[None]
) -> None:
    """``Producer(bootstrap=...)`` routes each shard to its leader and re-routes after a kill."""
    from seglog.client import Producer

    nodes = start_cluster(server_factory, etcd)

    async def main() -> None:
        admin = NodeSession(nodes[1].url)
        urls = [p.url for p in nodes.values()]
        try:
            await create_replicated(admin, 6, 3, 2)  # two shards per leader: grouped requests

            async def led() -> bool:
                view = await cluster_view(admin)
                return DB in view["dbs"] and all(s["leader"] > 0 for s in view["dbs"][DB]["state"])

            await until(led, "leaders")
            sent: list[bytes] = []
            async with Producer(urls[0], DB, bootstrap=urls[1:], acks="all", retries=None) as producer:
                first = [await producer.send("t", b"a%d" % i, key=b"k%d" % i) for i in range(200)]
                metas = [await f for f in first]
                sent += [b"a%d" % i for i in range(200)]
                assert {m.shard for m in metas} == set(range(6))
                view = await cluster_view(admin)
                victim = int(view["dbs"][DB]["state"][0]["leader"])
                nodes[victim].kill()
                second = [await producer.send("t", b"b%d" % i, key=b"k%d" % i) for i in range(200)]
                await asyncio.wait_for(asyncio.gather(*second), WAIT_S)
                sent += [b"b%d" % i for i in range(200)]
            alive = next(i for i in nodes if i != victim)
            session = NodeSession(nodes[alive].url)
            try:
                got: list[bytes] = []
                for shard in range(6):
                    total = sum(1 for m in metas if m.shard == shard) * 2
                    records, _ = await until(
                        lambda shard=shard, total=total: _when_hw(session, shard, total), "HW"
                    )
                    got += [v for _, v in records]
                assert sorted(got) == sorted(sent)  # every acknowledged record, once
            finally:
                await session.close()
        finally:
            await admin.close()

    run(main())


def test_a_node_without_the_database_answers_not_leader_and_the_producer_moves_on(
    server_factory: ServerFactory, etcd: EtcdProcess, run: Run[None]
) -> None:
    """A node that holds no replica of a cluster database (or has not applied its creation
    yet, the window a controller's election opens) answers the retriable ``NotLeader``, not
    ``DatabaseNotFound``: a producer routed there asks the metadata again and succeeds."""
    from seglog.client import Producer

    nodes = start_cluster(server_factory, etcd)

    async def main() -> None:
        admin = NodeSession(nodes[1].url)
        try:
            await create_replicated(admin, 1, 2, 1)

            async def placed() -> dict[str, Any] | None:
                view = await cluster_view(admin)
                if DB not in view["dbs"] or view["dbs"][DB]["state"][0]["leader"] <= 0:
                    return None
                state: dict[str, Any] = view["dbs"][DB]["state"][0]
                return state

            state = await until(placed, "a leader")
            outsider = next(i for i in nodes if i not in state["replicas"])
            session = NodeSession(nodes[outsider].url)
            try:
                with pytest.raises(NotLeader):
                    await produce(session, 0, ["x"])
                with pytest.raises(DatabaseNotFound):  # a database the cluster lacks is still absent
                    await session.request("GET", "/v1/dbs/nosuch")
            finally:
                await session.close()
            others = [nodes[i].url for i in nodes if i != outsider]
            async with Producer(nodes[outsider].url, DB, bootstrap=others, acks="all") as producer:
                meta = await producer.send_and_wait("t", b"v", key=b"k")
            assert (meta.shard, meta.offset) == (0, 0)
        finally:
            await admin.close()

    run(main())


def test_consumer_follows_leaders_through_a_failover(
    server_factory: ServerFactory, etcd: EtcdProcess, run: Run[None]
) -> None:
    """``Consumer(url, bootstrap=...)`` reads each shard from its leader and keeps reading after
    the node at ``url`` (shard 0's leader) is killed: every acknowledged record, once, in order."""
    from seglog.client import Consumer, Producer
    from seglog.cluster import fetch_wire

    nodes = start_cluster(server_factory, etcd)

    async def main() -> None:
        admin = NodeSession(nodes[1].url)
        try:
            await create_replicated(admin, 2, 3, 2)

            view = await until(lambda: all_led(admin), "leaders")
            victim = int(view["dbs"][DB]["state"][0]["leader"])
            others = [p.url for i, p in nodes.items() if i != victim]
            # A node that does not lead a shard refuses it to a leader-only fetch, naming the leader.
            follower = NodeSession(others[0])
            try:
                asked = fetch_wire.ShardsRequest({0: 0}, 0, 1 << 20, leader_only=True)

                async def refused() -> fetch_wire.FetchPart:
                    # Retried (until) while the follower has not created its copy yet.
                    reply = await follower.request(
                        "POST",
                        f"/v1/dbs/{DB}/fetch",
                        data=fetch_wire.encode_shards_request(asked),
                        content_type=protocol.JSON,
                    )
                    (part,) = fetch_wire.decode_reply(reply.body)
                    return part

                part = await until(refused, "the follower's copy")
                assert isinstance(part.error, NotLeader) and part.error.leader == victim
            finally:
                await follower.close()
            sent: dict[int, list[bytes]] = {0: [], 1: []}
            got: dict[int, list[tuple[int, bytes]]] = {0: [], 1: []}

            async def drain(consumer: Consumer, want: int) -> None:
                while sum(len(v) for v in got.values()) < want:
                    for shard, records in (await consumer.getmany(timeout_ms=int(WAIT_S * 1000))).items():
                        got[shard] += [(r.offset or 0, r.value) for r in records]

            async with (
                Producer(others[0], DB, bootstrap=others[1:], acks="all", retries=None) as producer,
                Consumer(nodes[victim].url, DB, bootstrap=others, max_wait_ms=1000) as consumer,
            ):
                for wave in (b"a", b"b"):
                    futs = [await producer.send("t", wave + b"%d" % i, key=b"k%d" % i) for i in range(200)]
                    for i, meta in enumerate(await asyncio.wait_for(asyncio.gather(*futs), WAIT_S)):
                        sent[meta.shard].append(wave + b"%d" % i)
                    await asyncio.wait_for(drain(consumer, sum(len(v) for v in sent.values())), WAIT_S)
                    if wave == b"a":
                        await _check_admin_describe(others[0], victim)
                        nodes[victim].kill()  # the consumer's url, and shard 0's leader
            for shard in (0, 1):
                offsets = [o for o, _ in got[shard]]
                assert offsets == list(range(len(offsets)))  # in order, no gap, no repeat
                assert [v for _, v in got[shard]] == sent[shard]
        finally:
            await admin.close()

    run(main())


async def _check_admin_describe(url: str, leader0: int) -> None:
    """``seglog admin describe`` on any node shows every shard as its leader sees it."""
    import subprocess
    import sys
    from pathlib import Path

    cmd = [str(Path(sys.executable).parent / "seglog"), "admin", "--url", url, "describe", DB]
    done = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, timeout=WAIT_S)
    assert done.returncode == 0, done.stderr.decode()
    desc = json.loads(done.stdout)
    assert desc["replicated"] is True
    shards = {s["shard"]: s for s in desc["replication"]}
    assert sorted(shards) == [0, 1] and shards[0]["leader"] == leader0
    for entry in shards.values():
        assert entry["led_here"] is True  # gathered from the leader, whichever node --url named
        report = entry["replica_state"]
        assert report[0]["node"] == entry["leader"] and report[0]["lag"] == 0
        assert sorted(r["node"] for r in report) == sorted(entry["replicas"])
        assert all(isinstance(r["lag"], int) and r["lag"] >= 0 for r in report)
        assert entry["high_watermark"] <= report[0]["log_end"]


def test_many_shards_in_one_produce_to_their_leader(
    server_factory: ServerFactory, etcd: EtcdProcess, run: Run[None]
) -> None:
    """``?shards=`` on a replicated database: accepted when this node leads every shard named
    (each acknowledged per acks), refused with ``NotLeader`` and nothing written otherwise."""
    import pyarrow as pa

    nodes = start_cluster(server_factory, etcd)

    def body(*batches: pa.RecordBatch) -> bytes:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batches[0].schema) as writer:
            for batch in batches:
                writer.write_batch(batch)
        return bytes(sink.getvalue().to_pybytes())

    def rows(tag: str, n: int) -> pa.RecordBatch:
        return pa.record_batch({"topic": ["t"] * n, "value": [f"{tag}{i}".encode() for i in range(n)]})

    async def main() -> None:
        sessions = {i: NodeSession(p.url) for i, p in nodes.items()}
        try:
            await create_replicated(sessions[1], 4, 3, 2)

            async def led() -> dict[int, list[int]] | None:
                view = await cluster_view(sessions[1])
                states = view["dbs"].get(DB, {}).get("state", [])
                if len(states) != 4 or any(s["leader"] <= 0 for s in states):
                    return None
                by_node: dict[int, list[int]] = {}
                for shard, s in enumerate(states):
                    by_node.setdefault(int(s["leader"]), []).append(shard)
                mine = {i: [p["shard"] for p in (await cluster_view(sessions[i]))["leading"]] for i in nodes}
                return by_node if all(sorted(mine[i]) == sorted(by_node.get(i, [])) for i in nodes) else None

            by_node = await until(led, "leaders that know it")
            node, (a, b) = next((n, s[:2]) for n, s in by_node.items() if len(s) >= 2)
            other = next(s[0] for n, s in by_node.items() if n != node)
            path = f"/v1/dbs/{DB}/records"
            reply = await until(
                lambda: sessions[node].request(
                    "POST",
                    path,
                    params={"shards": f"{a},{b},{a}", "acks": "all"},
                    data=body(rows("x", 3), rows("y", 2), rows("z", 4)),
                    content_type=protocol.ARROW_STREAM,
                ),
                "an acks=all produce",
            )
            parts = {p["shard"]: (p["base_offset"], p["count"]) for p in reply.json()["parts"]}
            assert parts == {a: (0, 7), b: (0, 2)}
            for shard, want in ((a, [b"x0", b"x1", b"x2", b"z0", b"z1", b"z2", b"z3"]), (b, [b"y0", b"y1"])):
                records, hw = await read_all(sessions[node], shard)
                assert hw == len(want) and [v for _, v in records] == want  # acks=all: HW past it
            with pytest.raises(NotLeader):
                await sessions[node].request(
                    "POST",
                    path,
                    params={"shards": f"{a},{other}", "acks": "all"},
                    data=body(rows("w", 1), rows("w", 1)),
                    content_type=protocol.ARROW_STREAM,
                )
            described = (await sessions[node].request("GET", f"/v1/dbs/{DB}")).json()["offsets"]
            assert described[a]["end"] == 7  # the refused request wrote nothing
        finally:
            for s in sessions.values():
                await s.close()

    run(main())


def test_a_new_database_is_replicated_while_a_follower_fetch_waits(
    server_factory: ServerFactory, etcd: EtcdProcess, run: Run[None]
) -> None:
    """A follower's fetch waits at its leader (here up to 60 s) for new frames of the shards it
    named. A database created meanwhile must not wait that out: the fetch gives way to one that
    names the new shards, so an ``acks="all"`` write to them is acknowledged at once."""
    nodes = start_cluster(server_factory, etcd, extra=("--replica-fetch-wait-ms", "60000"))
    second = "second"

    async def main() -> None:
        sessions = {i: NodeSession(p.url) for i, p in nodes.items()}
        try:
            await create_replicated(sessions[1], 1, 3, 2)
            lead = await until(lambda: leading_node(sessions, [1, 2, 3]), "a leader")
            await until(lambda: _produce_ok(sessions[lead], ["first"]), "a first acks=all produce")
            # Both followers' fetches from `lead` now wait at it for the first database only.
            body = {"name": second, "shards": 3, "replication_factor": 3, "min_insync": 3}
            await sessions[1].request("POST", "/v1/dbs", json_body=body)

            async def leaders() -> list[int] | None:
                states = (await cluster_view(sessions[1]))["dbs"].get(second, {}).get("state", [])
                ok = len(states) == 3 and all(s["leader"] > 0 and len(s["isr"]) == 3 for s in states)
                return [int(s["leader"]) for s in states] if ok else None

            led_by = await until(leaders, "leaders of the second database")
            assert lead in led_by  # placement spreads leaders: one shard shares the waiting fetch

            async def acknowledged(shard: int) -> bool:
                await sessions[led_by[shard]].request(
                    "POST",
                    f"/v1/dbs/{second}/records",
                    params={"shard": shard, "acks": "all"},
                    data=json.dumps({"topic": "dev/1", "value": f"v{shard}"}).encode() + b"\n",
                    content_type=protocol.NDJSON,
                )
                return True

            # Far below the 60 s the followers' fetches could wait (a write blocked on acks
            # counts too); before the fix the shard led by `lead` waited ~30 s.
            async with asyncio.timeout(20.0):
                for shard in range(3):
                    await until(lambda shard=shard: acknowledged(shard), f"acks=all on shard {shard}")
        finally:
            for s in sessions.values():
                await s.close()

    run(main())


def test_the_metadata_watch_outlives_a_database_it_cannot_create_here(
    server_factory: ServerFactory, etcd: EtcdProcess, run: Run[None]
) -> None:
    """A node that cannot create a new database's local copy (a file holds its directory's
    path) logs it and keeps re-reading the metadata: once the path is free it creates the
    copy and takes its replicas, and it still follows databases created after. Before, the
    error ended the node's metadata watch, so it never followed anything again (a race of a
    drop with the watch's refresh did the same in the cluster benchmark)."""
    nodes = start_cluster(server_factory, etcd)
    blocked, later = "blocked", "later"
    blocker = nodes[3].data / "dbs" / blocked
    blocker.write_bytes(b"in the way")

    def full(view: dict[str, Any], name: str, shards: int) -> bool:
        states = view["dbs"].get(name, {}).get("state", [])
        return len(states) == shards and all(s["leader"] > 0 and len(s["isr"]) == 3 for s in states)

    async def led_here(sessions: dict[int, NodeSession], name: str, shards: int) -> bool:
        """Every shard of ``name`` led, with all three replicas in the ISR, by its leader's account."""
        led = 0
        for session in sessions.values():
            view = await cluster_view(session)
            led += sum(1 for p in view["leading"] if p["db"] == name and len(p["isr"]) == 3)
        return led == shards

    async def main() -> None:
        sessions = {i: NodeSession(p.url) for i, p in nodes.items()}
        try:
            body = {"name": blocked, "shards": 3, "replication_factor": 3, "min_insync": 2}
            await sessions[1].request("POST", "/v1/dbs", json_body=body)
            marker = "applying the metadata failed"

            async def node3_failed() -> bool:
                return any(marker in line for line in nodes[3].output)

            await until(node3_failed, "node 3 to fail creating its copy")
            assert not (await led_here(sessions, blocked, 3))  # node 3's replicas are missing
            blocker.unlink()
            await until(lambda: led_here(sessions, blocked, 3), f"{blocked}: every shard fully replicated")
            assert (nodes[3].data / "dbs" / blocked).is_dir()
            body = {"name": later, "shards": 3, "replication_factor": 3, "min_insync": 3}
            await sessions[2].request("POST", "/v1/dbs", json_body=body)
            await until(lambda: led_here(sessions, later, 3), f"{later}: every shard fully replicated")
            assert full(await cluster_view(sessions[3]), later, 3)
        finally:
            for s in sessions.values():
                await s.close()

    run(main())


def test_stream_iterators_go_on_through_a_failover(
    server_factory: ServerFactory, etcd: EtcdProcess, run: Run[None]
) -> None:
    """``StreamReader(bootstrap=...)`` reads MQTT streams from each shard's leader; iterators
    saved before the leader of shard 0 is killed go on at the new leader (the wire ids are the
    same on every replica): every acknowledged matching record once, nothing else."""
    from seglog.client import Producer, StreamReader
    from seglog.iterators import Iterator
    from seglog.topics import topic_matches

    nodes = start_cluster(server_factory, etcd)
    topic_filter = "site1/#"

    def topic(i: int) -> str:
        return f"site{i % 3}/dev{i % 14}/t"

    async def main() -> None:
        admin = NodeSession(nodes[1].url)
        try:
            await create_replicated(admin, 2, 3, 2, lts_thresholds=[100, 10])

            view = await until(lambda: all_led(admin), "leaders")
            victim = int(view["dbs"][DB]["state"][0]["leader"])
            others = [p.url for i, p in nodes.items() if i != victim]
            sent: list[tuple[int, int, str, bytes]] = []
            got: list[tuple[int, int, str, bytes]] = []
            saved: list[bytes] = []

            async def send_wave(producer: Producer, wave: bytes) -> None:
                futs = [
                    await producer.send(topic(i), wave + b"%d" % i, key=b"dev%d" % (i % 14))
                    for i in range(300)
                ]
                for i, meta in enumerate(await asyncio.wait_for(asyncio.gather(*futs), WAIT_S)):
                    sent.append((meta.shard, meta.offset, topic(i), wave + b"%d" % i))

            async def read_until(
                reader: StreamReader, iterators: list[Iterator], want: int
            ) -> list[Iterator]:
                """Read every iterator on (long polls) until ``want`` records in all were read."""
                while len(got) < want:
                    moved = []
                    for it in iterators:
                        it, records = await reader.next(it, 40, wait_ms=200)
                        got.extend((r.shard, r.offset, r.topic, r.value) for r in records)
                        moved.append(it)
                    iterators = moved
                return iterators

            async with (
                Producer(others[0], DB, bootstrap=others[1:], acks="all", retries=None) as producer,
                StreamReader(nodes[victim].url, DB, bootstrap=others) as reader,
            ):
                await send_wave(producer, b"a")
                want = sum(1 for s in sent if topic_matches(topic_filter, s[2]))
                streams = await reader.get_streams(topic_filter)
                assert {s.shard for s in streams} == {0, 1}
                iterators = [await reader.make_iterator(s, topic_filter) for s in streams]
                iterators = await asyncio.wait_for(read_until(reader, iterators, want), WAIT_S)
                saved = [it.to_bytes() for it in iterators]
                nodes[victim].kill()  # the reader's url, and shard 0's leader
                await send_wave(producer, b"b")
                want = sum(1 for s in sent if topic_matches(topic_filter, s[2]))
                restored = [Iterator.from_bytes(b) for b in saved]
                await asyncio.wait_for(read_until(reader, restored, want), WAIT_S)
            assert sorted(got) == sorted(s for s in sent if topic_matches(topic_filter, s[2]))
            assert len(set(got)) == len(got)  # nothing read twice
        finally:
            await admin.close()

    run(main())
