"""Restart etcd under a 3-node cluster with an ``acks="all"`` writer and a consumer running.

What the cluster does while etcd is down (the README's "etcd down" paragraph):

* nothing that needs a metadata change happens: no ISR change (a leader's ISR change is a
  compare-and-swap in etcd), no election, no new database;
* each node keeps its roles while its lease may still be alive by its own clock (the send
  time of the last refresh etcd answered plus the TTL): leaders keep acknowledging
  ``acks="all"`` appends with the ISR they have, followers keep fetching, consumers keep
  reading below the high watermark. etcd renews every lease when it comes back, so an outage
  shorter than that changes nothing; the controller takes its role back (its own lease still
  holds the controller key);
* once etcd stayed unreachable past the lease, the node resigns every leadership
  (``acks="all"`` produces get ``NotLeader``) and, when etcd answers again, revokes its old
  lease, registers under a new one and reclaims its shards under a new leader epoch (or the
  controller elects another ISR member first). Writes resume within seconds of etcd's return.

Checked like tests/test_cluster_faults.py (Jepsen's queue checks, tests/queue_checker.py): every acknowledged value
is in the final log exactly once at its acknowledged offset and every replica holds the same
log; a value refused before writing never appears; every record the consumer saw is in the
final log at the offset it saw it at (nothing it read was later truncated); no shard state
names a leader outside its ISR and no new leader came from outside the previous ISR.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from seglog.client import Consumer
from seglog.client._http import NodeSession
from seglog.errors import NotEnoughReplicas, NotEnoughReplicasAfterAppend, NotLeader, SeglogError
from tests.etcd_fixtures import EtcdProcess
from tests.queue_checker import check_queue
from tests.server_fixtures import ServerFactory, ServerProcess
from tests.test_cluster import DB, cluster_view, create_replicated, produce, read_all, start_cluster, until

T = TypeVar("T")
Run = Callable[[Coroutine[Any, Any, T]], T]
# Long enough that an etcd restart (about 1.5 s here) fits well inside a lease.
TTL_S = 9
# The lease keepalive runs every TTL/3: by then a node that gives up its roles on the first
# failed refresh (the bug this test was written against) has stopped acknowledging.
SHORT_OUTAGE_S = TTL_S / 3 + 0.3
RECOVER_S = 30.0


@dataclass
class History:
    """What the writer and the consumer saw."""

    acked: dict[str, int] = field(default_factory=dict)  # value -> acknowledged offset
    sent_at: dict[str, float] = field(default_factory=dict)  # value -> send time (monotonic)
    acked_at: dict[str, float] = field(default_factory=dict)
    refused: set[str] = field(default_factory=set)  # definitely not written
    unknown: set[str] = field(default_factory=set)  # outcome unknown (timeout, resigned)
    consumed: list[tuple[int, bytes]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)  # election-rule breaches seen live

    def acks_sent_between(self, start: float, stop: float) -> int:
        """Acknowledged values sent at or after ``start`` and acknowledged before ``stop``."""
        return sum(1 for v, t in self.acked_at.items() if self.sent_at[v] >= start and t < stop)


def _alive(proc: ServerProcess) -> bool:
    return proc.proc is not None and proc.proc.poll() is None


def test_etcd_restart_loses_nothing_and_writes_resume(
    server_factory: ServerFactory, etcd: EtcdProcess, run: Run[None]
) -> None:
    nodes = start_cluster(server_factory, etcd, ttl_s=TTL_S)
    urls = [p.url for p in nodes.values()]

    async def main() -> None:
        sessions = {i: NodeSession(p.url, timeout_s=5) for i, p in nodes.items()}
        h = History()
        stop = asyncio.Event()
        try:
            await create_replicated(sessions[1], 1, 3, 2)

            async def views() -> dict[int, dict[str, Any]]:
                out = {}
                for i in (1, 2, 3):
                    if _alive(nodes[i]):
                        try:
                            out[i] = await cluster_view(sessions[i])
                        except SeglogError:
                            continue
                return out

            async def leader() -> int | None:
                """The live node that leads shard 0 by its own account."""
                for i, view in (await views()).items():
                    if any(p["db"] == DB for p in view["leading"]):
                        return i
                return None

            async def healthy() -> int | None:
                """The leader, once all three nodes are registered and in its ISR."""
                i = await leader()
                if i is None:
                    return None
                view = await cluster_view(sessions[i])
                isr = next(p["isr"] for p in view["leading"] if p["db"] == DB)
                return i if sorted(isr) == [1, 2, 3] and len(view["nodes"]) == 3 else None

            async def shard_state() -> dict[str, Any]:
                """Shard 0's metadata as its leader knows it."""
                lead = await until(leader, "a leader")
                state: dict[str, Any] = (await cluster_view(sessions[lead]))["dbs"][DB]["state"][0]
                return state

            async def controller() -> int | None:
                return next((i for i, v in (await views()).items() if v["controller"]), None)

            async def writer() -> None:
                n = 0
                while not stop.is_set():
                    lead = await leader()
                    if lead is None:
                        await asyncio.sleep(0.05)  # no leader to talk to yet: poll the metadata
                        continue
                    value = f"v{n}"
                    n += 1
                    h.sent_at[value] = time.monotonic()
                    try:
                        reply = await produce(sessions[lead], 0, [value])
                        h.acked[value] = int(reply["parts"][0]["base_offset"])
                        h.acked_at[value] = time.monotonic()
                    except (NotLeader, NotEnoughReplicas) as exc:
                        if isinstance(exc, NotEnoughReplicasAfterAppend) or "no longer leads" in str(exc):
                            h.unknown.add(value)  # written, maybe kept
                        else:
                            h.refused.add(value)
                        await asyncio.sleep(0.02)  # back off a refused write
                    except SeglogError:
                        h.unknown.add(value)  # timeout, connection lost: outcome unknown

            async def consumer() -> None:
                async with Consumer(urls[0], DB, bootstrap=urls[1:], max_wait_ms=200) as c:
                    while not stop.is_set():
                        try:
                            got = await c.getmany(timeout_ms=200)
                        except SeglogError:
                            await asyncio.sleep(0.05)  # a node is down: the consumer retries
                            continue
                        h.consumed += [(r.offset or 0, r.value) for r in got.get(0, [])]

            async def monitor() -> None:
                """No state names a leader outside its ISR; a new leader was in the last ISR seen."""
                last: dict[str, Any] | None = None
                while not stop.is_set():
                    for i, view in (await views()).items():
                        state = view["dbs"].get(DB, {}).get("state", [None])[0]
                        if state is None:
                            continue
                        if state["leader"] != -1 and state["leader"] not in state["isr"]:
                            h.violations.append(f"node {i} sees leader outside the ISR: {state}")
                        if (
                            last is not None
                            and state["leader_epoch"] > last["leader_epoch"]
                            and state["leader"] not in [-1, *last["isr"], *last["elr"]]
                        ):
                            h.violations.append(f"leader {state['leader']} elected outside {last}")
                        if last is None or state["partition_epoch"] > last["partition_epoch"]:
                            last = state
                    await asyncio.sleep(0.05)  # a sampling period, not synchronisation

            await until(healthy, "shard 0 led with a full ISR")
            tasks = [asyncio.create_task(f()) for f in (writer, consumer, monitor)]
            await until(lambda: _at_least(len(h.acked), 20), "acknowledged writes before the fault")

            # 1. etcd crashes for less than a lease: leaders keep acknowledging acks="all".
            before = await shard_state()
            etcd.kill()
            down = time.monotonic()
            await asyncio.sleep(SHORT_OUTAGE_S)  # the fault schedule: etcd stays down this long
            await until(
                lambda: _at_least(h.acks_sent_between(down + TTL_S / 3, time.monotonic()), 5),
                "acks=all writes acknowledged while etcd is down",
                timeout_s=TTL_S / 3,
            )
            during = h.acks_sent_between(down, time.monotonic())
            etcd.start()
            outage = time.monotonic() - down
            print(f"etcd down {outage:.1f} s; {during} acks=all writes acknowledged meanwhile")
            # The controller role survives (its holder takes it back) and still elects.
            await until(controller, "an active controller after etcd's return", timeout_s=RECOVER_S)
            # Back before any lease could have run out (the last refresh was at most TTL/3
            # before the crash; 0.5 s for the next retry to reach etcd): nothing changed.
            if outage < TTL_S * 2 / 3 - 0.5:
                after = await shard_state()
                assert (after["leader"], after["leader_epoch"]) == (before["leader"], before["leader_epoch"])
                assert not any("lost its etcd lease" in line for p in nodes.values() for line in p.output)
            else:
                print("etcd took longer than a lease to come back: leases lost, nodes re-registered")
            victim = await until(healthy, "full ISR after etcd's return", timeout_s=RECOVER_S)
            nodes[victim].kill()
            killed = time.monotonic()
            await until(
                lambda: _at_least(h.acks_sent_between(killed, time.monotonic()), 1),
                "a write acknowledged by a new leader",
                timeout_s=RECOVER_S + TTL_S,
            )
            nodes[victim].restart()
            await sessions[victim].close()
            sessions[victim] = NodeSession(nodes[victim].url, timeout_s=5)
            await until(healthy, "the killed node back in the ISR", timeout_s=RECOVER_S)

            # 2. etcd stops for longer than a lease: every node resigns, then re-registers.
            etcd.stop()
            down = time.monotonic()
            await until(
                lambda: _none_leads(views), "every node resigned without etcd", timeout_s=TTL_S + RECOVER_S
            )
            resigned_after = time.monotonic() - down
            etcd.start()
            back = time.monotonic()
            await until(
                lambda: _at_least(h.acks_sent_between(back, time.monotonic()), 1),
                "acks=all writes accepted again after etcd's return",
                timeout_s=RECOVER_S,
            )
            resumed_after = time.monotonic() - back
            # A node revokes its old lease (etcd renewed it on restart) instead of waiting it out.
            assert resumed_after < TTL_S, f"writes resumed only {resumed_after:.1f} s after etcd's return"
            await until(controller, "an active controller", timeout_s=RECOVER_S)
            await until(healthy, "all three nodes registered and in the ISR", timeout_s=RECOVER_S)
            print(
                f"etcd stopped: all resigned after {resigned_after:.1f} s; writes resumed {resumed_after:.1f} s after"
            )
            await until(lambda: _at_least(len(h.consumed), len(h.acked) // 2), "the consumer to keep up")
            stop.set()
            await asyncio.gather(*tasks)

            # Heal and check.
            lead = await until(healthy, "a healthy leader")
            final, hw = await read_all(sessions[lead], 0)
            logs = {}
            for i in (1, 2, 3):
                logs[i], _ = await until(
                    lambda i=i: _log_at(sessions[i], hw), f"node {i} at the high watermark"
                )
            check_queue(final, logs, h.acked, h.refused, h.unknown, h.consumed)
            assert not h.violations, h.violations[:5]
        finally:
            stop.set()
            for s in sessions.values():
                await s.close()

    run(main())


async def _at_least(n: int, want: int) -> bool:
    return n >= want


async def _none_leads(views: Callable[[], Coroutine[Any, Any, dict[int, dict[str, Any]]]]) -> bool:
    seen = await views()
    return len(seen) == 3 and not any(v["leading"] for v in seen.values())


async def _log_at(session: NodeSession, hw: int) -> tuple[list[tuple[int, bytes]], int] | None:
    records, got = await read_all(session, 0)
    return (records, got) if got >= hw else None
