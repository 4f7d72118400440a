"""The many-shard fetch reply, and the consumer's many-shard fetch request.

One long poll answers for many shards: a follower fetching every shard it follows from one
leader (:mod:`seglog.cluster.replica_wire`), and a consumer fetching every shard it is
assigned (``POST /v1/dbs/{db}/fetch``)::

    {"wait_ms": int, "max_bytes": int, "shards": {"<shard>": offset, ...}, "leader_only"?: bool}

(``leader_only``: a cluster node answers a shard it does not lead with a ``NotLeader`` part
instead of its own copy below its high watermark; clients routing to leaders set it.)

The reply (``application/vnd.seglog.fetch-reply``) is a directory followed by the blobs, so
frames are never re-encoded or base64'd::

    DIRECTORY_LEN  uint32 big-endian: length of the JSON directory
    DIRECTORY      JSON {"parts": [{"db", "shard", "nbytes", "high_watermark", "log_start",
                                    "log_end", "leader_epoch", "arrow"?}
                                   | {"db", "shard", "status", "error": {...}}]}
    BLOBS          each part's body, ``nbytes`` each, in directory order

A part's body is the stored frames byte for byte, or (``"arrow": true``, tiered data below
the node's local log) an Arrow IPC stream of the rows with an ``offset`` column. A part with
``error`` carries :func:`seglog.cluster.protocol.error_payload`'s shape (the reader raises
that class for the shard, e.g. ``OffsetOutOfRange`` with ``start``/``end``).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from seglog.cluster import protocol
from seglog.errors import InvalidRequest, SeglogError

__all__ = [
    "FETCH_REPLY",
    "MAX_PARTS_PER_FETCH",
    "FetchPart",
    "ShardsRequest",
    "decode_reply",
    "decode_shards_request",
    "encode_reply",
    "encode_shards_request",
    "request_int",
    "request_object",
]

FETCH_REPLY: Final = "application/vnd.seglog.fetch-reply"
# Directory length prefix.
_DIRECTORY_LEN: Final = struct.Struct(">I")
MAX_PARTS_PER_FETCH: Final = 100_000


@dataclass(frozen=True, slots=True)
class FetchPart:
    """One shard's answer: its body and the node's offsets, or an error."""

    db: str
    shard: int
    frames: bytes = b""
    high_watermark: int = 0
    log_start: int = 0
    log_end: int = 0
    leader_epoch: int = 0
    error: SeglogError | None = None
    # ``frames`` is an Arrow IPC stream of rows (tiered data), not stored frames.
    arrow: bool = False


def request_int(obj: Mapping[str, Any], name: str, minimum: int = 0, *, what: str = "fetch") -> int:
    """``obj[name]`` as an int ``>= minimum``.

    Raises:
        InvalidRequest: Missing, not an int, or too small.
    """
    value = obj.get(name)
    if type(value) is not int or value < minimum:
        raise InvalidRequest(f"{what}: {name!r} must be an integer >= {minimum}, not {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class ShardsRequest:
    """A consumer's fetch of many shards of one database."""

    # Shard -> the offset to read from, in the order the node spends ``max_bytes``.
    offsets: dict[int, int]
    # Longest wait for records (ms); 0 answers at once.
    wait_ms: int
    # Most bytes of frames in the reply (at least one frame when any is due).
    max_bytes: int
    # Only the shards' leaders answer (see the module docstring).
    leader_only: bool = False


