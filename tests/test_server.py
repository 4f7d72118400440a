"""The node server over real sockets: produce, fetch, long poll, errors, graceful shutdown."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pyarrow as pa

import seglog
from seglog.cluster import protocol
from seglog.record import decode_frames
from tests.server_fixtures import ServerProcess

DB = "t"


async def _create(session: aiohttp.ClientSession, url: str, shards: int = 2) -> dict[str, Any]:
    async with session.post(f"{url}/v1/dbs", json={"name": DB, "shards": shards}) as r:
        assert r.status == 201, await r.text()
        assert r.headers[protocol.HEADER_NODE] == protocol.WIRE_VERSION
        body: dict[str, Any] = await r.json()
        return body


def _arrow_body(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


async def _fetch(
    session: aiohttp.ClientSession, url: str, shard: int, offset: int, wait_ms: int = 0
) -> tuple[pa.Table, dict[str, int]]:
    params = {"offset": offset, "wait_ms": wait_ms}
    async with session.get(f"{url}/v1/dbs/{DB}/shards/{shard}/frames", params=params) as r:
        assert r.status == 200, await r.text()
        assert r.content_type == protocol.FRAMES
        assert r.headers[protocol.HEADER_NODE] == protocol.WIRE_VERSION  # long polls too
        marks = {
            "start": int(r.headers[protocol.HEADER_LOG_START]),
            "end": int(r.headers[protocol.HEADER_LOG_END]),
            "hw": int(r.headers[protocol.HEADER_HIGH_WATERMARK]),
        }
        return decode_frames(await r.read(), offset, marks["hw"]), marks


def test_json_and_arrow_round_trip_and_stored_frames(server: ServerProcess) -> None:
    async def main() -> None:
        async with aiohttp.ClientSession() as s:
            await _create(s, server.url)
            lines = [{"topic": f"dev/{i}", "value": f"v{i}", "key": f"k{i}"} for i in range(50)]
            lines.append({"topic": "bin", "value": {"base64": "AAEC"}, "headers": {"h": "x"}})
            body = "\n".join(json.dumps(x) for x in lines).encode()
            async with s.post(
                f"{server.url}/v1/dbs/{DB}/records", data=body, headers={"Content-Type": protocol.NDJSON}
            ) as r:
                assert r.status == 200, await r.text()
                reply = await r.json()
            assert reply["count"] == 51
            assert sum(p["count"] for p in reply["parts"]) == 51
            table = pa.table({"topic": ["arrow/x"] * 100, "value": [b"%d" % i for i in range(100)]})
            async with s.post(
                f"{server.url}/v1/dbs/{DB}/records?shard=1",
                data=_arrow_body(table),
                headers={"Content-Type": protocol.ARROW_STREAM},
            ) as r:
                assert r.status == 200, await r.text()
                reply = await r.json()
            (part,) = reply["parts"]
            assert part["shard"] == 1 and part["count"] == 100
            got, marks = await _fetch(s, server.url, 1, part["base_offset"])
            assert marks["hw"] == marks["end"] == part["base_offset"] + 100
            assert got.column("value").to_pylist()[-100:] == [b"%d" % i for i in range(100)]

    asyncio.run(main())
    assert server.stop() == 0
    # What the server acknowledged is in the store, byte for byte as fetched.

    async def check() -> None:
        async with seglog.open(server.data) as store:
            db = await store.open_db(DB)
            values = []
            for shard in range(2):
                values += [r.value for r in await db.read(shard, 0, 1000)]
            assert b"\x00\x01\x02" in values and b"v7" in values and b"99" in values
            assert len(values) == 151

    asyncio.run(check())


def test_every_reply_says_it_comes_from_a_node(server: ServerProcess) -> None:
    """The client tells a node's 2xx reply from another service's by this header (errors,
    unknown paths, metrics and long polls included)."""

    async def main() -> None:
        async with aiohttp.ClientSession() as s:
            await _create(s, server.url, shards=1)
            requests: list[tuple[str, str, Any]] = [
                ("GET", "/healthz", None),
                ("GET", "/metrics", None),
                ("GET", "/v1/dbs", None),
                ("GET", f"/v1/dbs/{DB}", None),
                ("GET", "/v1/dbs/nope", None),
                ("GET", "/no/such/path", None),
                ("PUT", "/v1/dbs", None),
                ("POST", f"/v1/dbs/{DB}/fetch", {"shards": {"0": 0}, "wait_ms": 50, "max_bytes": 1 << 20}),
                ("POST", f"/v1/dbs/{DB}/groups/g/join", {"session_timeout_ms": 10_000}),
            ]
            statuses = []
            for method, path, body in requests:
                async with s.request(method, server.url + path, json=body) as r:
                    await r.read()
                    assert r.headers.get(protocol.HEADER_NODE) == protocol.WIRE_VERSION, (method, path)
                    statuses.append(r.status)
            assert statuses == [200, 200, 200, 200, 404, 404, 405, 200, 200]

    asyncio.run(main())


def test_long_poll_is_woken_by_an_append(server: ServerProcess) -> None:
    async def main() -> None:
        async with aiohttp.ClientSession() as s:
            await _create(s, server.url, shards=1)
            waiting = asyncio.create_task(_fetch(s, server.url, 0, 0, wait_ms=120_000))
            # The poll is parked (nothing to return); an append must wake it long before 120 s.
            done, _ = await asyncio.wait({waiting}, timeout=0.2)
            assert not done, "a fetch at the end returned without waiting"
            body = json.dumps({"topic": "a", "value": "woke"}).encode()
            async with s.post(
                f"{server.url}/v1/dbs/{DB}/records", data=body, headers={"Content-Type": protocol.NDJSON}
            ) as r:
                assert r.status == 200
            table, marks = await asyncio.wait_for(waiting, 60)
            assert table.column("value").to_pylist() == [b"woke"] and marks["hw"] == 1

    asyncio.run(main())


def test_errors_have_one_shape_and_write_nothing(server: ServerProcess) -> None:
    async def main() -> None:
        async with aiohttp.ClientSession() as s:
            await _create(s, server.url, shards=1)
            cases = [
                ("GET", f"/v1/dbs/{DB}/shards/0/frames?offset=5", None, None, 416, "OffsetOutOfRange"),
                ("GET", f"/v1/dbs/{DB}/shards/0/frames?offset=-1", None, None, 400, "InvalidRequest"),
                ("GET", f"/v1/dbs/{DB}/shards/7/frames", None, None, 400, "InvalidArgument"),
                ("GET", "/v1/dbs/..%2Fetc/shards/0/frames", None, None, 400, "InvalidName"),
                ("GET", "/v1/dbs/nope", None, None, 404, "DatabaseNotFound"),
                ("POST", f"/v1/dbs/{DB}/records", b"x", "text/plain", 415, "UnsupportedContentType"),
                (
                    "POST",
                    f"/v1/dbs/{DB}/records",
                    b"\xff\xff\xff\xff",
                    protocol.ARROW_STREAM,
                    400,
                    "InvalidRequest",
                ),
                (
                    "POST",
                    f"/v1/dbs/{DB}/records",
                    b'{"topic": "ok", "value": "1"}\n{"topic": "a/+", "value": "2"}\n',
                    protocol.NDJSON,
                    400,
                    "InvalidTopic",
                ),
                ("POST", "/v1/dbs", b'{"name": "t"}', protocol.JSON, 409, "DatabaseExists"),
                ("GET", "/nope", None, None, 404, "InvalidRequest"),
            ]
            for method, path, body, ctype, status, name in cases:
                headers = {"Content-Type": ctype} if ctype else {}
                async with s.request(method, server.url + path, data=body, headers=headers) as r:
                    payload = await r.json()
                    assert (r.status, payload["error"]) == (status, name), (path, payload)
                    assert "Traceback" not in payload["message"]
            err = protocol.error_from_payload(
                416, {"error": "OffsetOutOfRange", "message": "m", "start": 0, "end": 0}
            )
            assert isinstance(err, seglog.OffsetOutOfRange) and err.end == 0
            async with s.get(f"{server.url}/v1/dbs/{DB}") as r:
                described = await r.json()
            assert described["offsets"][0]["end"] == 0  # the rejected batch wrote nothing

    asyncio.run(main())


def test_sigterm_shuts_down_gracefully(server: ServerProcess, tmp_path: Path) -> None:
    async def main() -> None:
        async with aiohttp.ClientSession() as s:
            await _create(s, server.url, shards=1)
            parked = asyncio.create_task(_fetch(s, server.url, 0, 0, wait_ms=120_000))
            done, _ = await asyncio.wait({parked}, timeout=0.2)
            assert not done
            assert server.proc is not None
            server.proc.terminate()
            # Shutdown wakes the long poll (an empty answer) instead of cutting it off.
            table, _ = await asyncio.wait_for(parked, 60)
            assert table.num_rows == 0

    asyncio.run(main())
    assert server.stop() == 0
    assert "shutting down" in "".join(server.output)
