"""Database administration over the node API: list, create, describe, configure, drop."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from aiohttp import web

from seglog.cluster.auth import Perm, may_read, require
from seglog.cluster.context import NODE
from seglog.cluster.metadata import DbMeta
from seglog.cluster.params import json_body, query_int, shard_param
from seglog.db import Database
from seglog.errors import DatabaseExists, InvalidArgument, InvalidRequest

__all__ = [
    "configure_db",
    "create_db",
    "describe_db",
    "drop_db",
    "list_dbs",
    "offset_for_time",
    "retention_db",
    "stats",
    "tier_db",
]


def describe(db: Database) -> dict[str, Any]:
    """A database's config; per shard, its start, end and high watermark; and, when it
    tiers, where each shard's bytes are (``tier``, see :func:`tier_report`)."""
    out: dict[str, Any] = {
        "name": db.name,
        "shards": db.shards,
        "config": db.config.to_json(),
        "offsets": _offsets(db),
        "tiered": db.tiered,
    }
    if db.tiered:
        out["tier"] = tier_report(db)
    return out


def _offsets(db: Database) -> list[dict[str, int]]:
    return [
        {
            "shard": s,
            "start": db.start_offset(s),
            "end": db.end_offset(s),
            "high_watermark": db.high_watermark(s),
        }
        for s in range(db.shards)
    ]


def tier_report(db: Database) -> list[dict[str, Any]]:
    """Per shard: hot, warm and cold bytes, tier objects, and the local and logical starts."""
    return [asdict(t) for t in db.tier_stats()]


async def list_dbs(request: web.Request) -> web.Response:
    """``GET /v1/dbs``: the databases the caller may read."""
    node = request.app[NODE]
    return web.json_response({"dbs": [name for name in node.store.list_dbs() if may_read(request, name)]})


async def create_db(request: web.Request) -> web.Response:
    """``POST /v1/dbs`` with ``{"name", "shards"?, "exist_ok"?, ...settings}``; 201 with the description."""
    node = request.app[NODE]
    body = await json_body(request)
    name = body.pop("name", None)
    if not isinstance(name, str):
        raise InvalidRequest('create needs "name" (a string)')
    require(request, Perm.ADMIN, name)
    exist_ok = body.pop("exist_ok", False)
    if not isinstance(exist_ok, bool):
        raise InvalidRequest('"exist_ok" must be true or false')
    shards = body.pop("shards", None)
    if "replication_factor" in body:
        return web.json_response(await _create_replicated(request, name, shards, exist_ok, body), status=201)
    db = await node.store.create_db(name, shards, exist_ok=exist_ok, **body)
    await node.database(db.name)
    return web.json_response(describe(db), status=201)


async def _create_replicated(
    request: web.Request, name: str, shards: object, exist_ok: bool, body: dict[str, Any]
) -> dict[str, Any]:
    """Record a replicated database in the cluster metadata; every replica node creates its copy."""
    cluster = request.app[NODE].cluster
    if cluster is None:
        raise InvalidRequest("replication_factor needs a cluster node (seglog serve --etcd ...)")
    rf = body.pop("replication_factor")
    min_insync = body.pop("min_insync", min(2, rf) if isinstance(rf, int) else 1)
    unclean = body.pop("unclean_election", False)
    if type(shards) is not int or type(rf) is not int or type(min_insync) is not int:
        raise InvalidRequest('"shards", "replication_factor" and "min_insync" must be integers')
    if not isinstance(unclean, bool):
        raise InvalidRequest('"unclean_election" must be true or false')
    meta = DbMeta(name, shards, rf, min_insync, unclean, options=body)
    try:
        states = await cluster.meta.create_db(meta)
    except DatabaseExists:
        if exist_ok and await cluster.meta.get_db(name) == meta:
            return {"name": name, "shards": shards, "created": False}
        raise
    return {
        "name": name,
        "shards": shards,
        "replication_factor": rf,
        "min_insync": min_insync,
        "unclean_election": unclean,
        "placement": [{"replicas": list(s.replicas), "leader": s.leader} for s in states],
        "created": True,
    }


async def describe_db(request: web.Request) -> web.Response:
    """``GET /v1/dbs/{db}``."""
    node = request.app[NODE]
    db = await node.database(request.match_info["db"])
    out = describe(db)
    cluster = node.cluster
    out["replicated"] = cluster is not None and cluster.replicated(db.name)
    if cluster is not None and out["replicated"]:
        out["replication"] = cluster.describe_db(db.name)
    return web.json_response(out)


