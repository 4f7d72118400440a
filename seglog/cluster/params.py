"""Query parameters and JSON bodies of requests, validated into clear errors."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from seglog.cluster import protocol
from seglog.errors import InvalidArgument, InvalidRequest, UnsupportedContentType

__all__ = ["json_body", "query_int", "shard_param"]

_MAX_QUERY_INT = 2**63 - 1


def query_int(
    request: web.Request,
    name: str,
    default: int | None = None,
    *,
    minimum: int = 0,
    maximum: int = _MAX_QUERY_INT,
) -> int | None:
    """An integer query parameter in ``[minimum, maximum]`` (``default`` when absent)."""
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw, 10)
    except ValueError:
        raise InvalidRequest(f"query parameter {name} must be an integer, not {raw[:40]!r}") from None
    if not minimum <= value <= maximum:
        raise InvalidRequest(f"query parameter {name} must be in {minimum}..{maximum}, not {value}")
    return value


def shard_param(request: web.Request, shards: int) -> int:
    """The ``{shard}`` path segment, checked against the database's shard count."""
    raw = request.match_info["shard"]
    if not raw.isdigit() or len(raw) > 12:
        raise InvalidRequest(f"shard must be a number, not {raw[:40]!r}")
    shard = int(raw)
    if shard >= shards:
        raise InvalidArgument(f"shard must be an int in 0..{shards - 1}, not {shard}")
    return shard


async def json_body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object body (empty body: ``{}``)."""
    if request.can_read_body and request.content_type not in (protocol.JSON, "application/octet-stream", ""):
        raise UnsupportedContentType(f"expected {protocol.JSON}, not {request.content_type}")
    raw = await request.read()
    if not raw:
        return {}
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidRequest(f"the body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object")
    return body
