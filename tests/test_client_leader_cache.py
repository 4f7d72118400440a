"""The client's leader cache asks other nodes when the first answer lacks the database: a node
whose metadata watch lags does not know a database created a moment ago (the cluster test's
producer met ``DatabaseNotFound`` from such a node). Real HTTP servers answering
``GET /v1/cluster`` with a lagging and a current view."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web

from seglog.client._metadata import LeaderCache
from seglog.cluster import protocol
from seglog.errors import DatabaseNotFound
from tests.helpers import serve_app


@asynccontextmanager
async def _node(view: dict[str, Any]) -> AsyncIterator[str]:
    async def cluster(_request: web.Request) -> web.Response:
        return web.json_response(view, headers={protocol.HEADER_NODE: protocol.WIRE_VERSION})

    app = web.Application()
    app.router.add_get("/v1/cluster", cluster)
    async with serve_app(app) as url:
        yield url


def _view(dbs: dict[str, Any]) -> dict[str, Any]:
    return {"nodes": {"1": "http://leader-1", "2": "http://leader-2"}, "dbs": dbs}


CURRENT = {"telemetry": {"state": [{"leader": 2, "leader_epoch": 3}]}}


def test_a_lagging_node_does_not_make_a_database_absent() -> None:
    async def main() -> None:
        async with _node(_view({})) as lagging, _node(_view(CURRENT)) as current:
            cache = LeaderCache([lagging, current], min_refresh_interval_s=60.0)
            try:
                assert await cache.leader_url("telemetry", 0) == "http://leader-2"
                assert cache.view.leaders["telemetry"] == [(2, 3)]
            finally:
                await cache.close()

    asyncio.run(main())


def test_a_database_no_node_knows_is_absent() -> None:
    async def main() -> None:
        async with _node(_view({})) as first, _node(_view({})) as second:
            cache = LeaderCache([first, second])
            try:
                with pytest.raises(DatabaseNotFound, match="no node of the cluster knows"):
                    await cache.leader_url("telemetry", 0)
            finally:
                await cache.close()

    asyncio.run(main())
