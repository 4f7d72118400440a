"""Every failure a node reports, as one JSON shape with a stable status (see protocol)."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from seglog import errors
from seglog.cluster import protocol
from seglog.cluster.context import NODE

__all__ = ["error_middleware", "error_response"]

log = logging.getLogger("seglog.server")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# aiohttp's own refusals, named as the seglog errors a client raises for them.
_HTTP_ERRORS: dict[int, type[errors.SeglogError]] = {
    400: errors.InvalidRequest,
    404: errors.InvalidRequest,
    405: errors.InvalidRequest,
    413: errors.RequestTooLarge,
    415: errors.UnsupportedContentType,
}


def error_response(exc: errors.SeglogError) -> web.Response:
    """The JSON reply for ``exc``; ``Retry-After`` on 429/503."""
    status = protocol.status_for(exc)
    headers = {}
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="seglog"'
    if status in (429, 503):
        retry = getattr(exc, "retry_after_s", None)
        headers["Retry-After"] = str(max(1, round(retry))) if isinstance(retry, int | float) else "1"
    return web.Response(
        status=status,
        body=json.dumps(protocol.error_payload(exc)).encode(),
        content_type=protocol.JSON,
        headers=headers,
    )


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn every exception into the protocol's error shape; never a traceback. Counts them."""
    try:
        return await handler(request)
    except errors.SeglogError as exc:
        error: errors.SeglogError = exc
        status = None
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        cls = _HTTP_ERRORS.get(exc.status, errors.InvalidRequest if exc.status < 500 else errors.SeglogError)
        reason = exc.text or exc.reason
        if exc.status == 404:
            reason = f"no such endpoint: {request.method} {request.path}"
        error, status = cls(reason), exc.status
    except ConnectionError:
        # The client went away mid-request (a stall closed by the connection guard, a
        # crash): nothing was written and nobody is left to read the reply; no traceback.
        log.info("client left during %s %s", request.method, request.path)
        error, status = errors.InvalidRequest("the connection was lost during the request"), None
    except Exception:
        log.exception("unexpected error serving %s %s", request.method, request.path)
        error, status = errors.SeglogError("internal server error (see the server log)"), None
    node = request.app.get(NODE)
    if node is not None:
        node.metrics.error(type(error).__name__)
    response = error_response(error)
    if status is not None:
        response.set_status(status)
    return response
