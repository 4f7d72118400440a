"""Database administration over the node API: list, create, describe, configure, drop."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from seglog.cluster.auth import Perm, may_read, require
from seglog.cluster.context import NODE
from seglog.cluster.params import json_body, query_int, shard_param
from seglog.db import Database
from seglog.errors import InvalidRequest

__all__ = ["configure_db", "create_db", "describe_db", "drop_db", "list_dbs", "offset_for_time", "stats"]


def describe(db: Database) -> dict[str, Any]:
    """A database's config and, per shard, its start, end and high watermark."""
    return {
        "name": db.name,
        "shards": db.shards,
        "config": db.config.to_json(),
        "offsets": [
            {
                "shard": s,
                "start": db.start_offset(s),
                "end": db.end_offset(s),
                "high_watermark": db.high_watermark(s),
            }
            for s in range(db.shards)
        ],
    }


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
    db = await node.store.create_db(name, shards, exist_ok=exist_ok, **body)
    await node.database(db.name)
    return web.json_response(describe(db), status=201)


async def describe_db(request: web.Request) -> web.Response:
    """``GET /v1/dbs/{db}``."""
    node = request.app[NODE]
    return web.json_response(describe(await node.database(request.match_info["db"])))


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
