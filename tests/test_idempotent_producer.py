"""The network producer is idempotent: a batch whose reply was lost is retried, not duplicated.

A real server process behind a TCP proxy that forwards requests and throws the replies away
(the request is carried out; the producer cannot know): with ``idempotent=False`` the retries
store the batch again, with the default they do not, and every future gets the offset its
record was first stored at.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator

import aiohttp
import pyarrow as pa
import pytest

from seglog.client import Consumer, Producer
from seglog.cluster import protocol
from tests.fault_proxy import FaultProxy
from tests.server_fixtures import ServerProcess

DB = "idem"
SHARDS = 4
RECORDS = 200
WAIT_S = 30.0


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    p = FaultProxy()
    yield p
    p.close()


async def _ends(url: str) -> int:
    async with Consumer(url, DB) as c:
        return sum((await c.end_offsets(c.assignment())).values())


async def _stored(url: str) -> dict[tuple[int, int], bytes]:
    async with Consumer(url, DB) as c:
        shards = c.assignment()
        ends = await c.end_offsets(shards)
        out: dict[tuple[int, int], bytes] = {}
        async with asyncio.timeout(WAIT_S):
            while any(c.position(s) < ends[s] for s in shards):
                for shard, recs in (await c.getmany(timeout_ms=500)).items():
                    out.update({(shard, r.offset): r.value for r in recs})  # type: ignore[misc]
        return out


async def _until(cond: object, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not await cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("idempotent", [True, False])
def test_a_lost_reply_is_retried_without_a_duplicate(
    server: ServerProcess, proxy: FaultProxy, idempotent: bool
) -> None:
    async def main() -> None:
        async with (
            aiohttp.ClientSession() as s,
            s.post(f"{server.url}/v1/dbs", json={"name": DB, "shards": SHARDS}) as r,
        ):
            assert r.status == 201, await r.text()
        proxy.set_target(server.url)
        async with Producer(
            proxy.url,
            DB,
            idempotent=idempotent,
            request_timeout_ms=400,
            retry_backoff_ms=20,
            retries=None,
            linger_ms=50,
        ) as p:
            await p.send_and_wait("warm/up", b"first", key=b"w")
            proxy.drop_replies()
            futures = [await p.send(f"dev/{i}", b"v%d" % i, key=b"k%d" % i) for i in range(RECORDS)]

            async def written() -> bool:
                return await _ends(server.url) >= RECORDS + 1

            async def retried() -> bool:
                return p.retried_requests >= 2

            await _until(written, "the first attempt to be stored")
            await _until(retried, "retries whose replies are lost too")
            proxy.heal()
            metas = [await f for f in futures]
        stored = await _stored(server.url)
        counts = Counter(stored.values())
        if not idempotent:
            # The control: without producer ids the same faults store batches twice.
            assert max(counts.values()) > 1
            return
        assert len(stored) == RECORDS + 1 and max(counts.values()) == 1
        assert [stored[(m.shard, m.offset)] for m in metas] == [b"v%d" % i for i in range(RECORDS)]

    asyncio.run(main())


def test_producer_ids_survive_a_restart_and_bad_parameters_are_refused(server: ServerProcess) -> None:
    async def ids(n: int) -> list[int]:
        async with aiohttp.ClientSession() as s:
            out = []
            for _ in range(n):
                async with s.post(f"{server.url}/v1/dbs/{DB}/producer-id") as r:
                    assert r.status == 200, await r.text()
                    out.append((await r.json())["producer_id"])
            return out

    async def post(params: dict[str, str], body: bytes, content_type: str) -> tuple[int, dict[str, object]]:
        async with (
            aiohttp.ClientSession() as s,
            s.post(
                f"{server.url}/v1/dbs/{DB}/records",
                params=params,
                data=body,
                headers={"Content-Type": content_type},
            ) as r,
        ):
            return r.status, await r.json()

    async def main() -> None:
        async with (
            aiohttp.ClientSession() as s,
            s.post(f"{server.url}/v1/dbs", json={"name": DB, "shards": 1}) as r,
        ):
            assert r.status == 201
        before = await ids(3)
        await asyncio.to_thread(server.kill)  # SIGKILL: the counter was persisted before replying
        await asyncio.to_thread(server.restart)
        after = await ids(3)
        assert len(set(before + after)) == 6 and min(after) > max(before)
        arrow = pa.table({"topic": ["a/b"], "value": [b"v"]})
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, arrow.schema) as w:
            w.write_table(arrow)
        body = sink.getvalue().to_pybytes()
        for params, content_type, error in [
            ({"producer_id": "1"}, protocol.ARROW_STREAM, "InvalidRequest"),  # no seqs
            ({"seqs": "0"}, protocol.ARROW_STREAM, "InvalidRequest"),  # no producer id
            ({"producer_id": "1", "seqs": "x"}, protocol.ARROW_STREAM, "InvalidRequest"),
            ({"producer_id": "1", "seqs": "-1"}, protocol.ARROW_STREAM, "InvalidRequest"),
            ({"producer_id": "1", "seqs": "0,1"}, protocol.ARROW_STREAM, "InvalidRequest"),  # one batch
            ({"producer_id": "-5", "seqs": "0"}, protocol.ARROW_STREAM, "InvalidRequest"),
            ({"producer_id": "1", "seqs": "0"}, protocol.NDJSON, "InvalidRequest"),
        ]:
            status, reply = await post({"shard": "0", **params}, body, content_type)
            assert (status, reply["error"]) == (400, error), (params, reply)
        status, reply = await post(
            {"shard": "0", "producer_id": "1", "seqs": "0"}, body, protocol.ARROW_STREAM
        )
        assert status == 200 and reply["parts"] == [{"shard": 0, "base_offset": 0, "count": 1}]
        status, reply = await post(
            {"shard": "0", "producer_id": "1", "seqs": "5"}, body, protocol.ARROW_STREAM
        )
        assert (status, reply["error"], reply["expected"], reply["got"]) == (409, "OutOfOrderSequence", 1, 5)
        assert await _ends(server.url) == 1  # nothing of the refused requests was written

    asyncio.run(main())
