"""A node that tiers: ``seglog serve --tier``, ``POST /v1/dbs/{db}/tier``, ``seglog admin tier``,
and history read through the node from the tier once the node's local copy is gone
(a local directory and a real MinIO)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Final

import aiohttp
import pyarrow as pa
import pytest

from seglog.client import Consumer, Producer
from seglog.cluster.server import serve
from seglog.errors import InvalidArgument
from tests.server_fixtures import ServerFactory
from tests.test_cli_net import ADMIN, READER, _env, ok, one_error_line, sh
from tests.test_tiering import tier_kwargs
from tests.tier_fixtures import MinioServer

DB: Final = "hist"
SHARDS: Final = 2
N: Final = 2000
TS0: Final = 1_700_000_000_000_000
WAIT_S: Final = 60.0  # bound on waits for an event, never a measured duration


def _table(n: int = N) -> pa.Table:
    return pa.table(
        {
            "ts": pa.array([TS0 + i for i in range(n)], pa.int64()),
            "topic": [f"site/{i % 7}/temp" for i in range(n)],
            "key": [f"dev-{i % 13}".encode() for i in range(n)],
            "value": [f"v{i:05d}".encode() for i in range(n)],
        }
    )


async def _produce(url: str, table: pa.Table) -> None:
    async with Producer(url, DB) as producer:
        await (await producer.send_arrow(table))


async def _consume_all(url: str, total: int) -> dict[int, list[Any]]:
    got: dict[int, list[Any]] = {}
    async with Consumer(url, DB) as consumer, asyncio.timeout(WAIT_S):
        while sum(len(v) for v in got.values()) < total:
            for shard, recs in (await consumer.getmany(timeout_ms=None)).items():
                got.setdefault(shard, []).extend(recs)
    return got


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_a_node_tiers_and_serves_history_from_the_tier(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Sealed segments go to the tier, the local copies go (``local_retention_bytes=0``), and a
    consumer from offset 0 still gets every record, in order, through the node."""
    kw = tier_kwargs(kind, tmp_path, request)

    async def main() -> None:
        async with serve(tmp_path / "node", port=0, tier_interval_ms=None, **kw) as node:
            async with aiohttp.ClientSession(node.url) as s:
                body = {"name": DB, "shards": SHARDS, "segment_bytes": 4096, "local_retention_bytes": 0}
                async with s.post("/v1/dbs", json=body) as r:
                    assert r.status == 201, await r.text()
                    assert (await r.json())["tiered"] is True
                await _produce(node.url, _table())
                async with s.post(f"/v1/dbs/{DB}/tier", json={"seal": True}) as r:
                    assert r.status == 200, await r.text()
                    reply = await r.json()
                async with s.get(f"/v1/dbs/{DB}") as r:
                    desc = await r.json()
            committed = reply["committed"]
            assert {e["shard"] for e in committed} == set(range(SHARDS))
            assert sum(e["rows"] for e in committed) == N
            for t in reply["tier"]:
                # Nothing is left on the node's disk: every record is read from the tier.
                assert t["start_offset"] == 0 and t["local_start_offset"] == t["end_offset"] > 0, t
                assert t["cold_bytes"] > 0 and t["hot_bytes"] == 0 and t["warm_bytes"] == 0, t
            assert desc["tier"] == reply["tier"]
            assert [o["start"] for o in desc["offsets"]] == [0] * SHARDS
            got = await _consume_all(node.url, N)
            values = sorted(r.value for recs in got.values() for r in recs)
            assert values == sorted(f"v{i:05d}".encode() for i in range(N))
            for shard, recs in got.items():
                assert [r.offset for r in recs] == list(range(len(recs))), shard
                assert all(r.key is not None and r.topic.startswith("site/") for r in recs)
            # A second pass has nothing left to upload.
            async with aiohttp.ClientSession(node.url) as s, s.post(f"/v1/dbs/{DB}/tier") as r:
                assert r.status == 200 and (await r.json())["committed"] == []

    asyncio.run(main())
    keys = _tier_keys(kind, tmp_path, request)
    assert any(k.startswith(f"{DB}/shard=0/") and k.endswith(".parquet") for k in keys), keys
    assert any(k.startswith(f"{DB}/shard=1/") and k.endswith(".parquet") for k in keys), keys