def request_object(body: bytes, what: str, shards_type: type, shape: str) -> dict[str, Any]:
    """A fetch body's JSON object, with a ``shards`` of ``shards_type`` of bounded size.

    Raises:
        InvalidRequest: Not JSON, not such an object, or too many shards.
    """
    try:
        obj = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidRequest(f"{what}: not JSON: {exc}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("shards"), shards_type):
        raise InvalidRequest(f"{what}: expected {shape}")
    if len(obj["shards"]) > MAX_PARTS_PER_FETCH:
        raise InvalidRequest(f"{what}: more than {MAX_PARTS_PER_FETCH} shards")
    return obj


def encode_shards_request(request: ShardsRequest) -> bytes:
    """The JSON body of a consumer's fetch."""
    obj: dict[str, Any] = {
        "wait_ms": request.wait_ms,
        "max_bytes": request.max_bytes,
        "shards": {str(s): o for s, o in request.offsets.items()},
    }
    if request.leader_only:
        obj["leader_only"] = True
    return json.dumps(obj, separators=(",", ":")).encode()


def decode_shards_request(body: bytes) -> ShardsRequest:
    """A consumer's fetch body, checked.

    Shard numbers are checked against the database by the caller.

    Raises:
        InvalidRequest: The body is not such a request.
    """
    obj = request_object(body, "fetch", dict, '{"shards": {"<shard>": offset, ...}, "wait_ms", "max_bytes"}')
    if not obj["shards"]:
        raise InvalidRequest("fetch: no shards asked for")
    offsets = {}
    for key, offset in obj["shards"].items():
        if not key.isdecimal() or type(offset) is not int or offset < 0:
            raise InvalidRequest(
                f"fetch: shard {key!r}: expected a shard number and an offset >= 0, not {offset!r}"
            )
        offsets[int(key)] = offset
    leader_only = obj.get("leader_only", False)
    if type(leader_only) is not bool:
        raise InvalidRequest(f"fetch: 'leader_only' must be true or false, not {leader_only!r}")
    return ShardsRequest(offsets, request_int(obj, "wait_ms"), request_int(obj, "max_bytes", 1), leader_only)


def encode_reply(parts: list[FetchPart]) -> bytes:
    """The reply body for ``parts`` (bodies appended after the directory, unchanged)."""
    directory: list[dict[str, Any]] = []
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
        item: dict[str, Any] = {
            "db": p.db,
            "shard": p.shard,
            "nbytes": len(p.frames),
            "high_watermark": p.high_watermark,
            "log_start": p.log_start,
            "log_end": p.log_end,
            "leader_epoch": p.leader_epoch,
        }
        if p.arrow:
            item["arrow"] = True
        directory.append(item)
    head = json.dumps({"parts": directory}, separators=(",", ":")).encode()
    return b"".join([_DIRECTORY_LEN.pack(len(head)), head, *(p.frames for p in parts if p.error is None)])


def decode_reply(body: bytes) -> list[FetchPart]:
    """The parts of a reply body (each part's body is a slice of ``body``).

    Raises:
        InvalidRequest: The body is truncated or malformed.
    """
    if len(body) < _DIRECTORY_LEN.size:
        raise InvalidRequest("fetch reply: truncated before its directory")
    (head_len,) = _DIRECTORY_LEN.unpack_from(body)
    start = _DIRECTORY_LEN.size
    try:
        directory = json.loads(body[start : start + head_len])["parts"]
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise InvalidRequest(f"fetch reply: bad directory: {exc}") from None
    pos = start + head_len
    parts = []
    try:
        for item in directory:
            if "error" in item:
                error = protocol.error_from_payload(int(item.get("status", 500)), item["error"])
                parts.append(FetchPart(item["db"], int(item["shard"]), error=error))
                continue
            end = pos + int(item["nbytes"])
            if end > len(body):
                raise InvalidRequest("fetch reply: truncated frames")
            parts.append(
                FetchPart(
                    item["db"],
                    int(item["shard"]),
                    body[pos:end],
                    int(item["high_watermark"]),
                    int(item["log_start"]),
                    int(item["log_end"]),
                    int(item["leader_epoch"]),
                    arrow=bool(item.get("arrow", False)),
                )
            )
            pos = end
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidRequest(f"fetch reply: bad directory entry: {exc!r}") from None
    if pos != len(body):
        raise InvalidRequest("fetch reply: bytes after the last part")
    return parts
