"""A restarted follower rejoins the ISR on the fetch that reaches the high watermark (Kafka's rule).

Real etcd, real ``seglog serve`` processes, the DEFAULT ``replica_lag_time_max_ms`` (30 s):
the periodic ISR check runs every 7.5 s, so a rejoin that waited for it would take up to
7.5 s after the follower caught up. With the expansion on the fetch path it takes one fetch
round plus one metadata compare-and-swap.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any, Final, TypeVar

from seglog.client._http import NodeSession
from seglog.errors import NotEnoughReplicas, NotEnoughReplicasAfterAppend, NotLeader, SeglogError
from seglog.isr.leader_state import DEFAULT_REPLICA_LAG_TIME_MAX_MS
from tests.etcd_fixtures import EtcdProcess
from tests.queue_checker import check_queue
from tests.server_fixtures import ServerFactory, ServerProcess
from tests.test_cluster import DB, cluster_view, create_replicated, produce, read_all, until

T = TypeVar("T")
Run = Callable[[Coroutine[Any, Any, T]], T]
# The old periodic check ran every lag/4 = 7.5 s; a fetch-path rejoin needs a fetch round.
REJOIN_BOUND_S: Final = 2.0
CYCLES: Final = 3


def start_default_lag_cluster(server_factory: ServerFactory, etcd: EtcdProcess) -> dict[int, ServerProcess]:
    """Three nodes with the default replica lag (no ``--replica-lag-time-max-ms``)."""
    return {
        i: server_factory("--etcd", etcd.url, "--node-id", str(i), "--node-ttl-s", "2", "--log-level", "info")
        for i in (1, 2, 3)
    }


async def shard0(session: NodeSession) -> dict[str, Any] | None:
    """Shard 0's metadata state as ``session``'s node knows it."""
    view = await cluster_view(session)
    states = view["dbs"].get(DB, {}).get("state", [])
    return dict(states[0]) if states else None


def test_a_restarted_follower_rejoins_the_isr_on_its_fetch(
    server_factory: ServerFactory, etcd: EtcdProcess, run: Run[None]
) -> None:
    assert DEFAULT_REPLICA_LAG_TIME_MAX_MS / 4000 > 2 * REJOIN_BOUND_S
    nodes = start_default_lag_cluster(server_factory, etcd)

    async def main() -> None:
        sessions = {i: NodeSession(p.url, timeout_s=5) for i, p in nodes.items()}
        acked: dict[str, int] = {}
        refused: set[str] = set()
        unknown: set[str] = set()
        hws: list[int] = []
        stop = asyncio.Event()
        try:
            await create_replicated(sessions[1], 1, 3, 2)

            async def led() -> int | None:
                state = await shard0(sessions[1])
                if state is None or state["leader"] <= 0:
                    return None
                leader = int(state["leader"])
                view = await cluster_view(sessions[leader])
                return leader if any(p["db"] == DB for p in view["leading"]) else None

            leader = await until(led, "a leader that knows it")

            async def all_in_sync() -> bool:
                state = await shard0(sessions[leader])
                return state is not None and sorted(state["isr"]) == [1, 2, 3]

            await until(all_in_sync, "the full ISR")

            async def writer() -> None:
                n = 0
                while not stop.is_set():
                    value = f"v{n}"
                    n += 1
                    try:
                        reply = await produce(sessions[leader], 0, [value])
                        acked[value] = int(reply["parts"][0]["base_offset"])
                    except NotEnoughReplicasAfterAppend:
                        unknown.add(value)
                    except (NotLeader, NotEnoughReplicas):
                        refused.add(value)
                    except SeglogError:
                        unknown.add(value)

            async def watch_hw() -> None:
                # The leader's high watermark, sampled throughout: it must never go back.
                while not stop.is_set():
                    view = await cluster_view(sessions[leader])
                    hws.extend(p["high_watermark"] for p in view["leading"] if p["db"] == DB)
                    await asyncio.sleep(0.02)  # a sampling period, not synchronisation

            background = [asyncio.create_task(writer()), asyncio.create_task(watch_hw())]
            followers = [i for i in (1, 2, 3) if i != leader]
            took: list[float] = []
            for cycle in range(CYCLES):
                victim = followers[cycle % 2]
                nodes[victim].kill()

                async def left(victim: int = victim) -> bool:
                    state = await shard0(sessions[leader])
                    return state is not None and victim not in state["isr"]

                await until(left, f"node {victim} out of the ISR (its lease expired)")
                before = len(acked)
                await until(lambda before=before: _true(len(acked) >= before + 20), "writes without it")
                nodes[victim].restart()
                await sessions[victim].close()
                sessions[victim] = NodeSession(nodes[victim].url, timeout_s=5)
                started = time.monotonic()

                async def back(victim: int = victim) -> bool:
                    state = await shard0(sessions[leader])
                    return state is not None and victim in state["isr"]

                await until(back, f"node {victim} back in the ISR", timeout_s=30)
                took.append(time.monotonic() - started)
            stop.set()
            await asyncio.gather(*background)
            print(f"rejoin after restart took {[round(t, 2) for t in took]} s")
            # Every rejoin well before the old periodic check (7.5 s) could have done it.
            assert max(took) < REJOIN_BOUND_S, took
            # ISR expansion never pulled the high watermark back.
            assert hws and hws == sorted(hws), hws
            final, hw = await read_all(sessions[leader], 0)
            logs = {}
            for i in (1, 2, 3):
                logs[i], _ = await until(lambda i=i: _at_least(sessions[i], hw), f"node {i} at the HW")
            check_queue(final, logs, acked, refused, unknown)
        finally:
            stop.set()
            for s in sessions.values():
                await s.close()

    run(main())


async def _true(ok: bool) -> bool:
    return ok


async def _at_least(session: NodeSession, hw: int) -> tuple[list[tuple[int, bytes]], int] | None:
    records, got = await read_all(session, 0)
    return (records, got) if got >= hw else None


def test_a_follower_left_behind_by_the_leaders_retention_restarts_at_its_start_and_rejoins(
    server_factory: ServerFactory, etcd: EtcdProcess, run: Run[None]
) -> None:
    """A follower is down while the leader's retention (run now: ``POST .../retention``) moves
    the log start past the follower's end. Back, it cannot fetch what it misses: it restarts
    empty at the leader's start and rejoins the ISR. The leader's retention never passes its
    high watermark."""
    from tests.test_cluster import start_cluster

    nodes = start_cluster(server_factory, etcd)

    async def main() -> None:
        sessions = {i: NodeSession(p.url, timeout_s=5) for i, p in nodes.items()}
        try:
            await create_replicated(sessions[1], 1, 3, 2, segment_bytes=4096, retention_bytes=0)

            async def full() -> int | None:
                state = await shard0(sessions[1])
                ok = state is not None and state["leader"] > 0 and sorted(state["isr"]) == [1, 2, 3]
                return int(state["leader"]) if ok and state is not None else None

            leader = await until(full, "a leader with the full ISR")
            victim = next(i for i in (1, 2, 3) if i != leader)
            for k in range(10):
                await produce(sessions[leader], 0, [f"a{k}-{i}" for i in range(10)])
            behind = int((await sessions[victim].request("GET", f"/v1/dbs/{DB}")).json()["offsets"][0]["end"])
            assert behind == 100
            nodes[victim].kill()

            async def shrunk() -> bool:
                state = await shard0(sessions[leader])
                return state is not None and victim not in state["isr"]

            await until(shrunk, "the ISR without the stopped follower")
            for k in range(30):
                await produce(sessions[leader], 0, [f"b{k}-{i}" for i in range(10)])
            reply = (await sessions[leader].request("POST", f"/v1/dbs/{DB}/retention")).json()
            start = int(reply["offsets"][0]["start"])
            hw = int(reply["offsets"][0]["high_watermark"])
            assert behind < start <= hw == 400, reply
            assert reply["freed_bytes"] > 0
            nodes[victim].restart()
            await sessions[victim].close()
            sessions[victim] = NodeSession(nodes[victim].url, timeout_s=5)

            async def back() -> bool:
                state = await shard0(sessions[leader])
                return state is not None and sorted(state["isr"]) == [1, 2, 3]

            await until(back, "the follower back in the ISR")
            assert any(
                f"{DB}/0 ended at {behind}, below the leader's start {start}" in line
                for line in nodes[victim].output
            ), nodes[victim].output[-20:]
            offsets = (await sessions[victim].request("GET", f"/v1/dbs/{DB}")).json()["offsets"][0]
            assert (offsets["start"], offsets["end"]) == (start, 400), offsets

            async def caught_up() -> list[tuple[int, bytes]] | None:
                records, hw = await read_all(sessions[victim], 0, start)
                return records if hw >= 400 else None

            mine = await until(caught_up, "the follower at the end")
            theirs, _ = await read_all(sessions[leader], 0, start)
            assert mine == theirs and mine[0][0] == start and len(mine) == 400 - start
        finally:
            for s in sessions.values():
                await s.close()

    run(main())
