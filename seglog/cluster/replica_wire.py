"""The replica fetch body: many shards' frames in one long-polled response, byte for byte.

A follower fetches every shard it follows from one leader node with one request (Kafka's
fetch session, simplified)::

    POST /v1/replica/fetch
    {"follower": node_id, "wait_ms": int, "max_bytes": int,
     "shards": [{"db", "shard", "offset", "leader_epoch"}, ...]}

The reply is :mod:`seglog.cluster.fetch_wire`'s many-shard reply (a part's error is e.g.
``NotLeader`` with the leader the node knows).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from seglog.cluster.fetch_wire import request_int, request_object
from seglog.errors import InvalidRequest

__all__ = ["PartRequest", "decode_request", "encode_request"]

_WHAT = "replica fetch"


@dataclass(frozen=True, slots=True)
class PartRequest:
    """One shard a follower asks for."""

    db: str
    shard: int
    # The follower's log end: it has everything before it.
    offset: int
    # The leader epoch the follower believes current (fences stale leaders and followers).
    leader_epoch: int


def encode_request(follower: int, parts: list[PartRequest], *, wait_ms: int, max_bytes: int) -> bytes:
    """The JSON body of a replica fetch."""
    return json.dumps(
        {
            "follower": follower,
            "wait_ms": wait_ms,
            "max_bytes": max_bytes,
            "shards": [
                {"db": p.db, "shard": p.shard, "offset": p.offset, "leader_epoch": p.leader_epoch}
                for p in parts
            ],
        },
        separators=(",", ":"),
    ).encode()


def decode_request(body: bytes) -> tuple[int, list[PartRequest], int, int]:
    """``(follower, parts, wait_ms, max_bytes)`` from a request body.

    Raises:
        InvalidRequest: The body is not such a request.
    """
    obj = request_object(body, _WHAT, list, "an object with a 'shards' list")
    parts = []
    for item in obj["shards"]:
        if not isinstance(item, dict) or not isinstance(item.get("db"), str):
            raise InvalidRequest("replica fetch: each shard is {db, shard, offset, leader_epoch}")
        parts.append(
            PartRequest(
                item["db"],
                request_int(item, "shard", what=_WHAT),
                request_int(item, "offset", what=_WHAT),
                request_int(item, "leader_epoch", what=_WHAT),
            )
        )
    return (
        request_int(obj, "follower", what=_WHAT),
        parts,
        request_int(obj, "wait_ms", what=_WHAT),
        request_int(obj, "max_bytes", 1, what=_WHAT),
    )
