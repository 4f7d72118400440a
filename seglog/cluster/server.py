"""The node server: one store behind the HTTP API of :mod:`seglog.cluster.protocol` (aiohttp).

``seglog serve DATA --listen 127.0.0.1:7070`` runs one; :func:`serve` embeds one (tests,
applications). Shutdown is graceful: stop accepting, wake long polls, let in-flight appends
finish, close the store.
"""

from __future__ import annotations

import asyncio
import gc
import ipaddress
import logging
import signal
import ssl
import sys
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from aiohttp import web
from aiohttp.typedefs import Middleware

from seglog.cluster import admin, fetch, group_routes, metrics, produce, replica_routes, stream_routes
from seglog.cluster.auth import Need, Perm, TokenTable, auth_middleware
from seglog.cluster.connections import ConnectionGuard, GuardedSite
from seglog.cluster.context import NODE, NodeContext, ServerLimits
from seglog.cluster.http_errors import error_middleware
from seglog.cluster.node import ClusterConfig, ClusterNode
from seglog.cluster.protocol import API_PREFIX, DEFAULT_PORT, HEADER_NODE, WIRE_VERSION
from seglog.errors import ClosedResourceError, InvalidArgument
from seglog.store import Store
from seglog.store import open as open_store

__all__ = ["DEFAULT_PORT", "NodeServer", "parse_listen", "run", "serve"]

log = logging.getLogger("seglog.server")

# How long shutdown waits for in-flight appends before closing the store regardless.
_SHUTDOWN_GRACE_S: Final = 30.0


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6; port 0 picks a free one).

    Raises:
        InvalidArgument: Not of that shape.
    """
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise InvalidArgument(f"--listen must be HOST:PORT, not {listen!r}")
    return host.strip("[]"), int(port)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def metrics_text(request: web.Request) -> web.Response:
    """``GET /metrics``: Prometheus text of this node's registry."""
    body = request.app[NODE].metrics.render()
    response = web.Response(body=body)
    response.headers["Content-Type"] = metrics.CONTENT_TYPE
    return response


async def _mark_reply(request: web.Request, response: web.StreamResponse) -> None:
    """Every reply says it comes from a node (see :data:`~seglog.cluster.protocol.HEADER_NODE`)."""
    response.headers[HEADER_NODE] = WIRE_VERSION


async def health(request: web.Request) -> web.Response:
    """``GET /healthz``: 200 while the node serves, 503 once it is shutting down."""
    if request.app[NODE].closing:
        raise ClosedResourceError("the server is shutting down")
    return web.json_response({"status": "ok"})


_OPEN: Final = Need(None)
_READ: Final = Need(Perm.READ)
_WRITE: Final = Need(Perm.WRITE)
_ADMIN: Final = Need(Perm.ADMIN)
# Token checked here, the databases acted on checked by the handler (create: admin on the
# named one; listings: only the readable ones).
_HANDLER_CHECKS: Final = Need(Perm.READ, on_db=False)
_DB: Final = API_PREFIX + "/dbs/{db}"
_GROUP: Final = _DB + "/groups/{group}"

# The permission each route needs, by (method, path template) as added in NodeServer._app
# (protocol.py's table). With tokens, a route missing here needs global admin.
ROUTE_NEEDS: Final[dict[tuple[str, str], Need]] = {
    ("GET", "/healthz"): _OPEN,
    ("GET", "/metrics"): _OPEN,
    ("GET", API_PREFIX + "/dbs"): _HANDLER_CHECKS,
    ("POST", API_PREFIX + "/dbs"): _HANDLER_CHECKS,
    ("GET", _DB): _READ,
    ("PATCH", _DB): _ADMIN,
    ("DELETE", _DB): _ADMIN,
    ("GET", API_PREFIX + "/stats"): _HANDLER_CHECKS,
    ("POST", _DB + "/records"): _WRITE,
    ("POST", _DB + "/producer-id"): _WRITE,
    ("GET", _DB + "/shards/{shard}/frames"): _READ,
    ("POST", _DB + "/fetch"): _READ,
    ("GET", _DB + "/shards/{shard}/offset"): _READ,
    ("GET", _DB + "/streams"): _READ,
    ("POST", _DB + "/iterators"): _READ,
    ("POST", _DB + "/next"): _READ,
    ("GET", _DB + "/generations"): _READ,
    ("POST", _DB + "/generations"): _ADMIN,
    ("DELETE", _DB + "/generations/{generation}"): _ADMIN,
    ("POST", _DB + "/tier"): _ADMIN,
    ("POST", _DB + "/retention"): _ADMIN,
    ("POST", _GROUP + "/join"): _READ,
    ("POST", _GROUP + "/heartbeat"): _READ,
    ("POST", _GROUP + "/leave"): _READ,
    ("POST", _GROUP + "/commit"): _READ,
    ("GET", _GROUP + "/committed"): _READ,
    # Node to node: a follower's token needs admin (it writes every replica).
    ("POST", API_PREFIX + "/replica/fetch"): _ADMIN,
    ("GET", _DB + "/shards/{shard}/epoch-end"): _ADMIN,
    ("GET", API_PREFIX + "/cluster"): _HANDLER_CHECKS,
}


