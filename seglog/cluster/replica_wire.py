"""The replica fetch body: many shards' frames in one long-polled response, byte for byte.

A follower fetches every shard it follows from one leader node with one request (Kafka's
fetch session, simplified)::

    POST /v1/replica/fetch
    {"follower": node_id, "wait_ms": int, "max_bytes": int,
     "shards": [{"db", "shard", "offset", "leader_epoch"}, ...]}

The reply (``application/vnd.seglog.replica-fetch``) is a directory followed by the frame
blobs, so frames are never re-encoded or base64'd::

    DIRECTORY_LEN  uint32 big-endian: length of the JSON directory
    DIRECTORY      JSON {"parts": [{"db", "shard", "nbytes", "high_watermark", "log_start",
                                    "log_end", "leader_epoch"} | {"db", "shard", "status", "error": {...}}]}
    BLOBS          each part's frames, ``nbytes`` each, in directory order

A part with ``error`` carries :func:`seglog.cluster.protocol.error_payload`'s shape (the
follower raises that class for the shard, e.g. ``NotLeader`` with the leader it knows).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any, Final

from seglog.cluster import protocol
from seglog.errors import InvalidRequest, SeglogError

__all__ = [
    "REPLICA_FETCH",
    "FetchPart",
    "PartRequest",
    "decode_reply",
    "decode_request",
    "encode_reply",
    "encode_request",
]

REPLICA_FETCH: Final = "application/vnd.seglog.replica-fetch"
# Directory length prefix.
_DIRECTORY_LEN: Final = struct.Struct(">I")
MAX_PARTS_PER_FETCH: Final = 100_000


@dataclass(frozen=True, slots=True)
class PartRequest:
    """One shard a follower asks for."""

    db: str
    shard: int
    # The follower's log end: it has everything before it.
    offset: int
    # The leader epoch the follower believes current (fences stale leaders and followers).
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class FetchPart:
    """One shard's answer: frames and the leader's offsets, or an error."""

    db: str
    shard: int
    frames: bytes = b""
    high_watermark: int = 0
    log_start: int = 0
    log_end: int = 0
    leader_epoch: int = 0
    error: SeglogError | None = None


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


def _int(obj: dict[str, Any], name: str, minimum: int = 0) -> int:
    value = obj.get(name)
    if type(value) is not int or value < minimum:
        raise InvalidRequest(f"replica fetch: {name!r} must be an integer >= {minimum}, not {value!r}")
    return value


def decode_request(body: bytes) -> tuple[int, list[PartRequest], int, int]:
    """``(follower, parts, wait_ms, max_bytes)`` from a request body.

    Raises:
        InvalidRequest: The body is not such a request.
    """
    try:
        obj = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidRequest(f"replica fetch: not JSON: {exc}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("shards"), list):
        raise InvalidRequest("replica fetch: expected an object with a 'shards' list")
    if len(obj["shards"]) > MAX_PARTS_PER_FETCH:
        raise InvalidRequest(f"replica fetch: more than {MAX_PARTS_PER_FETCH} shards")
    parts = []
    for item in obj["shards"]:
        if not isinstance(item, dict) or not isinstance(item.get("db"), str):
            raise InvalidRequest("replica fetch: each shard is {db, shard, offset, leader_epoch}")
        parts.append(
            PartRequest(item["db"], _int(item, "shard"), _int(item, "offset"), _int(item, "leader_epoch"))
        )
    return _int(obj, "follower"), parts, _int(obj, "wait_ms"), _int(obj, "max_bytes", 1)


def encode_reply(parts: list[FetchPart]) -> bytes:
    """The reply body for ``parts`` (frames appended after the directory, unchanged)."""
    directory = []
    for p in parts:
        if p.error is not None:
            directory.append(
                {
                    "db": p.db,
                    "shard": p.shard,
                    "status": protocol.status_for(p.error),
                    "error": protocol.error_payload(p.error),
                }
            )
            continue
        directory.append(
            {
                "db": p.db,
                "shard": p.shard,
                "nbytes": len(p.frames),
                "high_watermark": p.high_watermark,
                "log_start": p.log_start,
                "log_end": p.log_end,
                "leader_epoch": p.leader_epoch,
            }
        )
    head = json.dumps({"parts": directory}, separators=(",", ":")).encode()
    return b"".join([_DIRECTORY_LEN.pack(len(head)), head, *(p.frames for p in parts if p.error is None)])


def decode_reply(body: bytes) -> list[FetchPart]:
    """The parts of a reply body (each part's frames are a slice of ``body``).

    Raises:
        InvalidRequest: The body is truncated or malformed.
    """
    if len(body) < _DIRECTORY_LEN.size:
        raise InvalidRequest("replica fetch reply: truncated before its directory")
    (head_len,) = _DIRECTORY_LEN.unpack_from(body)
    start = _DIRECTORY_LEN.size
    try:
        directory = json.loads(body[start : start + head_len])["parts"]
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise InvalidRequest(f"replica fetch reply: bad directory: {exc}") from None
    pos = start + head_len
    parts = []
    for item in directory:
        if "error" in item:
            error = protocol.error_from_payload(int(item.get("status", 500)), item["error"])
            parts.append(FetchPart(item["db"], int(item["shard"]), error=error))
            continue
        end = pos + int(item["nbytes"])
        if end > len(body):
            raise InvalidRequest("replica fetch reply: truncated frames")
        parts.append(
            FetchPart(
                item["db"],
                int(item["shard"]),
                body[pos:end],
                int(item["high_watermark"]),
                int(item["log_start"]),
                int(item["log_end"]),
                int(item["leader_epoch"]),
            )
        )
        pos = end
    if pos != len(body):
        raise InvalidRequest("replica fetch reply: bytes after the last part")
    return parts