async def producer_id(request: web.Request) -> web.Response:
    """``POST /v1/dbs/{db}/producer-id``: ``{"producer_id", "producer_epoch"}`` for an
    idempotent producer of the database; unique in the cluster (etcd) or the node's store."""
    node = request.app[NODE]
    await node.database(request.match_info["db"])  # DatabaseNotFound, and the write permission
    cluster = node.cluster
    if cluster is not None:
        pid = await cluster.meta.allocate_producer_id()
    else:
        pid = await node.store.allocate_producer_id()
    return web.json_response({"producer_id": pid, "producer_epoch": 0})


async def configure_db(request: web.Request) -> web.Response:
    """``PATCH /v1/dbs/{db}`` with ``{setting: value}`` (mutable settings only)."""
    node = request.app[NODE]
    db = await node.database(request.match_info["db"])
    body = await json_body(request)
    await db.configure(**body)
    return web.json_response(describe(db))


async def drop_db(request: web.Request) -> web.Response:
    """``DELETE /v1/dbs/{db}``: waits for in-flight requests on it, wakes its long polls."""
    node = request.app[NODE]
    name = request.match_info["db"]
    await node.database(name)  # DatabaseNotFound before anything else
    if node.cluster is not None and node.cluster.replicated(name):
        # The metadata goes; every replica node drops its copy when it sees that.
        await node.cluster.meta.drop_db(name)
        await node.cluster.dropped(name)
        node.forget(name)
        return web.json_response({"dropped": name})
    await node.store.drop_db(name)
    node.forget(name)
    return web.json_response({"dropped": name})


async def offset_for_time(request: web.Request) -> web.Response:
    """``GET /v1/dbs/{db}/shards/{shard}/offset?ts=µs``: first offset at or after ``ts``."""
    node = request.app[NODE]
    db = await node.database(request.match_info["db"])
    shard = shard_param(request, db.shards)
    ts = query_int(request, "ts", None)
    if ts is None:
        raise InvalidRequest("offset needs ?ts= (µs since 1970)")
    return web.json_response({"shard": shard, "ts": ts, "offset": await db.offset_for_time(shard, ts)})


async def stats(request: web.Request) -> web.Response:
    """``GET /v1/stats``: per database the caller may read and shard, offsets, segments and bytes."""
    node = request.app[NODE]
    out = {}
    for name in node.store.list_dbs():
        if not may_read(request, name):
            continue
        db = await node.database(name)
        out[name] = [
            {
                "shard": s.shard,
                "start": s.start_offset,
                "end": s.end_offset,
                "segments": s.segments,
                "bytes": s.bytes,
            }
            for s in db.stats()
        ]
    return web.json_response({"dbs": out})


async def tier_db(request: web.Request) -> web.Response:
    """``POST /v1/dbs/{db}/tier`` with ``{"seal"?: bool}``: (seal the active segments, then)
    upload every sealed segment not yet in the tier and apply local retention, now.

    Replies ``{"committed": [manifest entries], "tier": [per-shard stats]}``; a node without
    a tier answers 400 (``InvalidArgument``), a failing tier 500 (``TierError``: nothing local
    is lost, call again).
    """
    node = request.app[NODE]
    db = await node.database(request.match_info["db"])
    body = await json_body(request)
    seal = body.pop("seal", False)
    if not isinstance(seal, bool) or body:
        raise InvalidRequest('tier takes {"seal": true|false} and nothing else')
    if not db.tiered:
        raise InvalidArgument(
            f"database {db.name!r} does not tier: start the node with --tier URI (segment engine only)"
        )
    if node.cluster is not None and not node.cluster.replicated(db.name):
        # Its name need not be unique across the nodes sharing the tier.
        raise InvalidArgument(
            f"database {db.name!r} is not replicated: a cluster node tiers replicated databases only"
        )
    if seal:
        await db.seal()
    committed = await db.tier_now()
    return web.json_response({"committed": [e.to_json() for e in committed], "tier": tier_report(db)})


async def retention_db(request: web.Request) -> web.Response:
    """``POST /v1/dbs/{db}/retention``: apply ``retention_bytes``/``retention_ms`` now (the node
    also does every ``retention_interval_ms``); ``{"freed_bytes", "offsets": [...]}``."""
    node = request.app[NODE]
    db = await node.database(request.match_info["db"])
    if await json_body(request):
        raise InvalidRequest("retention takes no body")
    freed = await db.enforce_retention()
    return web.json_response({"freed_bytes": freed, "offsets": _offsets(db)})