class NodeServer:
    """A running node: a store, an aiohttp application and its listening socket.

    Use :func:`serve` (``async with``) or ``await server.start()`` / ``await server.close()``.
    """

    def __init__(
        self,
        data: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        limits: ServerLimits | None = None,
        ssl_context: ssl.SSLContext | None = None,
        tokens: TokenTable | str | Path | None = None,
        store: Store | None = None,
        cluster: ClusterConfig | None = None,
        **store_options: Any,
    ) -> None:
        """A node for the data directory ``data`` (created if missing), not started yet.

        Args:
            data: The data directory.
            host: Address to bind; without tokens only a loopback address is allowed.
            port: Port to bind (0: any free one; see :attr:`url`).
            limits: Request bounds (default :class:`ServerLimits`).
            ssl_context: Serve HTTPS with this context.
            tokens: Require bearer tokens (a :class:`TokenTable` or a tokens file, see
                :mod:`seglog.cluster.auth`); without them anyone who can connect may do anything.
            store: An unopened store to serve instead of ``seglog.open(data, **store_options)``.
            cluster: Join a cluster (metadata in etcd); its ``advertise_url`` may be empty:
                the bound URL is advertised.
            **store_options: Options of :func:`seglog.open` (``fsync``, ...).
        """
        if tokens is not None and not isinstance(tokens, TokenTable):
            tokens = TokenTable.from_file(tokens)
        self.tokens = tokens
        if tokens is None and not _is_loopback(host):
            raise InvalidArgument(
                f"refusing to serve on {host} without tokens: bind a loopback address or pass tokens"
            )
        self.data = Path(data)
        self.host = host
        self.port = port
        self.limits = limits or ServerLimits()
        self.ssl_context = ssl_context
        if cluster is not None and store_options.get("tier") is not None:
            # Every replica holds the shards it replicates: only a shard's leader uploads it,
            # and the nodes share each database's manifest (conditional puts, epoch fencing).
            store_options.setdefault("tier_shared", True)
        if cluster is not None and (
            store_options.get("tier_shared") is False
            or (store is not None and store.tier and not store.tier_shared)
        ):
            raise InvalidArgument("a cluster node's tier is shared by its nodes: it needs tier_shared=True")
        self._store = store if store is not None else open_store(self.data, **store_options)
        self._node: NodeContext | None = None
        self._runner: web.AppRunner | None = None
        self._site: web.BaseSite | None = None
        self._closed = asyncio.Event()
        self._guard = ConnectionGuard(self.limits.idle_timeout_s)
        self.cluster_config = cluster
        self.cluster: ClusterNode | None = None

    @property
    def url(self) -> str:
        """``http[s]://host:port`` of the bound socket."""
        scheme = "https" if self.ssl_context is not None else "http"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}"

    def _app(self, node: NodeContext) -> web.Application:
        middlewares: list[Middleware] = [error_middleware, self._guard.middleware]
        if self.tokens is not None:
            middlewares.append(auth_middleware(self.tokens, ROUTE_NEEDS))
        app = web.Application(middlewares=middlewares, client_max_size=self.limits.max_body_bytes)
        app[NODE] = node
        app.on_response_prepare.append(_mark_reply)
        db = API_PREFIX + "/dbs/{db}"
        app.router.add_get("/healthz", health)
        app.router.add_get("/metrics", metrics_text)
        app.router.add_get(API_PREFIX + "/dbs", admin.list_dbs)
        app.router.add_post(API_PREFIX + "/dbs", admin.create_db)
        app.router.add_get(db, admin.describe_db)
        app.router.add_patch(db, admin.configure_db)
        app.router.add_delete(db, admin.drop_db)
        app.router.add_get(API_PREFIX + "/stats", admin.stats)
        app.router.add_post(db + "/records", produce.produce)
        app.router.add_post(db + "/producer-id", admin.producer_id)
        app.router.add_get(db + "/shards/{shard}/frames", fetch.fetch)
        app.router.add_post(db + "/fetch", fetch.fetch_many)
        app.router.add_get(db + "/shards/{shard}/offset", admin.offset_for_time)
        app.router.add_post(db + "/tier", admin.tier_db)
        app.router.add_post(db + "/retention", admin.retention_db)
        group_routes.add_routes(app, db)
        replica_routes.add_routes(app, db)
        stream_routes.add_routes(app, db)
        return app

    async def start(self) -> NodeServer:
        """Open the store and start listening."""
        store = await self._store
        node = NodeContext(store, self.limits)
        node.idle.set()
        self._node = node
        self._guard = ConnectionGuard(self.limits.idle_timeout_s, node.metrics.open_connections.set)
        node.metrics.start()
        try:
            runner = web.AppRunner(
                self._app(node),
                handle_signals=False,
                access_log=None,
                keepalive_timeout=self.limits.idle_timeout_s,
            )
            await runner.setup()
            self._runner = runner
            site = GuardedSite(runner, self.host, self.port, self._guard, ssl_context=self.ssl_context)
            await site.start()
            self._site = site
        except BaseException:
            await self._shutdown()
            raise
        if self.port == 0:
            self.port = int(runner.addresses[0][1])
        if self.cluster_config is not None:
            config = self.cluster_config
            if not config.advertise_url:
                config = replace(config, advertise_url=self.url)
            cluster = ClusterNode(config, store, node.waiters)
            node.cluster = cluster
            self.cluster = cluster
            try:
                await cluster.start()
            except BaseException:
                await self._shutdown()
                raise
        return self

    async def close(self) -> None:
        """Stop accepting, wake long polls, let in-flight appends finish, close the store."""
        if self._closed.is_set():
            return
        await self._shutdown()

    async def _shutdown(self) -> None:
        node = self._node
        if node is not None:
            node.closing = True
            node.waiters.wake_all()
        if self.cluster is not None:
            # Leave first: the controller moves leadership away while we finish.
            await self.cluster.close()
        try:
            if self._site is not None:
                await self._site.stop()
            if node is not None:
                try:
                    await asyncio.wait_for(node.idle.wait(), _SHUTDOWN_GRACE_S)
                except TimeoutError:
                    log.warning("closing with %d appends still in flight", node.inflight_appends)
            if self._runner is not None:
                await self._runner.cleanup()
        finally:
            if node is not None:
                node.metrics.stop()
            await self._store.close()
            self._closed.set()

    async def wait_closed(self) -> None:
        """Return once :meth:`close` finished."""
        await self._closed.wait()

    async def __aenter__(self) -> NodeServer:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


def serve(data: str | Path, **options: Any) -> NodeServer:
    """A node for ``data``: ``async with seglog.serve(path, port=0) as server: server.url``.

    Takes the options of :class:`NodeServer`.
    """
    return NodeServer(data, **options)


async def _run(server: NodeServer) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    # The process is ours: what start-up built (modules, the store, open databases) lives as
    # long as it does, so full collections need not walk it again (shorter gen-2 pauses under
    # load; one measured 31 ms with 63k start-up objects on a busy machine).
    gc.collect()
    gc.freeze()
    if server.tokens is None:
        print(
            f"seglog: no --tokens: serving {server.host} (loopback only) without authentication",
            file=sys.stderr,
            flush=True,
        )
    # One line on stdout, flushed: scripts and tests wait for it to know the port.
    print(f"seglog: serving {server.data} on {server.url}", flush=True)
    try:
        await stop.wait()
    finally:
        print("seglog: shutting down", file=sys.stderr, flush=True)
        await server.close()


def run(server: NodeServer) -> int:
    """Serve until SIGTERM/SIGINT, then shut down gracefully (the ``seglog serve`` command)."""
    asyncio.run(_run(server))
    return 0
