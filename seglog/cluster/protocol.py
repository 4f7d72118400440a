"""The node API's wire contract, shared by the server, the client and the CLI.

One HTTP/1.1 API per node. Every path, header, content type and the error shape live here
so the server and the client cannot drift apart. Nothing in this module does I/O.

Endpoints (``{db}`` a database name, ``{shard}`` a shard number):

=======  =========================================  =========  ==========================================
method   path                                       permission what
=======  =========================================  =========  ==========================================
GET      /healthz                                   none       ``{"status": "ok"}``
GET      /metrics                                   none       Prometheus text
GET      /v1/dbs                                    read       ``{"dbs": [name, ...]}`` (only readable ones)
POST     /v1/dbs                                    admin      create: ``{"name", "shards", ...config}``
GET      /v1/dbs/{db}                               read       describe: config + per-shard offsets
PATCH    /v1/dbs/{db}                               admin      configure: ``{setting: value}``
DELETE   /v1/dbs/{db}                               admin      drop
POST     /v1/dbs/{db}/records                       write      produce (Arrow IPC stream or JSON lines)
GET      /v1/dbs/{db}/shards/{shard}/frames         read       fetch stored frames (long poll)
POST     /v1/dbs/{db}/fetch                         read       fetch many shards' frames (long poll)
GET      /v1/dbs/{db}/shards/{shard}/offset         read       ``?ts=µs`` -> ``{"offset"}``
GET      /v1/dbs/{db}/streams                       read       ``?filter=F`` -> the streams that may match
POST     /v1/dbs/{db}/iterators                     read       ``{"stream", "filter"}`` -> ``{"iterator"}``
POST     /v1/dbs/{db}/next                          read       an iterator's next records (long poll)
GET      /v1/dbs/{db}/generations                   read       ``{"generations": [slab, ...]}``
POST     /v1/dbs/{db}/generations                   admin      add a generation (201, the new slab)
DELETE   /v1/dbs/{db}/generations/{generation}      admin      drop a closed generation
GET      /v1/stats                                  read       store-wide stats
POST     /v1/dbs/{db}/groups/{group}/join           read       join/rejoin a consumer group
POST     /v1/dbs/{db}/groups/{group}/heartbeat      read       keep a membership alive
POST     /v1/dbs/{db}/groups/{group}/leave          read       leave a group
POST     /v1/dbs/{db}/groups/{group}/commit         read       commit offsets (generation-fenced)
GET      /v1/dbs/{db}/groups/{group}/committed      read       ``{"offsets": {shard: offset}}``
=======  =========================================  =========  ==========================================

Produce: query ``shard`` (optional, as ``append(shard=)``; required by a replicated
database) or ``shards=a,b,...`` (Arrow bodies: record batch ``i`` of the stream goes to shard
``shards[i]``, so one request carries many shards; on a replicated database this node must
lead every one of them) and ``acks`` (``1``, ``quorum`` or ``all``, the default; anything else is
``InvalidRequest`` before the body is read; on a database that is not replicated all three
mean the node's local write, durable under its fsync policy; on a replicated one ``1`` is
the leader's write, ``quorum`` a majority of the replicas, ``all`` every in-sync replica);
body ``application/vnd.apache.arrow.stream`` (columns as ``append_arrow``) or ``application/x-ndjson`` (one JSON record per line, see
:func:`json_record_to_columns`). Reply ``{"count": N, "parts": [{"shard", "base_offset",
"count"}, ...]}``: the records of one shard got ``base_offset, base_offset+1, ...`` in
input order.

Fetch: query ``offset``, ``max_bytes``, ``wait_ms``; reply body ``application/vnd.seglog.frames``
(the stored frames byte for byte, possibly starting below ``offset`` and running past the
high watermark: readers drop rows outside ``[offset, high watermark)``) and the
``Seglog-Log-Start``/``-End``/``-High-Watermark`` headers. Many shards in one poll: ``POST
.../fetch`` with ``{"shards": {"<shard>": offset}, "wait_ms", "max_bytes"}``, answered as soon
as any shard has records (:mod:`seglog.cluster.fetch_wire` draws the request and the reply).

Streams (MQTT topic filters through learned streams; see
:mod:`seglog.cluster.stream_routes`): ``GET .../streams?filter=F[&start_time_us=T][&shards=a,b]``
-> ``{"streams": [{"shard", "id", "structure", "special", "generation", "pattern"}]}``; ``POST
.../iterators`` ``{"stream": <one of them>, "filter", "start_time_us"?}`` -> ``{"iterator":
base64}``; ``POST .../next`` ``{"iterator", "max_records"?, "wait_ms"?}`` -> an Arrow IPC stream
of the records below the high watermark, the moved iterator in ``Seglog-Iterator`` and
``Seglog-End-Of-Stream: 0|1``. Iterators carry :func:`wire_db_id` of the database's name, so
they go on on any replica.

Groups (JSON bodies; see :mod:`seglog.cluster.coordinator`): join ``{"session_timeout_ms",
"member_id"?}`` and heartbeat ``{"member_id", "generation"}`` reply ``{"member_id",
"generation", "assignment": [shard, ...], "session_timeout_ms"}`` (a heartbeat under an older
generation is answered with the new one: that is how a member learns of a change); leave
``{"member_id"}`` -> ``{"left": bool}``; commit ``{"offsets": {shard: offset}, "member_id",
"generation"}`` -> ``{"committed": {...}}``, refused with ``StaleGeneration`` under an old
generation and ``UnknownMember`` from a member the group does not know (without
``member_id``: accepted only while the group has no members); committed ``?shards=0,1`` ->
``{"offsets": {shard: offset}}`` (shards never committed are absent). Memberships are kept in
the node's memory: after a restart members get ``UnknownMember`` and rejoin.

Authentication (a node started with tokens): ``Authorization: Bearer TOKEN``; none or an
unknown one is 401 ``AuthenticationFailed`` with ``WWW-Authenticate: Bearer``, a token lacking
the permission above is 403 ``PermissionDenied``. Permissions are ranked, ``admin`` > ``write``
> ``read``, each implying the lower ones on its scope (all databases, or one: ``DB:perm``);
create needs admin on the named database. See :mod:`seglog.cluster.auth`.

Limits: a body over the node's maximum is 413 ``RequestTooLarge``; appends over the in-flight
cap are 503 ``Overloaded`` and over the store quota 429 ``QuotaExceeded``, both with
``Retry-After``; a client that stalls mid-request is disconnected after the idle timeout.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any, Final
from urllib.parse import urlsplit

from seglog import errors

__all__ = [
    "API_PREFIX",
    "ARROW_STREAM",
    "DEFAULT_PORT",
    "FRAMES",
    "HEADER_END_OF_STREAM",
    "HEADER_HIGH_WATERMARK",
    "HEADER_ITERATOR",
    "HEADER_LOG_END",
    "HEADER_LOG_START",
    "HEADER_NODE",
    "JSON",
    "NDJSON",
    "WIRE_VERSION",
    "check_http_url",
    "error_from_payload",
    "error_from_reply",
    "error_payload",
    "is_retriable",
    "json_bytes",
    "status_for",
    "wire_db_id",
]

API_PREFIX: Final = "/v1"
DEFAULT_PORT: Final = 7070

ARROW_STREAM: Final = "application/vnd.apache.arrow.stream"
NDJSON: Final = "application/x-ndjson"
JSON: Final = "application/json"
FRAMES: Final = "application/vnd.seglog.frames"

HEADER_LOG_START: Final = "Seglog-Log-Start"
HEADER_LOG_END: Final = "Seglog-Log-End"
HEADER_HIGH_WATERMARK: Final = "Seglog-High-Watermark"
HEADER_ITERATOR: Final = "Seglog-Iterator"
HEADER_END_OF_STREAM: Final = "Seglog-End-Of-Stream"
# On every reply of a node (errors included), the wire version: a 2xx reply without it came
# from something else (a wrong URL, a proxy's page), and the client says so instead of
# misreading its body.
HEADER_NODE: Final = "Seglog-Node"
WIRE_VERSION: Final = "1"

# Status per error class; the most specific class listed wins (searched along the MRO).
_STATUS: Final[dict[type[errors.SeglogError], int]] = {
    errors.SeglogError: 500,
    errors.UsageError: 400,
    errors.AuthenticationFailed: 401,
    errors.PermissionDenied: 403,
    errors.DatabaseNotFound: 404,
    errors.DatabaseExists: 409,
    errors.ConfigMismatch: 409,
    errors.StaleGeneration: 409,
    errors.ProducerFenced: 409,
    errors.OutOfOrderSequence: 409,
    errors.BusyResourceError: 409,
    errors.OffsetMismatch: 409,
    errors.RequestTooLarge: 413,
    errors.UnsupportedContentType: 415,
    errors.OffsetOutOfRange: 416,
    errors.QuotaExceeded: 429,
    errors.ClosedResourceError: 503,
    errors.ServerUnavailable: 503,
    errors.StorageError: 500,
    errors.RemoteError: 502,
}

# Attributes an error carries over the wire (all JSON scalars or dicts of them).
_FIELDS: Final = (
    "index",
    "offset",
    "start",
    "end",
    "shard",
    "expected",
    "actual",
    "generation",
    "current",
    "retry_after_s",
    "written",
    "leader",
    "leader_epoch",
    "producer_id",
    "epoch",
    "got",
)

_RETRIABLE: Final = (errors.ServerUnavailable, errors.QuotaExceeded, errors.ClosedResourceError)


def status_for(exc: errors.SeglogError) -> int:
    """The HTTP status of an error class (stable: clients and docs rely on it)."""
    for cls in type(exc).__mro__:
        status = _STATUS.get(cls)
        if status is not None:
            return status
    return 500


def error_payload(exc: errors.SeglogError) -> dict[str, Any]:
    """``{"error": class name, "message": str, ...fields}``: never a traceback."""
    payload: dict[str, Any] = {"error": type(exc).__name__, "message": str(exc)}
    for name in _FIELDS:
        value = getattr(exc, name, None)
        if value is None:
            continue
        if isinstance(value, dict):
            value = {str(k): v for k, v in value.items() if isinstance(v, int | float | str)}
        if isinstance(value, int | float | str | dict):
            payload[name] = value
    return payload


def error_from_payload(status: int, payload: object) -> errors.SeglogError:
    """Rebuild the exception a server reported, as the embedded API would have raised it.

    Unknown class names (a newer server) become the nearest known class for the status.
    """
    if not isinstance(payload, dict) or not isinstance(payload.get("error"), str):
        return errors.RemoteError(f"HTTP {status} without a seglog error body")
    name = payload["error"]
    message = str(payload.get("message", ""))
    cls = getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, errors.SeglogError)):
        cls = _fallback_class(status)
    exc = cls.__new__(cls)
    Exception.__init__(exc, message)
    for field in _FIELDS:
        if field in payload:
            value = payload[field]
            if field == "written" and isinstance(value, dict):
                value = {int(k): v for k, v in value.items()}
            setattr(exc, field, value)
    if isinstance(exc, errors.AppendFailed) and not hasattr(exc, "failed"):
        exc.failed = {}
    return exc


def error_from_reply(status: int, body: bytes, retry_after: str | None = None) -> errors.SeglogError:
    """The exception a non-2xx reply names (its JSON body), as the embedded API would raise it.

    A body that is not a seglog error becomes :class:`~seglog.errors.RemoteError`; a
    ``Retry-After`` header (seconds) fills ``retry_after_s`` of a ``ServerUnavailable``.
    """
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return errors.RemoteError(f"HTTP {status} from the server, not a seglog reply: {body[:200]!r}")
    exc = error_from_payload(status, payload)
    if isinstance(exc, errors.ServerUnavailable) and retry_after is not None and retry_after.isdigit():
        exc.retry_after_s = float(retry_after)
    return exc


def _fallback_class(status: int) -> type[errors.SeglogError]:
    if status in (401,):
        return errors.AuthenticationFailed
    if status == 403:
        return errors.PermissionDenied
    if status == 503:
        return errors.ServerUnavailable
    if 400 <= status < 500:
        return errors.UsageError
    return errors.RemoteError


def check_http_url(url: object, what: str = "url") -> None:
    """``http[s]://HOST[:PORT][/...]`` with a host and a valid port (a node's or an etcd
    endpoint's URL).

    Raises:
        InvalidArgument: Anything else, naming ``what``.
    """
    usage = f"{what} must be http://HOST:PORT or https://HOST:PORT, not {url!r}"
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise errors.InvalidArgument(usage)
    try:
        parts = urlsplit(url)
        port = parts.port  # ValueError for a port that is not a number in 0..65535
    except ValueError as exc:
        raise errors.InvalidArgument(f"{usage}: {exc}") from None
    if not parts.hostname or port == 0:
        raise errors.InvalidArgument(usage)


def is_retriable(exc: BaseException) -> bool:
    """Whether sending the same request again later may succeed (the producer retries these)."""
    return isinstance(exc, _RETRIABLE)


def json_bytes(value: bytes) -> str | dict[str, str]:
    """Bytes as JSON the way the CLI writes them: UTF-8 text as a string, else ``{"base64": ...}``."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(value).decode("ascii")}


def wire_db_id(name: str) -> int:
    """The database id stream iterators carry on the wire: from the database's name, so the
    same on every replica (each node's own copy has a random id of its own)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8, person=b"seglog-db").digest(), "big")
