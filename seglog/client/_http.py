"""One aiohttp session to a seglog node: base URL, token, TLS, and the protocol's errors raised."""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
from multidict import CIMultiDictProxy

from seglog.cluster import protocol
from seglog.errors import ClosedResourceError, RemoteError, SeglogError, ServerUnavailable

__all__ = ["DEFAULT_REQUEST_TIMEOUT_S", "NodeSession", "Reply"]

DEFAULT_REQUEST_TIMEOUT_S: Final = 60.0
# Connections kept per node: enough for a producer's in-flight requests plus a consumer's polls.
DEFAULT_POOL_CONNECTIONS: Final = 64


@dataclass(frozen=True)
class Reply:
    """A successful reply: status, headers, the body and its content type."""

    status: int
    headers: CIMultiDictProxy[str]
    body: bytes
    content_type: str

    def json(self) -> Any:
        """The body as JSON."""
        return json.loads(self.body)


class NodeSession:
    """HTTP to one node: ``await session.request("GET", "/v1/dbs")``.

    Non-2xx replies raise the exception the server named (as the embedded API would);
    connection failures and timeouts raise :class:`ServerUnavailable` with the cause chained
    (whether a produce took effect is then unknown).
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        pool_connections: int = DEFAULT_POOL_CONNECTIONS,
    ) -> None:
        protocol.check_http_url(url)
        self.url = url.rstrip("/")
        self._headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        self._ssl = ssl_context
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._pool_connections = pool_connections
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    def _open(self) -> aiohttp.ClientSession:
        if self._closed:
            raise ClosedResourceError("the client was closed")
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._pool_connections, ssl=self._ssl or True)
            self._session = aiohttp.ClientSession(
                connector=connector, headers=self._headers, timeout=self._timeout
            )
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int] | None = None,
        json_body: Any = None,
        data: bytes | memoryview | None = None,
        content_type: str | None = None,
        timeout_s: float | None = None,
    ) -> Reply:
        """Send one request and return its 2xx reply.

        Raises:
            SeglogError: The server's error, rebuilt (e.g. ``OffsetOutOfRange`` with ``start``/``end``).
            ServerUnavailable: No connection, a timeout, or the connection dropped.
        """
        session = self._open()
        headers = {}
        if json_body is not None:
            data = json.dumps(json_body).encode()
            content_type = protocol.JSON
        if content_type is not None:
            headers["Content-Type"] = content_type
        timeout = (  # the session's own (a producer passes it on every request): not built again
            self._timeout
            if timeout_s is None or timeout_s == self._timeout.total
            else aiohttp.ClientTimeout(total=timeout_s)
        )
        try:
            async with session.request(
                method,
                self.url + path,
                params=params,
                data=data,
                headers=headers,
                timeout=timeout,
            ) as response:
                body = await response.read()
                if response.status >= 400:
                    raise protocol.error_from_reply(
                        response.status, body, response.headers.get("Retry-After")
                    )
                if protocol.HEADER_NODE not in response.headers:
                    raise RemoteError(
                        f"{method} {self.url}{path}: HTTP {response.status} from something that is not a"
                        f" seglog node (no {protocol.HEADER_NODE} header; {response.content_type}):"
                        f" {body[:120]!r}"
                    )
                return Reply(response.status, response.headers, body, response.content_type)
        except SeglogError:
            raise
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise ServerUnavailable(f"{method} {self.url}{path}: {exc or type(exc).__name__}") from exc

    async def close(self) -> None:
        """Close the connection pool; idempotent."""
        self._closed = True
        if self._session is not None:
            await self._session.close()
            self._session = None
