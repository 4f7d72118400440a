"""seglog.client.Consumer against a real node: reading, positions, long-poll tailing, commits."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import pyarrow as pa
import pytest

from seglog.client import Consumer, Producer
from seglog.cluster import protocol
from seglog.errors import CorruptFrame, DatabaseNotFound, InvalidArgument, UnknownMember
from seglog.record import READ_SCHEMA
from tests.etcd_fixtures import EtcdProcess
from tests.fault_proxy import FaultProxy
from tests.server_fixtures import ServerFactory, ServerProcess

DB = "c"
SHARDS = 3
PER_SHARD = 20
TS0 = 1_700_000_000_000_000
WAIT_S = 60.0  # generous bound on waits for events; never a measured duration


async def _produce(url: str, shard: int, lines: list[dict[str, Any]]) -> dict[str, Any]:
    body = "\n".join(json.dumps(x) for x in lines).encode()
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            f"{url}/v1/dbs/{DB}/records?shard={shard}", data=body, headers={"Content-Type": protocol.NDJSON}
        ) as r,
    ):
        assert r.status == 200, await r.text()
        reply: dict[str, Any] = await r.json()
        return reply


async def _setup(url: str) -> None:
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{url}/v1/dbs", json={"name": DB, "shards": SHARDS}) as r,
    ):
        assert r.status == 201, await r.text()
    for shard in range(SHARDS):
        lines = [
            {"topic": f"s{shard}", "value": f"{shard}:{i}", "ts": TS0 + i * 1000, "key": f"k{i}"}
            for i in range(PER_SHARD)
        ]
        await _produce(url, shard, lines)


def _expected(shard: int, start: int = 0) -> list[bytes]:
    return [f"{shard}:{i}".encode() for i in range(start, PER_SHARD)]


async def _drain(c: Consumer, total: int) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = {}
    async with asyncio.timeout(WAIT_S):
        while sum(len(v) for v in out.values()) < total:
            for shard, recs in (await c.getmany(timeout_ms=None, max_records=7)).items():
                out.setdefault(shard, []).extend(recs)
    return out


def test_getmany_getmany_arrow_and_async_for_round_trip_every_shard(server: ServerProcess) -> None:
    async def main() -> None:
        await _setup(server.url)
        async with Consumer(server.url, DB) as c:
            assert c.assignment() == [0, 1, 2] and c.position(1) == 0
            got = await _drain(c, SHARDS * PER_SHARD)
            for shard in range(SHARDS):
                assert [r.value for r in got[shard]] == _expected(shard)
                assert [r.offset for r in got[shard]] == list(range(PER_SHARD))
                assert {r.shard for r in got[shard]} == {shard} and got[shard][3].key == b"k3"
                assert got[shard][5].ts == TS0 + 5000 and c.position(shard) == PER_SHARD
            assert await c.getmany(timeout_ms=0) == {}

        async with Consumer(server.url, DB, shards=[2, 0]) as c:
            assert c.assignment() == [0, 2]
            tables: dict[int, list[pa.Table]] = {}
            async with asyncio.timeout(WAIT_S):
                while sum(t.num_rows for ts in tables.values() for t in ts) < 2 * PER_SHARD:
                    for shard, table in (await c.getmany_arrow(timeout_ms=None)).items():
                        tables.setdefault(shard, []).append(table)
            assert set(tables) == {0, 2}
            for shard, parts in tables.items():
                table = pa.concat_tables(parts)
                assert table.schema == READ_SCHEMA
                assert table.column("offset").to_pylist() == list(range(PER_SHARD))
                assert table.column("value").to_pylist() == _expected(shard)

        async with Consumer(server.url, DB, shards=[1]) as c:
            seen = []
            async for rec in c:
                seen.append(rec)
                assert c.position(1) == rec.offset + 1  # positions move per record yielded
                if len(seen) == 5:
                    # Mixing: getmany continues exactly after the last record yielded.
                    rest = await _drain(c, PER_SHARD - 5)
                    seen += rest[1]
                    break
            assert [r.value for r in seen] == _expected(1)

    asyncio.run(main())


def test_seek_offsets_for_times_end_offsets_and_out_of_range_reset(server: ServerProcess) -> None:
    async def main() -> None:
        await _setup(server.url)
        async with Consumer(server.url, DB, shards=[0, 1]) as c:
            assert await c.end_offsets([0, 1, 2]) == {0: PER_SHARD, 1: PER_SHARD, 2: PER_SHARD}
            assert await c.offsets_for_times({0: TS0 + 7000, 1: TS0 + 7001, 2: TS0 + 10**9}) == {
                0: 7,
                1: 8,
                2: PER_SHARD,
            }
            c.seek(0, 15)
            assert c.position(0) == 15
            await c.seek_to_end(1)
            assert c.position(1) == PER_SHARD
            got = await _drain(c, PER_SHARD - 15)
            assert [r.value for r in got[0]] == _expected(0, 15) and 1 not in got
            await c.seek_to_beginning(0)
            got = await _drain(c, PER_SHARD)
            assert [r.offset for r in got[0]] == list(range(PER_SHARD))
            # Past the end: the node says OffsetOutOfRange, the consumer resets (earliest).
            c.seek(1, 10**6)
            got = await _drain(c, PER_SHARD)
            assert [r.value for r in got[1]] == _expected(1)
            with pytest.raises(InvalidArgument):
                c.position(2)  # not assigned
            with pytest.raises(InvalidArgument):
                c.seek(0, -1)
            with pytest.raises(InvalidArgument):
                await c.commit()  # no group: nowhere to commit

        async with Consumer(server.url, DB, shards=[0], from_time_us=TS0 + 12_000) as c:
            got = await _drain(c, PER_SHARD - 12)
            assert [r.offset for r in got[0]] == list(range(12, PER_SHARD))

        async with Consumer(server.url, DB, auto_offset_reset="latest") as c:
            assert {s: c.position(s) for s in range(SHARDS)} == dict.fromkeys(range(SHARDS), PER_SHARD)

    asyncio.run(main())


def test_a_tailing_consumer_is_woken_by_the_long_poll(server: ServerProcess) -> None:
    async def main() -> None:
        await _setup(server.url)
        # Polls park for up to 30 s (the node's cap): a record arriving well within the
        # wait below came from a poll woken by the append, not from a poll that timed out.
        async with Consumer(server.url, DB, auto_offset_reset="latest", max_wait_ms=30_000) as c:
            waiting = asyncio.create_task(c.getmany(timeout_ms=None))
            done, _ = await asyncio.wait({waiting}, timeout=0.2)
            assert not done, "nothing new was produced, yet getmany returned"
            reply = await _produce(server.url, 2, [{"topic": "late", "value": "news"}])
            assert reply["parts"][0]["base_offset"] == PER_SHARD
            got = await asyncio.wait_for(waiting, 15)
            assert list(got) == [2] and [(r.offset, r.value) for r in got[2]] == [(PER_SHARD, b"news")]

    asyncio.run(main())


def test_commits_survive_a_server_restart(server: ServerProcess) -> None:
    async def main_before() -> None:
        await _setup(server.url)
        async with Consumer(server.url, DB, group="keep") as c:
            assert c.assignment() == [0, 1, 2] and c.member_id is not None
            await _drain(c, 2 * PER_SHARD + 4)  # max_records=7: some shards only partly read
            positions = {s: c.position(s) for s in range(SHARDS)}
            await c.commit()
            assert {s: await c.committed(s) for s in range(SHARDS)} == positions
            await c.commit({1: 4})
            assert await c.committed(1) == 4

    asyncio.run(main_before())
    assert server.stop() == 0
    server.restart()

    async def main_after() -> None:
        async with Consumer(server.url, DB, group="keep") as c:
            # Memberships are gone with the old process; the commits are durable.
            committed = {s: await c.committed(s) for s in range(SHARDS)}
            assert committed[1] == 4 and all(v is not None for v in committed.values())
            assert {s: c.position(s) for s in range(SHARDS)} == committed
            rest = sum(PER_SHARD - v for v in committed.values() if v is not None)
            got = await _drain(c, rest)
            assert [r.offset for r in got[1]] == list(range(4, PER_SHARD))
        async with Consumer(server.url, DB, group="keep", shards=[0]) as manual:
            # No members left: a manually assigned consumer of the group may commit.
            await manual.commit({0: 1})
            assert await manual.committed(0) == 1
            async with Consumer(server.url, DB, group="keep") as member:
                assert member.position(0) == 1
                with pytest.raises(UnknownMember):
                    await manual.commit({0: 2})  # the group has a member now

    asyncio.run(main_after())


def test_a_frame_corrupted_on_the_way_fails_the_consumer_instead_of_stalling_it(
    server: ServerProcess,
) -> None:
    """A fetch reply whose frame a middlebox mangled (a bit flipped after the node's own CRC
    check) is refused by the client's CRC check and raised from ``getmany``. Before, the check
    raised inside the fetch task and ended it: the consumer waited forever, silent."""
    marker = b"needle-7f3a"
    proxy = FaultProxy()
    proxy.set_target(server.url)

    async def main() -> None:
        await _setup(server.url)
        await _produce(server.url, 1, [{"topic": "s1", "value": marker.decode(), "ts": TS0 + 10**6}])
        proxy.corrupt_replies(marker)
        async with Consumer(proxy.url, DB, shards=[1], auto_offset_reset="earliest") as c:
            with pytest.raises(CorruptFrame):
                async with asyncio.timeout(WAIT_S):
                    while True:
                        await c.getmany(timeout_ms=None)
        # The same shard through an honest link reads whole.
        proxy.heal()
        async with Consumer(proxy.url, DB, shards=[1], auto_offset_reset="earliest") as c:
            got = await _drain(c, PER_SHARD + 1)
            assert got[1][-1].value == marker

    try:
        asyncio.run(main())
    finally:
        proxy.close()


def test_a_database_dropped_while_a_bootstrap_consumer_reroutes_is_raised(
    server_factory: ServerFactory, etcd: EtcdProcess
) -> None:
    """A cluster consumer cut off from its leader re-routes; if the database is dropped
    meanwhile, the re-route finds no leader to ask and ``getmany`` raises DatabaseNotFound.
    Before, that error ended the routing task and the consumer waited forever."""
    proxy = FaultProxy()  # every client byte goes through it: the node advertises it
    node = server_factory("--etcd", etcd.url, "--node-id", "1", "--node-ttl-s", "2", "--advertise", proxy.url)
    proxy.set_target(node.url)

    async def main() -> None:
        async with aiohttp.ClientSession() as s:
            body = {"name": "r", "shards": 2, "replication_factor": 1, "min_insync": 1}
            async with s.post(f"{node.url}/v1/dbs", json=body) as r:
                assert r.status == 201, await r.text()
            deadline = time.monotonic() + WAIT_S
            while True:  # the node creates its copy and leads asynchronously
                async with s.get(f"{node.url}/v1/cluster") as r:
                    state = (await r.json())["dbs"].get("r", {}).get("state", [])
                if len(state) == 2 and all(x["leader"] == 1 for x in state):
                    break
                assert time.monotonic() < deadline, state
                await asyncio.sleep(0.05)  # polling the metadata with a deadline
            async with Producer(proxy.url, "r", bootstrap=[proxy.url]) as p:
                await p.send_and_wait("a", b"1")
            async with Consumer(proxy.url, "r", bootstrap=[proxy.url], auto_offset_reset="earliest") as c:
                assert [r.value for rs in (await c.getmany(timeout_ms=None)).values() for r in rs] == [b"1"]
                proxy.cut()
                async with s.delete(f"{node.url}/v1/dbs/r") as r:
                    assert r.status == 200, await r.text()
                # Healed once the consumer is between attempts (each a growing pause): its next
                # step is a metadata refresh that no longer lists the database.
                async with asyncio.timeout(WAIT_S):
                    while c._reroutes < 3:
                        await asyncio.sleep(0.01)  # polling the consumer's state with a deadline
                proxy.heal()
                with pytest.raises(DatabaseNotFound):
                    async with asyncio.timeout(WAIT_S):
                        while True:
                            await c.getmany(timeout_ms=None)

    try:
        asyncio.run(main())
    finally:
        proxy.close()