def _tier_keys(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> list[str]:
    if kind == "local":
        root = tmp_path / "tier"
        return [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()]
    minio: MinioServer = request.getfixturevalue("minio")
    bucket: str = request.getfixturevalue("bucket")
    listing = minio.client().list_objects_v2(Bucket=bucket, Prefix="pfx/")
    return [o["Key"].removeprefix("pfx/") for o in listing.get("Contents", [])]


def test_tiering_a_node_without_a_tier_and_bad_bodies_are_clear_errors(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path / "node", port=0) as node, aiohttp.ClientSession(node.url) as s:
            async with s.post("/v1/dbs", json={"name": DB}) as r:
                assert r.status == 201 and (await r.json())["tiered"] is False
            async with s.post(f"/v1/dbs/{DB}/tier", json={"seal": True}) as r:
                err = await r.json()
                assert r.status == 400 and err["error"] == "InvalidArgument", err
                assert "--tier" in err["message"], err
            async with s.post(f"/v1/dbs/{DB}/tier", json={"seal": "yes"}) as r:
                assert r.status == 400 and (await r.json())["error"] == "InvalidRequest"
            async with s.post(f"/v1/dbs/{DB}/tier", json={"seal": False, "shard": 1}) as r:
                assert r.status == 400 and (await r.json())["error"] == "InvalidRequest"
            async with s.post("/v1/dbs/nope/tier") as r:
                assert r.status == 404 and (await r.json())["error"] == "DatabaseNotFound"

    asyncio.run(main())


def test_a_cluster_nodes_tier_is_shared(tmp_path: Path) -> None:
    """Replicas of a shard must not all upload it: a cluster node's store tiers in shared mode
    (each shard by its leader, tests/test_cluster_tier.py), and refuses to tier otherwise."""
    from seglog.cluster.node import ClusterConfig

    cluster = ClusterConfig(node_id=1, advertise_url="", etcd=("http://127.0.0.1:1",))
    tier = (tmp_path / "tier").as_uri()
    node = serve(tmp_path / "n", port=0, cluster=cluster, tier=tier)
    assert node._store.tier_shared is True
    with pytest.raises(InvalidArgument, match="tier_shared=True"):
        serve(tmp_path / "n2", port=0, cluster=cluster, tier=tier, tier_shared=False)
    assert serve(tmp_path / "n3", port=0, tier=tier)._store.tier_shared is False


def test_serve_tier_and_admin_tier_from_the_command_line(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    tier = tmp_path / "tier"
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{ADMIN} ops admin\n{READER} reader read\n")
    server = server_factory("--tier", tier.as_uri(), "--tier-interval-ms", "0", "--tokens", str(tokens))
    url = server.url
    env = _env(SEGLOG_TOKEN=ADMIN)
    ok(sh("admin", "--url", url, "create", DB, "--shards", "2", "--segment-bytes", "4096", env=env))
    lines = "".join(
        json.dumps({"topic": f"a/{i % 10}", "value": f"v{i}", "ts": TS0 + i}) + "\n" for i in range(300)
    )
    ok(sh("produce", "--url", url, DB, stdin=lines.encode(), env=env))
    one_error_line(sh("admin", "--url", url, "--token", READER, "tier", DB), "PermissionDenied")
    out = ok(sh("admin", "--url", url, "tier", DB, "--seal", env=env)).splitlines()
    committed = [line for line in out if line.startswith("committed ")]
    assert committed and all(f" {DB}/shard=" in line for line in committed), out
    assert sum(int(line.split(", ")[1].split()[0].replace(",", "")) for line in committed) == 300, out
    shards = [line for line in out if line.startswith("shard ")]
    assert len(shards) == 2 and all("cold 0 B" not in line for line in shards), out
    assert len(list(tier.rglob("*.parquet"))) == len(committed)
    out = ok(sh("admin", "--url", url, "retention", DB, env=env))  # none set: nothing goes
    assert out == "freed 0 bytes; shard 0 from 0, shard 1 from 0\n", out
    one_error_line(sh("admin", "--url", url, "--token", READER, "retention", DB), "PermissionDenied")
    desc = json.loads(ok(sh("admin", "--url", url, "describe", DB, env=env)))
    assert desc["tiered"] is True and sum(t["tier_objects"] for t in desc["tier"]) == len(committed)


def test_serve_tier_flags_are_checked(tmp_path: Path) -> None:
    data = str(tmp_path / "n")
    for args, needle in (
        (("--s3-endpoint", "http://127.0.0.1:9000"), "--s3-endpoint needs --tier"),
        (("--tier-interval-ms", "10"), "--tier-interval-ms needs --tier"),
        (
            ("--tier", (tmp_path / "t").as_uri(), "--tier-interval-ms", "-1"),
            "--tier-interval-ms must be >= 0",
        ),
        (("--tier", "relative/dir"), "must be absolute"),
    ):
        r = sh("serve", data, "--listen", "127.0.0.1:0", *args)
        err = r.stderr.decode()
        assert r.returncode != 0 and err.count("\n") == 1 and "Traceback" not in err, (args, err)
        assert err.startswith("seglog: error: ") and needle in err, (args, err)
