"""Tokens, permissions, the loopback-only default and TLS, against real ``seglog serve`` processes."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

import aiohttp
import pytest
import trustme

from seglog.cluster import protocol
from seglog.cluster.auth import Perm, TokenTable
from seglog.errors import InvalidArgument
from tests.server_fixtures import ServerFactory

OPS: Final = "ops-token-0123456789abcdef"  # global admin
INGEST: Final = "ingest-token-0123456789abc"  # write on a only
READER: Final = "reader-token-0123456789abc"  # read on b only
CREATOR: Final = "creator-token-0123456789ab"  # admin on c only
TOKENS: Final = f"""
# token                       principal  perms
{OPS}   ops      admin
{INGEST}  ingest   a:write    # a comment after the fields

{READER}  reader   b:read
{CREATOR}  creator  c:admin
"""
CLI_TIMEOUT_S: Final = 60.0


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _tokens_file(tmp_path: Path, text: str = TOKENS) -> Path:
    path = tmp_path / "tokens"
    path.write_text(text)
    return path


async def _status(
    s: aiohttp.ClientSession,
    method: str,
    url: str,
    token: str | None,
    *,
    json_body: Any = None,
    data: bytes | None = None,
    ctype: str | None = None,
) -> tuple[int, dict[str, Any], aiohttp.typedefs.LooseHeaders]:
    headers = _bearer(token) if token else {}
    if ctype:
        headers["Content-Type"] = ctype
    async with s.request(method, url, json=json_body, data=data, headers=headers) as r:
        body = await r.json() if r.content_type == protocol.JSON else {}
        return r.status, body, r.headers


def test_tokens_and_permissions(server_factory: ServerFactory, tmp_path: Path) -> None:
    server = server_factory("--tokens", str(_tokens_file(tmp_path)))
    u = server.url
    record = json.dumps({"topic": "x", "value": "1"}).encode()

    async def main() -> None:
        async with aiohttp.ClientSession() as s:
            # Open endpoints need no token.
            assert (await _status(s, "GET", u + "/healthz", None))[0] == 200
            assert (await _status(s, "GET", u + "/metrics", None))[0] == 200
            # No token, an unknown one, another scheme: 401 with a Bearer challenge.
            for token_header in (None, "Bearer wrong-token-0123456789", f"Basic {OPS}", "Bearer "):
                headers = {"Authorization": token_header} if token_header else {}
                for path in ("/v1/dbs", "/v1/dbs/a", "/nope"):
                    async with s.get(u + path, headers=headers) as r:
                        payload = await r.json()
                        assert (r.status, payload["error"]) == (401, "AuthenticationFailed"), (path, payload)
                        assert r.headers["WWW-Authenticate"].startswith("Bearer")
                        assert OPS not in payload["message"]
            # Global admin creates; per-database admin creates only its database.
            for name in ("a", "b"):
                status, body, _ = await _status(s, "POST", u + "/v1/dbs", OPS, json_body={"name": name})
                assert status == 201, body
            status, body, _ = await _status(s, "POST", u + "/v1/dbs", CREATOR, json_body={"name": "d"})
            assert (status, body["error"]) == (403, "PermissionDenied")
            status, body, _ = await _status(s, "POST", u + "/v1/dbs", INGEST, json_body={"name": "a2"})
            assert (status, body["error"]) == (403, "PermissionDenied")
            status, body, _ = await _status(s, "POST", u + "/v1/dbs", CREATOR, json_body={"name": "c"})
            assert status == 201, body

            # write on a: produce and (write implies read) describe and fetch a; nothing on b.
            produce_a = u + "/v1/dbs/a/records"
            status, body, _ = await _status(s, "POST", produce_a, INGEST, data=record, ctype=protocol.NDJSON)
            assert status == 200, body
            assert (await _status(s, "GET", u + "/v1/dbs/a", INGEST))[0] == 200
            assert (await _status(s, "GET", u + "/v1/dbs/a/shards/0/frames", INGEST))[0] == 200
            denied = [
                ("POST", "/v1/dbs/b/records", INGEST),
                ("GET", "/v1/dbs/b", INGEST),
                ("GET", "/v1/dbs/b/shards/0/frames", INGEST),
                ("DELETE", "/v1/dbs/a", INGEST),  # write does not imply admin
                ("PATCH", "/v1/dbs/a", INGEST),
                ("POST", "/v1/dbs/b/records", READER),  # read does not imply write
                ("DELETE", "/v1/dbs/b", READER),
                ("GET", "/v1/dbs/a", READER),
                ("DELETE", "/v1/dbs/a", CREATOR),  # admin on c is nothing on a
                ("GET", "/v1/dbs/a/shards/0/offset?ts=0", CREATOR),
            ]
            for method, path, token in denied:
                data = record if path.endswith("/records") else b"{}"
                ctype = protocol.NDJSON if path.endswith("/records") else protocol.JSON
                status, body, _ = await _status(s, method, u + path, token, data=data, ctype=ctype)
                assert (status, body["error"]) == (403, "PermissionDenied"), (method, path, body)
            # The refused produces wrote nothing.
            status, body, _ = await _status(s, "GET", u + "/v1/dbs/b", OPS)
            assert [o["end"] for o in body["offsets"]] == [0]
            status, body, _ = await _status(s, "GET", u + "/v1/dbs/a", OPS)
            assert [o["end"] for o in body["offsets"]] == [1]

            # Listings show only what the principal may read.
            lists = {}
            for token in (OPS, INGEST, READER, CREATOR):
                status, body, _ = await _status(s, "GET", u + "/v1/dbs", token)
                assert status == 200
                lists[token] = sorted(body["dbs"])
            assert lists == {OPS: ["a", "b", "c"], INGEST: ["a"], READER: ["b"], CREATOR: ["c"]}
            status, body, _ = await _status(s, "GET", u + "/v1/stats", READER)
            assert status == 200 and sorted(body["dbs"]) == ["b"]

            # Admin on c configures and drops c.
            status, body, _ = await _status(s, "DELETE", u + "/v1/dbs/c", CREATOR)
            assert status == 200, body

    asyncio.run(main())
    assert OPS not in "".join(server.output)


def test_token_table_parsing_and_lookup(tmp_path: Path) -> None:
    table = TokenTable.from_file(_tokens_file(tmp_path))
    assert len(table) == 4
    ops, ingest = table.lookup(OPS), table.lookup(INGEST)
    assert ops is not None and ops.name == "ops" and ops.allows(Perm.ADMIN) and ops.allows(Perm.READ, "zz")
    assert ingest is not None and ingest.allows(Perm.READ, "a") and not ingest.allows(Perm.ADMIN, "a")
    assert not ingest.allows(Perm.READ, "b") and not ingest.allows(Perm.READ)
    assert table.lookup(OPS[:-1]) is None and table.lookup(OPS + "x") is None and table.lookup("") is None
    secret = "s3cret-token-0123456789abcdef"
    bad = {
        f"{secret} p": "line 2: expected TOKEN PRINCIPAL PERMS",
        f"{secret} p root": "line 2: unknown permission 'root'",
        f"{secret} p ../x:read": "line 2: ",
        f"{secret} p read,": "line 2: unknown permission ''",
        "tinytok p read": "line 2: the token is shorter than 16",
        f"{secret} p read\n{secret} q write": "listed twice",
    }
    for text, message in bad.items():
        path = _tokens_file(tmp_path, "# header\n" + text + "\n")
        with pytest.raises(InvalidArgument) as info:
            TokenTable.from_file(path)
        assert message in str(info.value), (text, str(info.value))
        assert secret not in str(info.value) and "tinytok" not in str(info.value)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    return subprocess.run(
        [sys.executable, "-m", "seglog.cli", *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        env=env,
        check=False,
    )


def test_loopback_default_and_refusals(server_factory: ServerFactory, tmp_path: Path) -> None:
    server = server_factory()
    assert "loopback only" in "".join(server.output)
    # A non-loopback address without tokens: one clear line, non-zero exit, nothing served.
    done = _cli("serve", str(tmp_path / "open"), "--listen", "0.0.0.0:0")
    assert done.returncode != 0 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "without tokens" in done.stderr, done.stderr
    # A malformed tokens file: one line naming the line, never the token.
    bad = _tokens_file(tmp_path, "verysecret-token-0123456 p bogus\n")
    done = _cli("serve", str(tmp_path / "bad"), "--tokens", str(bad))
    assert done.returncode != 0 and "line 1" in done.stderr and "verysecret" not in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    # With tokens, any address may be bound.
    exposed = server_factory("--tokens", str(_tokens_file(tmp_path)), "--listen", "0.0.0.0:0")
    assert "loopback only" not in "".join(exposed.output)
    port = exposed.url.rsplit(":", 1)[1]

    async def check() -> None:
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{port}/v1/dbs", headers=_bearer(OPS)) as r:
                assert r.status == 200
            async with s.get(f"http://127.0.0.1:{port}/v1/dbs") as r:
                assert r.status == 401

    asyncio.run(check())


def test_tls_round_trip(server_factory: ServerFactory, tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.private_key_pem.write_to_path(str(key_file))
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    for pem in cert.cert_chain_pems[1:]:
        with cert_file.open("ab") as f:
            f.write(pem.bytes())
    server = server_factory("--tls-cert", str(cert_file), "--tls-key", str(key_file))
    assert server.url.startswith("https://")
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)

    async def main() -> None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_ctx)) as s:
            async with s.post(f"{server.url}/v1/dbs", json={"name": "t", "shards": 1}) as r:
                assert r.status == 201
            body = json.dumps({"topic": "x", "value": "over tls"}).encode()
            async with s.post(
                f"{server.url}/v1/dbs/t/records", data=body, headers={"Content-Type": protocol.NDJSON}
            ) as r:
                assert r.status == 200 and (await r.json())["count"] == 1
            async with s.get(f"{server.url}/v1/dbs/t/shards/0/frames?offset=0") as r:
                assert r.status == 200 and b"over tls" in await r.read()
        # Plain HTTP to the TLS port gets no HTTP answer.
        plain = server.url.replace("https://", "http://")
        async with aiohttp.ClientSession() as s:
            with pytest.raises(aiohttp.ClientError):
                async with s.get(f"{plain}/healthz") as r:
                    await r.read()
        # Nor does a client that does not trust the CA.
        async with aiohttp.ClientSession() as s:
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                async with s.get(f"{server.url}/healthz") as r:
                    await r.read()

    asyncio.run(main())


def test_every_route_has_a_permission(tmp_path: Path) -> None:
    """A route added without an entry in ROUTE_NEEDS would silently need global admin."""
    from seglog.cluster.server import ROUTE_NEEDS, NodeServer

    async def main() -> set[tuple[str, str]]:
        server = NodeServer(tmp_path / "data", port=0)
        await server.start()
        try:
            assert server._runner is not None
            app = server._runner.app
            return {
                (route.method, route.resource.canonical)
                for route in app.router.routes()
                if route.resource is not None and route.method != "HEAD"
            }
        finally:
            await server.close()

    routes = asyncio.run(main())
    assert len(routes) >= 16
    assert routes == set(ROUTE_NEEDS)
