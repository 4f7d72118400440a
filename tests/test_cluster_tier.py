"""Tiering a replicated database on a 3-node cluster (real etcd, real node processes, one
shared tier directory): each shard is uploaded once, by its leader, up to the high watermark;
followers drop their local copies once the leader's objects are committed; after a leader is
SIGKILLed the new one takes the shard over at its epoch and goes on from where the old one
stopped; every record stays readable from offset 0."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from seglog.client import Consumer, Producer
from seglog.client._http import NodeSession
from seglog.errors import InvalidArgument
from seglog.tiering import Manifest, open_target
from tests.etcd_fixtures import EtcdProcess
from tests.server_fixtures import ServerFactory, ServerProcess
from tests.test_cluster import DB, WAIT_S, Run, cluster_view, create_replicated, start_cluster, until
from tests.tier_fixtures import committed_run

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SHARDS = 2
PER_WAVE = 300


async def _tier(url: str) -> dict[str, Any]:
    session = NodeSession(url)
    try:
        reply = await session.request("POST", f"/v1/dbs/{DB}/tier", json_body={"seal": True})
        out: dict[str, Any] = reply.json()
        return out
    finally:
        await session.close()


async def _leaders(admin: NodeSession, shards: int = SHARDS) -> dict[int, tuple[int, int]]:
    """``{shard: (leader node, leader epoch)}`` once every shard has a leader."""

    async def led() -> dict[int, tuple[int, int]] | None:
        view = await cluster_view(admin)
        states = view["dbs"].get(DB, {}).get("state", [])
        if len(states) != shards or any(s["leader"] <= 0 for s in states):
            return None
        return {i: (int(s["leader"]), int(s["leader_epoch"])) for i, s in enumerate(states)}

    return await until(led, "leaders")


async def _send(urls: list[str], wave: bytes) -> dict[int, list[bytes]]:
    sent: dict[int, list[bytes]] = {s: [] for s in range(SHARDS)}
    async with Producer(urls[0], DB, bootstrap=urls[1:], acks="all", retries=None) as producer:
        futs = [await producer.send("t", wave + b"%04d" % i, key=b"k%d" % i) for i in range(PER_WAVE)]
        for i, meta in enumerate(await asyncio.wait_for(asyncio.gather(*futs), WAIT_S)):
            sent[meta.shard].append(wave + b"%04d" % i)
    return sent


async def _read_all(url: str, others: list[str], want: int) -> dict[int, list[tuple[int, bytes]]]:
    got: dict[int, list[tuple[int, bytes]]] = {s: [] for s in range(SHARDS)}
    async with Consumer(url, DB, bootstrap=others, max_wait_ms=500) as consumer, asyncio.timeout(WAIT_S):
        while sum(len(v) for v in got.values()) < want:
            for shard, records in (await consumer.getmany(timeout_ms=None)).items():
                got[shard] += [(r.offset or 0, r.value) for r in records]
    return got


def _manifest(tier: Path) -> Manifest:
    return Manifest.load_shared(open_target(tier.as_uri()), DB)


def _check_manifest(tier: Path, ends: dict[int, int]) -> Manifest:
    """Every shard's committed objects run from 0 to its end without gap or overlap, and
    nothing else is in the tier (no replica uploaded a second copy)."""
    manifest = _manifest(tier)
    for shard, end in ends.items():
        ranges = committed_run(manifest, shard)
        assert ranges[-1][1] == end - 1, (shard, ranges)
    objects = sorted(p.relative_to(tier).as_posix() for p in tier.rglob("*.parquet"))
    assert objects == sorted(e.key for e in manifest.entries()), objects
    return manifest


def test_a_replicated_database_is_tiered_by_its_leaders(
    server_factory: ServerFactory,
    etcd: EtcdProcess,
    tmp_path: Path,
    run: Run[dict[int, list[bytes]]],
    spark: SparkSession,
) -> None:
    tier = tmp_path / "tier"
    nodes: dict[int, ServerProcess] = start_cluster(
        server_factory, etcd, extra=("--tier", tier.as_uri(), "--tier-interval-ms", "0")
    )
    urls = {i: p.url for i, p in nodes.items()}

    async def main() -> dict[int, list[bytes]]:
        admin = NodeSession(urls[1])
        try:
            await create_replicated(
                admin, SHARDS, 3, 2, segment_bytes=4096, local_retention_bytes=0, exist_ok=False
            )
            leaders = await _leaders(admin)
            await admin.request("POST", "/v1/dbs", json_body={"name": "local-only"})
            with pytest.raises(InvalidArgument, match="not replicated"):
                await admin.request("POST", "/v1/dbs/local-only/tier")
            sent = await _send(list(urls.values()), b"a")
            ends = {s: len(v) for s, v in sent.items()}
            # Followers first: they have nothing committed to drop yet, and upload nothing.
            for i in nodes:
                if i not in {n for n, _ in leaders.values()}:
                    reply = await _tier(urls[i])
                    assert reply["committed"] == [], reply
            committed: dict[int, list[dict[str, Any]]] = {}
            for i in sorted({n for n, _ in leaders.values()}):
                reply = await _tier(urls[i])
                for e in reply["committed"]:
                    committed.setdefault(e["shard"], []).append(e)
                    assert leaders[e["shard"]][0] == i, (e, leaders)  # only a shard's leader uploads it
            assert sorted(committed) == list(range(SHARDS))
            manifest = _check_manifest(tier, ends)
            assert {s: manifest.writer_epoch(s) for s in range(SHARDS)} == {
                s: epoch for s, (_, epoch) in leaders.items()
            }
            # Every node now keeps no local copy of the tiered records, and still serves them.
            for i in nodes:
                for t in (await _tier(urls[i]))["tier"]:
                    assert t["local_start_offset"] == t["end_offset"] == ends[t["shard"]], (i, t)
                    assert t["start_offset"] == 0, (i, t)
            got = await _read_all(urls[1], [u for i, u in urls.items() if i != 1], sum(ends.values()))
            for s in range(SHARDS):
                assert got[s] == list(enumerate(sent[s])), s

            # The leader of shard 0 dies; the new one claims the shard at its epoch and tiers on
            # from where the old one stopped.
            victim, old_epoch = leaders[0]
            nodes[victim].kill()
            alive = [u for i, u in urls.items() if i != victim]
            admin2 = NodeSession(alive[0])
            try:

                async def moved() -> dict[int, tuple[int, int]] | None:
                    now = await _leaders(admin2)
                    return now if now[0][0] != victim else None

                leaders = await until(moved, "a new leader of shard 0")
            finally:
                await admin2.close()
            more = await _send(alive, b"b")
            for s in range(SHARDS):
                sent[s] += more[s]
                ends[s] += len(more[s])
            for i in sorted({n for n, _ in leaders.values()}):
                await _tier(urls[i])
            manifest = _check_manifest(tier, ends)
            assert manifest.writer_epoch(0) == leaders[0][1] > old_epoch
            nodes[victim].restart()  # comes back as a follower: it uploads nothing of shard 0

            async def rejoined() -> bool:
                view = await cluster_view(admin)
                states = view["dbs"].get(DB, {}).get("state", [])
                return bool(states) and all(victim in s["isr"] for s in states)

            await until(rejoined, "the restarted node back in every ISR")

            # Its copy ended below the new leader's start (the leader dropped its local copies
            # once tiered): it could only rejoin by starting over there.
            async def restarted() -> bool:
                return any(
                    f"{DB}/0 ended at" in x and "restarted empty there" in x for x in nodes[victim].output
                )

            await until(restarted, "the restarted node's log line")

            reply = await _tier(urls[victim])
            assert all(e["shard"] != 0 for e in reply["committed"]), reply
            _check_manifest(tier, ends)
            got = await _read_all(alive[0], alive[1:], sum(ends.values()))
            for s in range(SHARDS):
                assert got[s] == list(enumerate(sent[s])), s
            return sent
        finally:
            await admin.close()

    sent_all = run(main())
    # Spark reads the replicated history through seglog's data source, as any tier.
    frame = spark.read.format("seglog").option("root", tier.as_uri()).option("db", DB).load()
    rows = frame.select("shard", "offset", "value").collect()
    assert sorted((r["shard"], r["offset"], bytes(r["value"])) for r in rows) == sorted(
        (s, o, v) for s, values in sent_all.items() for o, v in enumerate(values)
    )
    print(json.dumps({"tier objects": len(list(tier.rglob("*.parquet")))}))


def test_an_unclean_leader_takes_up_the_shard_at_the_tiers_end(
    server_factory: ServerFactory, etcd: EtcdProcess, tmp_path: Path, run: Run[None]
) -> None:
    """Unclean election on a tiered database: the new leader lacks records the old one tiered.

    Without a check it would take new records at offsets the tier already holds (the tier
    keeps the old ones, the log the new: two records per offset) and its uploads would overlap
    committed objects forever. It starts its log over at the tier's end before it takes a write:
    the tiered records stay readable below that, new ones go after it, tiering goes on.
    """
    tier = tmp_path / "tier"
    nodes = start_cluster(server_factory, etcd, extra=("--tier", tier.as_uri(), "--tier-interval-ms", "0"))
    urls = {i: p.url for i, p in nodes.items()}

    async def main() -> None:
        admin = NodeSession(urls[1])
        sessions = {i: NodeSession(u) for i, u in urls.items()}
        try:
            await create_replicated(
                admin, 1, 3, 1, unclean_election=True, segment_bytes=4096, local_retention_bytes=0
            )
            ((old, epoch),) = (await _leaders(admin, 1)).values()
            late = next(i for i in urls if i != old)  # out of the ISR before anything is written
            nodes[late].kill()
            await sessions[late].close()

            async def isr_without_late() -> bool:
                view = await cluster_view(sessions[old])
                return late not in view["dbs"][DB]["state"][0]["isr"]

            await until(isr_without_late, "the killed replica out of the ISR")
            alive = [urls[old]] + [u for i, u in urls.items() if i not in (old, late)]
            first = await _send_one_shard(alive, b"a")
            committed = (await _tier(urls[old]))["committed"]
            tiered_end = max(e["end_offset"] for e in committed) + 1
            assert 0 < tiered_end <= len(first)
            for i in urls:
                if i != late:
                    nodes[i].kill()
                    await sessions[i].close()
            nodes[late].restart()
            sessions[late] = NodeSession(urls[late])

            async def unclean() -> bool:
                view = await cluster_view(sessions[late])
                states = view["dbs"].get(DB, {}).get("state", [])
                if not states:
                    return False
                state = states[0]
                return state["leader"] == late and state["leader_epoch"] > epoch and bool(view["leading"])

            await until(unclean, "the out-of-sync replica elected")
            second = await _send_one_shard([urls[late]], b"b")
            reply = await _tier(urls[late])
            assert reply["committed"], reply  # tiering goes on at the new leader's epoch
            manifest = _manifest(tier)
            ranges = committed_run(manifest, 0)
            assert ranges[0][0] == 0 and ranges[-1][1] >= tiered_end, ranges
            # One record per offset: the old leader's tiered ones, then the new leader's.
            expected = list(enumerate(first[:tiered_end])) + [
                (tiered_end + i, v) for i, v in enumerate(second)
            ]
            async with Consumer(urls[late], DB, max_wait_ms=200) as consumer, asyncio.timeout(WAIT_S):
                got: list[tuple[int, bytes]] = []
                while len(got) < len(expected):
                    for records in (await consumer.getmany(timeout_ms=None)).values():
                        got += [(r.offset or 0, r.value) for r in records]
            assert got == expected
            assert any("starts its log over at the tier's end" in x for x in nodes[late].output)
            # The old replicas come back as followers: each cuts what it held past the tier's
            # end (lost to the unclean election, as that setting documents) and takes the
            # new leader's records there.
            for i in urls:
                if i != late:
                    nodes[i].restart()
                    sessions[i] = NodeSession(urls[i])

            async def all_in_sync() -> bool:
                view = await cluster_view(sessions[late])
                return len(view["dbs"][DB]["state"][0]["isr"]) == 3

            await until(all_in_sync, "every replica back in the ISR")
            for i in urls:
                described = (await sessions[i].request("GET", f"/v1/dbs/{DB}")).json()
                assert described["offsets"][0]["end"] == tiered_end + len(second), (i, described)
        finally:
            await admin.close()
            for s in sessions.values():
                await s.close()

    run(main())


async def _send_one_shard(urls: list[str], wave: bytes) -> list[bytes]:
    """``PER_WAVE`` records into shard 0 (the only one), acknowledged with ``acks="all"``."""
    async with Producer(urls[0], DB, bootstrap=urls[1:], acks="all", retries=None) as producer:
        values = [wave + b"%04d" % i for i in range(PER_WAVE)]
        futs = [await producer.send("t", v) for v in values]
        await asyncio.wait_for(asyncio.gather(*futs), WAIT_S)
    return values


def test_a_follower_restarted_at_its_leaders_start_reads_the_tier_at_once(
    server_factory: ServerFactory, etcd: EtcdProcess, tmp_path: Path, run: Run[None]
) -> None:
    """A follower paused while its leader tiered and dropped its local copies starts over at
    the leader's start; it reads the manifest then, so it serves the tiered records below that
    start at once instead of failing reads there until its next tier pass (none here)."""
    tier = tmp_path / "tier"
    nodes = start_cluster(server_factory, etcd, extra=("--tier", tier.as_uri(), "--tier-interval-ms", "0"))
    urls = {i: p.url for i, p in nodes.items()}

    async def main() -> None:
        admin = NodeSession(urls[1])
        try:
            await create_replicated(admin, 1, 3, 2, segment_bytes=4096, local_retention_bytes=0)
            ((leader, _),) = (await _leaders(admin, 1)).values()
            paused = next(i for i in urls if i != leader)
            proc = nodes[paused].proc
            assert proc is not None
            # Paused while the leader writes and tiers everything and drops its local copies:
            # it resumes with its start of the manifest (read at open: nothing tiered yet).
            proc.send_signal(signal.SIGSTOP)
            try:
                others = [urls[leader]] + [u for i, u in urls.items() if i not in (leader, paused)]
                first = await _send_one_shard(others, b"a")
                assert (await _tier(urls[leader]))["committed"]
                second = await _send_one_shard(others, b"b")
                assert (await _tier(urls[leader]))["committed"]
            finally:
                proc.send_signal(signal.SIGCONT)

            async def restarted() -> bool:
                return any("restarted empty there" in x for x in nodes[paused].output)

            await until(restarted, "the paused follower restarted at its leader's start")
            session = NodeSession(urls[paused])
            try:

                async def start_on_paused() -> int:
                    described = (await session.request("GET", f"/v1/dbs/{DB}")).json()
                    return int(described["offsets"][0]["start"]) + 1  # until() wants a truthy value

                # Its log starts at the leader's start (the end of what was tiered); its first
                # readable offset is the tier's.
                assert await until(start_on_paused, "the paused follower's start") == 1
                described = (await session.request("GET", f"/v1/dbs/{DB}")).json()
                assert described["offsets"][0]["end"] >= len(first) + len(second) > 0
            finally:
                await session.close()
        finally:
            await admin.close()

    run(main())
