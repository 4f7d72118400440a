"""Jepsen-style: a 3-node cluster under kills and pauses, checked like Jepsen's queue checker.

A client sends unique values with ``acks="all"`` to whichever node leads as an idempotent
producer, retrying a send whose outcome is unknown (a timeout, a leader that resigned or lost
its ISR after writing) with the same sequence number until it is acknowledged; a nemesis SIGKILLs and restarts nodes and SIGSTOPs leaders past
their lease. At the end every node is healed and the log is drained from each of them.
Checked: no acknowledged value is lost (lost-write/unseen), no value sits at two offsets
(duplicate), an acknowledged offset holds the acknowledged value (inconsistent-offsets), a
send refused before writing never appears (G1a), and every replica holds the same log.

Every node also tiers the database into one shared directory every 300 ms (small segments,
so they seal often) and drops its local copies once they are committed
(``local_retention_bytes=0``): each shard's leader uploads, kills and pauses land
mid-upload, a paused leader that wakes up is fenced by the newer leader's epoch, and a node
that comes back behind its leader's start restarts there. The logs are read from offset 0
through each node (the tiered part from the tier). At the end the tier's committed objects
must run from offset 0 without a gap or an overlap and hold exactly the final log's records.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from seglog.client._http import NodeSession
from seglog.errors import NotEnoughReplicas, NotEnoughReplicasAfterAppend, NotLeader, SeglogError
from seglog.tiering import Manifest, open_target, read_tiered
from tests.etcd_fixtures import EtcdProcess
from tests.queue_checker import check_queue
from tests.server_fixtures import ServerFactory, ServerProcess
from tests.test_cluster import (
    DB,
    cluster_view,
    create_replicated,
    produce_idempotent,
    producer_id,
    read_all,
    start_cluster,
    until,
)
from tests.tier_fixtures import committed_run

T = TypeVar("T")
Run = Callable[[Coroutine[Any, Any, T]], T]
# `make chaos` runs many seeds for longer (tests/chaos.py); `make test` runs this one schedule.
NEMESIS_S = float(os.environ.get("SEGLOG_FAULT_SECONDS", "20"))
SEED = int(os.environ.get("SEGLOG_FAULT_SEED", "20261125"))


def test_kills_and_pauses_lose_nothing_acknowledged(
    server_factory: ServerFactory, etcd: EtcdProcess, run: Run[None], tmp_path: Path
) -> None:
    tier = tmp_path / "tier"
    nodes = start_cluster(server_factory, etcd, extra=("--tier", tier.as_uri(), "--tier-interval-ms", "300"))
    rng = random.Random(SEED)

    async def main() -> None:
        sessions = {i: NodeSession(p.url, timeout_s=5) for i, p in nodes.items()}
        acked: dict[str, int] = {}  # value -> offset
        refused: set[str] = set()  # definitely not written
        unknown: set[str] = set()
        faults = {"kills": 0, "pauses": 0}
        retried = {"retries": 0, "acked_after_retry": 0}
        stop = asyncio.Event()
        try:
            await create_replicated(sessions[1], 1, 3, 2, segment_bytes=4096, local_retention_bytes=0)

            async def current_leader() -> int | None:
                for i in (1, 2, 3):
                    if not _alive(nodes[i]):
                        continue
                    try:
                        view = await cluster_view(sessions[i])
                    except SeglogError:
                        continue
                    state = view["dbs"].get(DB, {}).get("state", [{}])[0]
                    leader = state.get("leader")
                    if leader in nodes and _alive(nodes[leader]):
                        return int(leader)
                return None

            async def client() -> None:
                # An idempotent producer: a send whose outcome is unknown is retried with the
                # same sequence number until it is acknowledged (or the run ends), so every
                # value is stored at most once whatever the faults did to its first attempts.
                pid = await until(lambda: _any_producer_id(sessions, nodes), "a producer id")
                seq = 0
                n = 0
                while not stop.is_set():
                    value = f"v{n}"
                    n += 1
                    tried = False  # an attempt of this value may have been written
                    while True:
                        leader = await current_leader()
                        if leader is None:
                            if stop.is_set():
                                (unknown if tried else refused).add(value)
                                break
                            await asyncio.sleep(0.05)  # no leader to talk to yet: poll the metadata
                            continue
                        try:
                            reply = await produce_idempotent(sessions[leader], 0, [value], pid, seq)
                            acked[value] = int(reply["parts"][0]["base_offset"])
                            retried["acked_after_retry"] += tried
                            seq += 1
                            break
                        except (NotLeader, NotEnoughReplicas) as exc:
                            written = isinstance(exc, NotEnoughReplicasAfterAppend) or (
                                isinstance(exc, NotLeader) and "no longer leads" in str(exc)
                            )
                            tried = tried or written
                        except SeglogError:
                            tried = True  # timeout, connection lost: outcome unknown
                        if stop.is_set() or not tried:
                            # Refused before anything was written: the next value takes this
                            # sequence number. Unknown at the end of the run: left unknown.
                            (unknown if tried else refused).add(value)
                            if tried:
                                return  # its sequence number may be used: send nothing after it
                            break
                        retried["retries"] += 1
                        await asyncio.sleep(0.05)  # back off before the retry

            async def nemesis() -> None:
                deadline = time.monotonic() + NEMESIS_S
                while time.monotonic() < deadline:
                    await asyncio.sleep(rng.uniform(0.5, 1.5))  # fault schedule, not synchronisation
                    leader = await current_leader()
                    if rng.random() < 0.5:
                        victim = (
                            leader if leader is not None and rng.random() < 0.7 else rng.choice([1, 2, 3])
                        )
                        nodes[victim].kill()
                        faults["kills"] += 1
                        await asyncio.sleep(rng.uniform(0.5, 3.0))
                        nodes[victim].restart()
                        await sessions[victim].close()
                        sessions[victim] = NodeSession(nodes[victim].url, timeout_s=5)
                    elif leader is not None:
                        proc = nodes[leader].proc
                        assert proc is not None
                        proc.send_signal(signal.SIGSTOP)  # a paused leader, past its lease
                        faults["pauses"] += 1
                        await asyncio.sleep(rng.uniform(2.5, 4.0))
                        proc.send_signal(signal.SIGCONT)
                stop.set()

            await asyncio.gather(client(), nemesis())

            # Heal: everyone back in the ISR, then drain every replica.
            async def healed() -> bool:
                leader = await current_leader()
                if leader is None:
                    return False
                view = await cluster_view(sessions[leader])
                state = view["dbs"].get(DB, {}).get("state", [{}])[0]
                return sorted(state.get("isr", [])) == [1, 2, 3]

            try:
                await until(healed, "all three replicas back in the ISR", timeout_s=90)
            except AssertionError:
                for i in (1, 2, 3):
                    print(f"--- node {i} (alive: {_alive(nodes[i])})")
                    print("".join(nodes[i].output[-60:]))
                raise
            leader = await current_leader()
            assert leader is not None
            final, hw = await read_all(sessions[leader], 0)
            logs = {}
            for i in (1, 2, 3):
                logs[i], _ = await until(
                    lambda i=i: _at_least(sessions[i], hw), f"node {i} at the high watermark", timeout_s=60
                )
            stored = {value.decode() for _, value in final}
            lost = [v for v in acked if v not in stored]
            if lost:
                print(f"lost {lost[:10]}; high watermark {hw}")
                for i in (1, 2, 3):
                    d = (await sessions[i].request("GET", f"/v1/dbs/{DB}")).json()["offsets"]
                    print(f"node {i}: {d} {await cluster_view(sessions[i])}")
                    print("".join(nodes[i].output[-80:]))
            where = check_queue(final, logs, acked, refused, unknown)
            tiered = await asyncio.to_thread(_check_tier, tier, final, hw)
            # One line tests/chaos.py parses (make chaos).
            print(
                f"CHAOS seed={SEED} seconds={NEMESIS_S:g} kills={faults['kills']} pauses={faults['pauses']} "
                f"acked={len(acked)} refused={len(refused)} unknown={len(unknown)} "
                f"unknown_visible={len(unknown & set(where))} final_log={len(final)} "
                f"retries={retried['retries']} acked_after_retry={retried['acked_after_retry']} "
                f"tiered_objects={tiered} restarts={_restarts(nodes)}"
            )
        finally:
            for s in sessions.values():
                await s.close()

    run(main())


async def _any_producer_id(sessions: dict[int, NodeSession], nodes: dict[int, ServerProcess]) -> int | None:
    for i, session in sessions.items():
        if _alive(nodes[i]):
            with contextlib.suppress(SeglogError):
                return await producer_id(session)
    return None


def _alive(proc: ServerProcess) -> bool:
    return proc.proc is not None and proc.proc.poll() is None


async def _at_least(session: NodeSession, hw: int) -> tuple[list[tuple[int, bytes]], int] | None:
    records, got = await read_all(session, 0)
    return (records, got) if got >= hw else None


def _check_tier(tier: Path, final: list[tuple[int, bytes]], hw: int) -> int:
    """The tier agrees with the committed log: objects from 0, contiguous, below the high
    watermark, each record the log's at its offset. Returns how many objects there are."""
    target = open_target(tier.as_uri())
    try:
        manifest = Manifest.load_shared(target, DB)
        ranges = committed_run(manifest, 0)  # something was tiered, from 0, without gaps
        assert ranges[-1][1] < hw, (ranges[-1], hw)
        log = dict(final)
        for table in read_tiered(target, manifest, 0, 0):
            offsets = table.column("offset").to_pylist()
            assert table.column("value").to_pylist() == [log[o] for o in offsets], offsets[:5]
        return len(ranges)
    finally:
        target.close()


def _restarts(nodes: dict[int, ServerProcess]) -> int:
    """How many times a node came back behind its leader's start and restarted there."""
    return sum("restarted empty there" in line for p in nodes.values() for line in p.output)
