"""Many shards per request: ``append_arrow(shards=)``, produce ``?shards=``, ``POST .../fetch``,
and the client's one request (one poll) for all of its shards, against a real ``seglog serve``."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pyarrow as pa
import pytest

import seglog
from seglog.client import Consumer, Producer
from seglog.cluster import fetch_wire, protocol
from seglog.errors import InvalidArgument, InvalidRequest
from seglog.record import decode_frames
from tests.server_fixtures import ServerProcess

DB = "m"
SHARDS = 16
WAIT_S = 60.0  # bound on waits for events; never a measured duration


def _ipc(*batches: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batches[0].schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def _batch(prefix: str, n: int) -> pa.RecordBatch:
    return pa.record_batch(
        {"topic": [f"{prefix}/{i}" for i in range(n)], "value": [b"%d" % i for i in range(n)]}
    )


async def _create(s: aiohttp.ClientSession, url: str, shards: int = SHARDS) -> None:
    async with s.post(f"{url}/v1/dbs", json={"name": DB, "shards": shards}) as r:
        assert r.status == 201, await r.text()


async def _counter(s: aiohttp.ClientSession, url: str, name: str) -> float:
    async with s.get(f"{url}/metrics") as r:
        text = await r.text()
    found = re.search(rf'^{name}{{db="{DB}"}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def test_append_arrow_shards_routes_each_row_and_rejects_bad_input(tmp_path: Path) -> None:
    async def main() -> None:
        async with seglog.open(tmp_path / "d") as store:
            db = await store.create_db("x", shards=4)
            table = pa.table({"topic": ["a", "b", "c", "d", "e"], "value": [b"1", b"2", b"3", b"4", b"5"]})
            got = await db.append_arrow(table, shards=np.array([3, 0, 3, 2, 0]))
            assert got.column("shard").to_pylist() == [3, 0, 3, 2, 0]
            assert got.column("offset").to_pylist() == [0, 0, 1, 0, 1]
            assert (await db.read_arrow(3, 0, 10)).column("value").to_pylist() == [b"1", b"3"]
            for bad, message in (
                (np.array([0, 1]), "2 entries for 5 rows"),
                (np.array([0, 1, 2, 3, 4]), r"0\.\.3, not 4"),
                (np.array([0, -1, 0, 0, 0]), "not -1"),
                (np.array([0.0] * 5), "integer"),
                (pa.array([0, None, 0, 0, 0]), "nulls"),
            ):
                with pytest.raises(InvalidArgument, match=message):
                    await db.append_arrow(table, shards=bad)
            with pytest.raises(InvalidArgument, match="not both"):
                await db.append_arrow(table, shard=1, shards=np.zeros(5, np.int32))
            # Nothing of the rejected appends was written.
            assert [db.end_offset(s) for s in range(4)] == [2, 0, 1, 2]

    asyncio.run(main())


def test_produce_shards_param_writes_each_batch_to_its_shard_all_or_nothing(server: ServerProcess) -> None:
    async def main() -> None:
        async with aiohttp.ClientSession() as s:
            await _create(s, server.url, shards=4)
            url = f"{server.url}/v1/dbs/{DB}/records"
            headers = {"Content-Type": protocol.ARROW_STREAM}
            body = _ipc(_batch("a", 3), _batch("b", 5), _batch("c", 2))
            async with s.post(url, params={"shards": "2,0,2"}, data=body, headers=headers) as r:
                assert r.status == 200, await r.text()
                reply = await r.json()
            assert reply["count"] == 10
            assert sorted((p["shard"], p["base_offset"], p["count"]) for p in reply["parts"]) == [
                (0, 0, 5),
                (2, 0, 5),
            ]
            for params, status, error in (
                ({"shards": "2,0"}, 400, "InvalidRequest"),  # three batches, two shards
                ({"shards": "2,0,9"}, 400, "InvalidArgument"),
                ({"shards": "2,x,1"}, 400, "InvalidRequest"),
                ({"shards": "2,0,1", "shard": "1"}, 400, "InvalidRequest"),
            ):
                async with s.post(url, params=params, data=body, headers=headers) as r:
                    assert r.status == status, params
                    assert (await r.json())["error"] == error
            ndjson = {"Content-Type": protocol.NDJSON}
            async with s.post(
                url, params={"shards": "1"}, data=b'{"topic":"t","value":"v"}', headers=ndjson
            ) as r:
                assert r.status == 400 and (await r.json())["error"] == "InvalidRequest"
            async with s.get(f"{server.url}/v1/dbs/{DB}") as r:
                ends = [o["end"] for o in (await r.json())["offsets"]]
            assert ends == [5, 0, 5, 0]  # the rejected requests wrote nothing

    asyncio.run(main())


def test_fetch_many_long_polls_all_shards_and_reports_out_of_range_per_shard(server: ServerProcess) -> None:
    async def main() -> None:
        async with aiohttp.ClientSession() as s:
            await _create(s, server.url, shards=4)
            url = f"{server.url}/v1/dbs/{DB}/fetch"

            async def fetch(offsets: dict[int, int], wait_ms: int = 0) -> list[fetch_wire.FetchPart]:
                body = fetch_wire.encode_shards_request(fetch_wire.ShardsRequest(offsets, wait_ms, 1 << 20))
                async with s.post(url, data=body, headers={"Content-Type": protocol.JSON}) as r:
                    assert r.status == 200, await r.text()
                    assert r.content_type == fetch_wire.FETCH_REPLY
                    return fetch_wire.decode_reply(await r.read())

            assert await fetch({0: 0, 1: 0, 2: 0, 3: 0}) == []  # nothing yet, no wait
            # A poll over every shard is answered by an append to any one of them.
            poll = asyncio.create_task(fetch({0: 0, 1: 0, 2: 0, 3: 0}, wait_ms=30_000))
            async with s.post(
                f"{server.url}/v1/dbs/{DB}/records",
                params={"shard": 3},
                data=_ipc(_batch("x", 7)),
                headers={"Content-Type": protocol.ARROW_STREAM},
            ) as r:
                assert r.status == 200
            (part,) = await asyncio.wait_for(poll, WAIT_S)
            assert (part.shard, part.high_watermark, part.log_end) == (3, 7, 7)
            assert decode_frames(part.frames, 0, part.high_watermark).num_rows == 7
            # Past the end of shard 1: that part is an error; shard 3 still answers.
            parts = {p.shard: p for p in await fetch({1: 5, 3: 2})}
            assert isinstance(parts[1].error, seglog.OffsetOutOfRange)
            assert (parts[1].error.start, parts[1].error.end) == (0, 0)
            assert decode_frames(parts[3].frames, 2, parts[3].high_watermark).num_rows == 5
            for body, status, error in (
                (b"[]", 400, "InvalidRequest"),
                (b'{"shards": {}, "wait_ms": 0, "max_bytes": 1}', 400, "InvalidRequest"),
                (b'{"shards": {"0": -1}, "wait_ms": 0, "max_bytes": 1}', 400, "InvalidRequest"),
                (b'{"shards": {"9": 0}, "wait_ms": 0, "max_bytes": 1}', 400, "InvalidArgument"),
                (b'{"shards": {"0": 0}, "wait_ms": 0, "max_bytes": 0}', 400, "InvalidRequest"),
            ):
                async with s.post(url, data=body, headers={"Content-Type": protocol.JSON}) as r:
                    assert r.status == status, body
                    assert (await r.json())["error"] == error
            async with s.post(url, data=b"{}", headers={"Content-Type": "text/plain"}) as r:
                assert r.status == 415

    asyncio.run(main())


def test_fetch_wire_shards_request_round_trip_and_arrow_parts() -> None:
    for asked in (
        fetch_wire.ShardsRequest({3: 10, 0: 0}, 5, 7),
        fetch_wire.ShardsRequest({1: 0}, 0, 1, leader_only=True),
    ):
        got = fetch_wire.decode_shards_request(fetch_wire.encode_shards_request(asked))
        assert got == asked and list(got.offsets) == list(asked.offsets)  # the order is kept
    for bad in (
        b'{"shards": {"a": 1}, "wait_ms": 0, "max_bytes": 1}',
        b'{"shards": {"1": 1}, "wait_ms": 0, "max_bytes": 1, "leader_only": 1}',
    ):
        with pytest.raises(InvalidRequest):
            fetch_wire.decode_shards_request(bad)
    parts = [
        fetch_wire.FetchPart("d", 1, b"rows", 5, 0, 5, arrow=True),
        fetch_wire.FetchPart("d", 2, b"frames", 9, 0, 9),
    ]
    assert fetch_wire.decode_reply(fetch_wire.encode_reply(parts)) == parts


def test_producer_sends_many_shards_per_request_and_consumer_polls_them_together(
    server: ServerProcess,
) -> None:
    """16 shards: the producer's requests and the consumer's polls do not scale with the shard
    count (one per shard each would be 16 per round), and every record lands where its
    ``RecordMeta`` says, in send order per shard."""
    rounds, per_round = 6, 400

    async def main() -> None:
        async with aiohttp.ClientSession() as s:
            await _create(s, server.url)
            async with (
                Producer(server.url, DB, acks=1, linger_ms=50) as p,
                Consumer(server.url, DB, max_wait_ms=30_000) as c,
            ):
                fetches0 = await _counter(s, server.url, "seglog_fetch_requests_total")
                metas = []
                received: dict[int, list[pa.Table]] = {}
                for r in range(rounds):
                    futs = [
                        await p.send(f"dev/{i}", b"r%d-%d" % (r, i), key=b"k%d" % i) for i in range(per_round)
                    ]
                    await p.flush()
                    metas += [await f for f in futs]
                    want = (r + 1) * per_round
                    while sum(t.num_rows for ts in received.values() for t in ts) < want:
                        for shard, table in (await c.getmany_arrow(timeout_ms=int(WAIT_S * 1000))).items():
                            received.setdefault(shard, []).append(table)
                fetches = await _counter(s, server.url, "seglog_fetch_requests_total") - fetches0
                assert len({m.shard for m in metas}) == SHARDS
                # One request per flush of all 16 shards (a retry or two of slack), not 16.
                assert p.sent_requests <= rounds + 2, p.sent_requests
                # One poll per round (the reply of an early wake-up may leave a second), not 16.
                assert fetches <= 3 * rounds, fetches
        for shard, tables in received.items():
            table = pa.concat_tables(tables)
            mine = sorted((m.offset, i) for i, m in enumerate(metas) if m.shard == shard)
            assert table.column("offset").to_pylist() == [o for o, _ in mine]
            values = [b"r%d-%d" % (i // per_round, i % per_round) for _, i in mine]
            assert table.column("value").to_pylist() == values

    asyncio.run(main())


def test_tailed_shards_rows_reach_their_segments_in_the_append(tmp_path: Path) -> None:
    """Keyed rows spread over shards wait in memory (journaled); a shard read as frames
    recently gets its rows written into its segment by the append itself."""

    async def main() -> None:
        async with seglog.open(tmp_path / "d", fsync="always") as store:
            db = await store.create_db("x", shards=4)
            table = pa.table(
                {"topic": ["t"] * 40, "key": [b"k%d" % i for i in range(40)], "value": [b"v"] * 40}
            )
            await db.append_arrow(table)
            assert await db.read_frames(2, 0) != b""  # shard 2 is tailed from now on
            before = {s: db.end_offset(s) for s in range(4)}
            await db.append_arrow(table)
            engine: Any = db._engine  # white box: which shards still hold buffered rows
            pending = {s.number for s in engine._shards if s.has_pending}
            assert 2 not in pending
            assert pending == {0, 1, 3}
            frames = await db.read_frames(2, before[2])
            assert decode_frames(frames, before[2], db.end_offset(2)).num_rows == db.end_offset(2) - before[2]

    asyncio.run(main())


def test_protocol_lists_the_fetch_route() -> None:
    assert "POST     /v1/dbs/{db}/fetch" in (protocol.__doc__ or "")
    body = fetch_wire.encode_shards_request(fetch_wire.ShardsRequest({1: 2}, 0, 1))
    assert json.loads(body) == {"wait_ms": 0, "max_bytes": 1, "shards": {"1": 2}}
