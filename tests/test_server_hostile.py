"""Hostile input against a real ``seglog serve``: every case gets its status and error class,
no traceback, and nothing is written."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any, Final

import aiohttp
import pyarrow as pa

from seglog.cluster import protocol
from tests.server_fixtures import ServerFactory, ServerProcess

DB: Final = "t"
MAX_BODY: Final = 64 << 10
# Long enough for a request in the test to arrive, short enough for a test to wait on.
IDLE_S: Final = "0.5"
# What a test waits at most for the server to close a stalled socket (a deadline, not a pace).
EOF_DEADLINE_S: Final = 30.0


def _arrow_body(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def _ndjson(n: int, value: str = "v") -> bytes:
    return b"\n".join(json.dumps({"topic": f"d/{i}", "value": value}).encode() for i in range(n))


async def _ends(s: aiohttp.ClientSession, url: str, db: str = DB) -> list[int]:
    async with s.get(f"{url}/v1/dbs/{db}") as r:
        assert r.status == 200, await r.text()
        return [o["end"] for o in (await r.json())["offsets"]]


async def _create(s: aiohttp.ClientSession, url: str, shards: int = 2) -> None:
    async with s.post(f"{url}/v1/dbs", json={"name": DB, "shards": shards}) as r:
        assert r.status == 201, await r.text()


async def _expect(r: aiohttp.ClientResponse, status: int, error: str, what: object = None) -> dict[str, Any]:
    text = await r.text()
    assert "Traceback" not in text and 'File "' not in text, (what, text)
    assert r.content_type == protocol.JSON, (what, r.content_type, text)
    assert r.headers.get(protocol.HEADER_NODE) == protocol.WIRE_VERSION, what
    payload: dict[str, Any] = json.loads(text)
    assert (r.status, payload["error"]) == (status, error), (what, r.status, payload)
    assert isinstance(payload["message"], str) and payload["message"]
    return payload


def _raw(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=EOF_DEADLINE_S)
    return sock


def _read_to_eof(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes; ``socket.timeout`` if it never does."""
    chunks = []
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def test_hostile_requests_get_their_error_and_write_nothing(server_factory: ServerFactory) -> None:
    server = server_factory("--max-body-bytes", str(MAX_BODY))
    good = _arrow_body(pa.table({"topic": ["a"] * 200, "value": [b"x" * 50] * 200}))
    records = f"/v1/dbs/{DB}/records"
    frames = f"/v1/dbs/{DB}/shards/0/frames"
    arrow, nd, js = protocol.ARROW_STREAM, protocol.NDJSON, protocol.JSON
    cases: list[tuple[str, str, bytes | None, str | None, int, str]] = [
        # Oversize bodies, both encodings.
        ("POST", records, _ndjson(2000, "x" * 40), nd, 413, "RequestTooLarge"),
        (
            "POST",
            records,
            _arrow_body(pa.table({"topic": ["a"], "value": [b"x" * MAX_BODY]})),
            arrow,
            413,
            "RequestTooLarge",
        ),
        # Truncated and garbage Arrow streams.
        ("POST", records, good[: len(good) // 2], arrow, 400, "InvalidRequest"),
        ("POST", records, good[:7], arrow, 400, "InvalidRequest"),
        ("POST", records, b"", arrow, 400, "InvalidRequest"),
        # Wrong content types.
        ("POST", records, _ndjson(3), "text/plain", 415, "UnsupportedContentType"),
        ("POST", records, _ndjson(3), js, 415, "UnsupportedContentType"),
        ("POST", "/v1/dbs", b'{"name": "u"}', "text/csv", 415, "UnsupportedContentType"),
        # Bad names, in the path and in a create.
        ("GET", "/v1/dbs/%2e%2e", None, None, 400, "InvalidName"),
        ("GET", "/v1/dbs/..%2Fx/shards/0/frames", None, None, 400, "InvalidName"),
        ("POST", "/v1/dbs/..%2Fx/records", _ndjson(1), nd, 400, "InvalidName"),
        ("GET", "/v1/dbs/" + "a" * 300, None, None, 400, "InvalidName"),
        ("GET", "/v1/dbs/a%00b", None, None, 400, "InvalidName"),
        ("POST", "/v1/dbs", b'{"name": "../x"}', js, 400, "InvalidName"),
        ("POST", "/v1/dbs", json.dumps({"name": "n" * 5000}).encode(), js, 400, "InvalidName"),
        # Offsets and sizes out of their domain.
        ("GET", frames + "?offset=-1", None, None, 400, "InvalidRequest"),
        ("GET", frames + f"?offset={2**63}", None, None, 400, "InvalidRequest"),
        ("GET", frames + "?offset=" + "9" * 5000, None, None, 400, "InvalidRequest"),
        ("GET", frames + f"?offset={2**63 - 1}", None, None, 416, "OffsetOutOfRange"),
        ("GET", frames + "?offset=1e3", None, None, 400, "InvalidRequest"),
        ("GET", frames + "?offset=abc", None, None, 400, "InvalidRequest"),
        ("GET", frames + "?max_bytes=0", None, None, 400, "InvalidRequest"),
        ("GET", frames + "?max_bytes=-5", None, None, 400, "InvalidRequest"),
        ("GET", frames + f"?max_bytes={10**30}", None, None, 400, "InvalidRequest"),
        ("GET", frames + "?wait_ms=-1", None, None, 400, "InvalidRequest"),
        ("GET", f"/v1/dbs/{DB}/shards/-1/frames", None, None, 400, "InvalidRequest"),
        ("GET", f"/v1/dbs/{DB}/shards/{10**40}/frames", None, None, 400, "InvalidRequest"),
        ("POST", records + "?shard=2", _ndjson(1), nd, 400, "InvalidRequest"),
        ("POST", records + "?shard=-1", _ndjson(1), nd, 400, "InvalidRequest"),
        # Unknown databases.
        ("GET", "/v1/dbs/nope", None, None, 404, "DatabaseNotFound"),
        ("POST", "/v1/dbs/nope/records", _ndjson(1), nd, 404, "DatabaseNotFound"),
        ("GET", "/v1/dbs/nope/shards/0/frames", None, None, 404, "DatabaseNotFound"),
        ("DELETE", "/v1/dbs/nope", None, None, 404, "DatabaseNotFound"),
        # JSON bodies that are not objects, or not JSON.
        ("POST", "/v1/dbs", b"[1, 2]", js, 400, "InvalidRequest"),
        ("POST", "/v1/dbs", b'"t"', js, 400, "InvalidRequest"),
        ("POST", "/v1/dbs", b"{", js, 400, "InvalidRequest"),
        ("POST", "/v1/dbs", b"\xff\xfe", js, 400, "InvalidRequest"),
        ("PATCH", f"/v1/dbs/{DB}", b"null", js, 400, "InvalidRequest"),
        # NDJSON with one bad record in the middle: the good ones around it are not written.
        ("POST", records, _ndjson(5) + b"\nnot json\n" + _ndjson(5), nd, 400, "InvalidRecord"),
        ("POST", records, _ndjson(5) + b"\n[1]\n" + _ndjson(5), nd, 400, "InvalidRecord"),
        (
            "POST",
            records,
            _ndjson(5) + b'\n{"topic": "a", "value": 3}\n' + _ndjson(5),
            nd,
            400,
            "InvalidRecord",
        ),
        (
            "POST",
            records,
            _ndjson(5) + b'\n{"topic": "a", "value": {"base64": "!!"}}\n',
            nd,
            400,
            "InvalidRecord",
        ),
        ("POST", records, _ndjson(5) + b"\n\xff\xff\n", nd, 400, "InvalidRecord"),
        # Unknown endpoints and methods.
        ("GET", "/etc/passwd", None, None, 404, "InvalidRequest"),
        ("PUT", f"/v1/dbs/{DB}", b"{}", js, 405, "InvalidRequest"),
    ]

    async def main() -> None:
        async with aiohttp.ClientSession() as s:
            await _create(s, server.url)
            for method, path, body, ctype, status, error in cases:
                headers = {"Content-Type": ctype} if ctype else {}
                url = aiohttp.client.URL(server.url + path, encoded=True)
                async with s.request(method, url, data=body, headers=headers) as r:
                    payload = await _expect(r, status, error, (method, path[:60]))
                if error == "InvalidRecord":
                    assert payload["index"] == 5, payload  # the line that failed
            assert await _ends(s, server.url) == [0, 0]
            async with s.get(f"{server.url}/v1/dbs") as r:
                assert (await r.json())["dbs"] == [DB]  # no stray database was created
            # The same server still takes a good batch: the refusals left it healthy.
            async with s.post(server.url + records, data=good, headers={"Content-Type": arrow}) as r:
                assert r.status == 200, await r.text()
            assert sum(await _ends(s, server.url)) == 200

    asyncio.run(main())
    assert "Traceback" not in "".join(server.output)


def test_slowloris_connections_are_closed(server_factory: ServerFactory) -> None:
    server = server_factory("--idle-timeout-s", IDLE_S)

    async def create() -> None:
        async with aiohttp.ClientSession() as s:
            await _create(s, server.url, shards=1)

    asyncio.run(create())
    # Half a request line, then nothing: the server closes it (recv sees EOF before the deadline).
    with _raw(server.url) as sock:
        sock.sendall(b"GET /healthz HT")
        assert _read_to_eof(sock) == b""
    # A complete head and part of the body, then nothing: closed too, and nothing written.
    with _raw(server.url) as sock:
        head = (
            f"POST /v1/dbs/{DB}/records HTTP/1.1\r\nHost: x\r\nContent-Type: {protocol.NDJSON}\r\n"
            "Content-Length: 1000\r\n\r\n"
        )
        sock.sendall(head.encode() + _ndjson(3))
        _read_to_eof(sock)

    async def check() -> None:
        async with aiohttp.ClientSession() as s:
            assert await _ends(s, server.url) == [0]
            # A long poll longer than the idle timeout is the server's wait, not a stall: it
            # is answered (empty), not cut off.
            async with s.get(f"{server.url}/v1/dbs/{DB}/shards/0/frames?offset=0&wait_ms=1500") as r:
                assert r.status == 200 and await r.read() == b""

    asyncio.run(check())


def test_inflight_cap_answers_503_and_writes_nothing(server_factory: ServerFactory) -> None:
    server = server_factory("--max-inflight-appends", "1")

    async def main(sock: socket.socket) -> None:
        async with aiohttp.ClientSession() as s:
            await _create(s, server.url, shards=1)
            body = _ndjson(1)
            # A produce whose body is still coming holds the only in-flight slot.
            head = (
                f"POST /v1/dbs/{DB}/records HTTP/1.1\r\nHost: x\r\nContent-Type: {protocol.NDJSON}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            sock.sendall(head.encode() + body[:5])
            # Until the server has taken that request in, others may still pass: send until
            # one is refused (bounded by the deadline; each refusal is checked in full).
            refused = written = 0
            deadline = asyncio.get_running_loop().time() + EOF_DEADLINE_S
            while not refused:
                assert asyncio.get_running_loop().time() < deadline, "no request was refused"
                async with s.post(
                    f"{server.url}/v1/dbs/{DB}/records",
                    data=_ndjson(10),
                    headers={"Content-Type": protocol.NDJSON},
                ) as r:
                    if r.status == 200:
                        written += (await r.json())["count"]
                        continue
                    await _expect(r, 503, "Overloaded")
                    assert r.headers["Retry-After"] == "1"
                    refused += 1
            assert await _ends(s, server.url) == [written]  # the refused batch wrote nothing
            sock.sendall(body[5:])
            reply = _read_to_eof(sock)
            assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
            assert await _ends(s, server.url) == [written + 1]

    with _raw(server.url) as sock:
        asyncio.run(main(sock))


def test_quota_answers_429_and_writes_nothing(server_factory: ServerFactory) -> None:
    server: ServerProcess = server_factory("--quota-bytes", "100000")

    async def main() -> None:
        async with aiohttp.ClientSession() as s:
            await _create(s, server.url, shards=1)
            async with s.post(
                f"{server.url}/v1/dbs/{DB}/records",
                data=_ndjson(300, "x" * 500),
                headers={"Content-Type": protocol.NDJSON},
            ) as r:
                await _expect(r, 429, "QuotaExceeded")
                assert int(r.headers["Retry-After"]) >= 1
            assert await _ends(s, server.url) == [0]
            async with s.post(
                f"{server.url}/v1/dbs/{DB}/records",
                data=_ndjson(3),
                headers={"Content-Type": protocol.NDJSON},
            ) as r:
                assert r.status == 200  # under the quota: taken

    asyncio.run(main())
