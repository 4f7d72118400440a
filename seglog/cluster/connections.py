"""Client connections of a node: counted, and closed when the client stalls (slowloris).

aiohttp's ``keepalive_timeout`` closes a connection idle *between* requests, but nothing
bounds one that sent half a request line, or half a body, and then nothing: each such
connection would hold a socket (and a produce its in-flight slot) forever. So every
connection's protocol is wrapped in :class:`_GuardedConnection`, which notes when bytes last
arrived and closes the connection once the client has sent nothing for the idle timeout
while the server waits on it. While a handler works on a fully received request (a long
poll, an fsync), the client is not expected to send anything and the timer does not apply.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

__all__ = ["ConnectionGuard", "GuardedSite"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ConnectionGuard:
    """What the wrapped connections of one node share: the timeout, open count, busy requests."""

    def __init__(self, idle_timeout_s: float, on_count: Callable[[int], None] | None = None) -> None:
        """Guard connections with ``idle_timeout_s``; ``on_count(n)`` hears the open count."""
        self.idle_timeout_s = idle_timeout_s
        self.open = 0
        self._on_count = on_count
        # id(aiohttp protocol) -> the request its handler is running (set by the middleware).
        self._busy: dict[int, web.BaseRequest] = {}

    def _count(self, delta: int) -> None:
        self.open += delta
        if self._on_count is not None:
            self._on_count(self.open)

    def waits_on_client(self, protocol: asyncio.BaseProtocol) -> bool:
        """Whether the server is waiting for bytes from the client of ``protocol``.

        True between requests, within a request's head, and while its body is incomplete.
        """
        request = self._busy.get(id(protocol))
        return request is None or not request.content.is_eof()

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Mark the connection busy while its request is handled."""
        key = id(request.protocol)
        self._busy[key] = request
        try:
            return await handler(request)
        finally:
            self._busy.pop(key, None)


class _GuardedConnection(asyncio.Protocol):
    """Forwards to aiohttp's protocol; closes the transport when the client stalls."""

    def __init__(self, inner: asyncio.Protocol, guard: ConnectionGuard) -> None:
        self._inner = inner
        self._guard = guard
        self._loop = asyncio.get_running_loop()
        self._last_rx = self._loop.time()
        self._timer: asyncio.TimerHandle | None = None
        self._transport: asyncio.BaseTransport | None = None
        # The client is not reading our reply: we wait on it, but it is not stalling a request.
        self._writing_paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        self._guard._count(+1)
        self._arm(self._guard.idle_timeout_s)
        self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._guard._count(-1)
        self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._last_rx = self._loop.time()
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._inner.resume_writing()

    def _arm(self, delay: float) -> None:
        self._timer = self._loop.call_later(delay, self._check)

    def _check(self) -> None:
        self._timer = None
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        timeout = self._guard.idle_timeout_s
        idle = self._loop.time() - self._last_rx
        if idle >= timeout and not self._writing_paused and self._guard.waits_on_client(self._inner):
            transport.close()
            return
        # Bytes came meanwhile, or the server is the one working: look again a timeout later.
        self._arm(max(timeout - idle, 0.0) if idle < timeout else timeout)


class GuardedSite(web.BaseSite):
    """A TCP site (like ``web.TCPSite``) whose connections a :class:`ConnectionGuard` watches."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        guard: ConnectionGuard,
        *,
        ssl_context: Any = None,
    ) -> None:
        """A site for ``runner`` on ``host:port``; not listening before :meth:`start`."""
        super().__init__(runner, ssl_context=ssl_context)
        self._host = host
        self._port = port
        self._guard = guard

    @property
    def name(self) -> str:
        """The site's URL."""
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{self._host}:{self._port}"

    async def start(self) -> None:
        """Listen; each accepted connection gets aiohttp's protocol, wrapped."""
        await super().start()
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        guard = self._guard

        def factory() -> asyncio.Protocol:
            return _GuardedConnection(server(), guard)

        self._server = await loop.create_server(
            factory,
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_address=True,
            # A TLS handshake that never completes is a stall too.
            ssl_handshake_timeout=guard.idle_timeout_s if self._ssl_context else None,
        )
