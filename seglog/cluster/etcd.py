"""A small async etcd v3 client over etcd's JSON gateway (``/v3/...``), on aiohttp.

The cluster keeps its metadata (node leases, shard leadership, the controller lease) in a
real etcd; this module is the only code that speaks to it. It covers what the cluster uses:
ranges, puts (optionally under a lease), deletes, compare-and-swap transactions on a key's
``mod_revision``, leases (grant, keep-alive, revoke, time to live) and prefix watches from a
revision. etcd's gateway encodes keys and values in base64 and 64-bit integers as strings;
callers see ``bytes`` and ``int``.

Why not a gRPC client: the maintained async ones pin protobuf/grpc versions that conflict
with pyarrow's and Spark's, and the JSON gateway ships with every etcd since 3.3 (the Debian
package the Makefile installs is 3.4). No consensus is implemented here: every decision that
must be atomic is one etcd transaction.
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final, TypeVar

import aiohttp

from seglog.cluster.protocol import check_http_url
from seglog.errors import InvalidArgument, LeaseNotFound, MetadataError

__all__ = [
    "Compare",
    "CompareTarget",
    "EtcdClient",
    "KeyValue",
    "Op",
    "TxnResult",
    "WatchEvent",
    "WatchEventType",
    "prefix_end",
]

# The gateway's path prefix; etcd 3.4 also serves /v3beta, 3.3 only /v3beta.
GATEWAY_PREFIX: Final = "/v3"
DEFAULT_REQUEST_TIMEOUT_S: Final = 5.0
# Every JSON reply of etcd's gateway carries one of these (its response header, a streamed
# call's result, or an error): a 200 without any came from something else.
_ETCD_REPLY_KEYS: Final = frozenset({"header", "result", "error"})
# A watch stream stays open indefinitely; only connecting is bounded.
WATCH_CONNECT_TIMEOUT_S: Final = 5.0

T = TypeVar("T")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def _revision(reply: dict[str, Any]) -> int:
    """The store revision in a reply's header."""
    return int(reply["header"]["revision"])


def prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with ``prefix`` (etcd's range end)."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\x00"  # etcd: "\0" as range_end means "to the end of the keyspace"


@dataclass(frozen=True, slots=True)
class KeyValue:
    """One key as etcd stores it."""

    key: bytes
    value: bytes
    # Revision of the key's last change: what a compare-and-swap compares.
    mod_revision: int
    create_revision: int
    # Number of changes since creation (0 = absent in compares).
    version: int
    # The lease the key is attached to (0: none).
    lease: int

    @classmethod
    def _from(cls, kv: dict[str, Any]) -> KeyValue:
        return cls(
            key=_unb64(kv.get("key")),
            value=_unb64(kv.get("value")),
            mod_revision=int(kv.get("mod_revision", 0)),
            create_revision=int(kv.get("create_revision", 0)),
            version=int(kv.get("version", 0)),
            lease=int(kv.get("lease", 0)),
        )


class CompareTarget(Enum):
    """Which revision of a key a :class:`Compare` looks at."""

    # Revision of the key's last change: guards a read-modify-write.
    MOD = "mod_revision"
    # Revision that created the key: stays fixed while the key lives (a lease holder's epoch).
    CREATE = "create_revision"


@dataclass(frozen=True, slots=True)
class Compare:
    """A transaction guard: the key's revision (``target``) equals ``revision``.

    ``revision=0`` means "the key does not exist" (etcd reports 0 for absent keys), which is
    how a create-if-absent is written.
    """

    key: bytes
    revision: int
    target: CompareTarget = CompareTarget.MOD

    def _json(self) -> dict[str, Any]:
        return {
            "key": _b64(self.key),
            "target": "MOD" if self.target is CompareTarget.MOD else "CREATE",
            "result": "EQUAL",
            self.target.value: str(self.revision),
        }


@dataclass(frozen=True, slots=True)
class Op:
    """One operation of a transaction branch: put (value given) or delete (``value is None``)."""

    key: bytes
    value: bytes | None = None
    lease: int = 0

    def _json(self) -> dict[str, Any]:
        if self.value is None:
            return {"request_delete_range": {"key": _b64(self.key)}}
        put: dict[str, Any] = {"key": _b64(self.key), "value": _b64(self.value)}
        if self.lease:
            put["lease"] = str(self.lease)
        return {"request_put": put}


@dataclass(frozen=True, slots=True)
class TxnResult:
    """Whether the compares held (the success branch ran) and the revision after it."""

    succeeded: bool
    revision: int


class WatchEventType(Enum):
    """What happened to a watched key."""

    PUT = "PUT"
    DELETE = "DELETE"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change seen by a watch; ``kv.value`` is empty for a delete."""

    type: WatchEventType
    kv: KeyValue


def _watch_line(line: bytes) -> tuple[dict[str, Any], list[WatchEvent]]:
    """One line of a watch stream: its ``result`` and the events in it.

    Raises:
        MetadataError: The line is not etcd's (the stream cannot be trusted past it).
    """
    try:
        result = json.loads(line).get("result", {})
        events = [
            WatchEvent(WatchEventType(e.get("type", "PUT")), KeyValue._from(e["kv"]))
            for e in result.get("events") or []
        ]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise MetadataError(f"etcd watch: a reply line that is not etcd's: {line[:120]!r}") from exc
    return result, events


class EtcdClient:
    """An etcd client for one or more endpoints (tried in order until one answers).

    Use ``async with EtcdClient(urls) as etcd`` or call :meth:`close`.
    """

    def __init__(
        self, endpoints: str | Sequence[str], *, request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    ) -> None:
        """A client for ``endpoints`` (``http://host:port``; a comma-separated string is split)."""
        urls = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
        urls = [u.strip().rstrip("/") for u in urls if u.strip()]
        if not urls:
            raise InvalidArgument("no etcd endpoint given")
        for url in urls:
            check_http_url(url, "etcd endpoint")
        if request_timeout_s <= 0:
            raise InvalidArgument("request_timeout_s must be positive")
        self.endpoints: tuple[str, ...] = tuple(urls)
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        self._session: aiohttp.ClientSession | None = None
        # Index of the endpoint that answered last: tried first next time.
        self._preferred = 0

    async def __aenter__(self) -> EtcdClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the HTTP session (idempotent)."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session

    def _order(self) -> list[int]:
        n = len(self.endpoints)
        return [(self._preferred + i) % n for i in range(n)]

    async def _call(self, path: str, body: dict[str, Any], parse: Callable[[dict[str, Any]], T]) -> T:
        """POST ``body`` to ``path`` on the endpoints in turn; ``parse(reply)`` of the first that
        answers as etcd.

        An endpoint that cannot be reached, answers 5xx (a member without a leader, one
        shutting down) or answers 200 with something that is not etcd's JSON (a wrong URL in
        the list: another HTTP service) is skipped for the next. A 4xx reply is etcd's answer.
        """
        last: BaseException | None = None
        for index in self._order():
            url = self.endpoints[index] + GATEWAY_PREFIX + path
            try:
                async with self._http().post(url, json=body) as resp:
                    status = resp.status
                    text = await resp.text(errors="replace")
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                last = exc
                continue
            if status != 200:
                error = self._error(path, status, text)
                if status < 500 or isinstance(error, LeaseNotFound):
                    raise error
                last = error
                continue
            try:
                reply = json.loads(text)
                if not isinstance(reply, dict) or not _ETCD_REPLY_KEYS.intersection(reply):
                    raise TypeError("no etcd response header")
                result = parse(reply)
            except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
                last = MetadataError(
                    f"etcd {path}: {self.endpoints[index]} answered HTTP 200 with a reply that is not"
                    f" etcd's ({type(exc).__name__}: {exc}): {text[:120]!r}"
                )
                last.__cause__ = exc
                continue
            self._preferred = index
            return result
        reason = "" if last is None else f" (last: {str(last) or type(last).__name__})"
        raise MetadataError(f"etcd {path}: no endpoint of {list(self.endpoints)} answered{reason}") from last

    @staticmethod
    def _error(path: str, status: int, text: str) -> MetadataError:
        try:
            payload = json.loads(text)
            message = str(payload.get("error") or payload.get("message") or text)
        except (json.JSONDecodeError, AttributeError):
            message = text
        if "requested lease not found" in message:
            return LeaseNotFound(f"etcd {path}: {message}")
        return MetadataError(f"etcd {path}: HTTP {status}: {message}")

    # --- keys ---------------------------------------------------------------------------

    async def get(self, key: bytes) -> KeyValue | None:
        """The key, or ``None`` when absent."""

        def parse(reply: dict[str, Any]) -> KeyValue | None:
            kvs = reply.get("kvs") or []
            return KeyValue._from(kvs[0]) if kvs else None

        return await self._call("/kv/range", {"key": _b64(key)}, parse)

    async def get_prefix(self, prefix: bytes) -> tuple[list[KeyValue], int]:
        """Every key under ``prefix`` in key order, and the store revision they were read at."""

        def parse(reply: dict[str, Any]) -> tuple[list[KeyValue], int]:
            return [KeyValue._from(kv) for kv in reply.get("kvs") or []], _revision(reply)

        body = {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix))}
        return await self._call("/kv/range", body, parse)

    async def put(self, key: bytes, value: bytes, *, lease: int = 0) -> int:
        """Write ``key`` unconditionally; returns the new store revision."""
        body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = str(lease)
        return await self._call("/kv/put", body, _revision)

    async def delete(self, key: bytes) -> bool:
        """Delete ``key``; whether it existed."""
        return await self._call("/kv/deleterange", {"key": _b64(key)}, lambda r: int(r.get("deleted", 0)) > 0)

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        """One atomic transaction: if every compare holds run ``success``, else ``failure``."""
        return await self._call(
            "/kv/txn",
            {
                "compare": [c._json() for c in compares],
                "success": [op._json() for op in success],
                "failure": [op._json() for op in failure],
            },
            lambda r: TxnResult(bool(r.get("succeeded", False)), _revision(r)),
        )

    async def cas(self, key: bytes, mod_revision: int, value: bytes | None, *, lease: int = 0) -> bool:
        """Write (or delete, ``value=None``) ``key`` only if its ``mod_revision`` is unchanged.

        ``mod_revision=0`` creates the key only if absent.
        """
        result = await self.txn([Compare(key, mod_revision)], [Op(key, value, lease)])
        return result.succeeded

    # --- leases -------------------------------------------------------------------------

    async def lease_grant(self, ttl_s: int) -> int:
        """A new lease of ``ttl_s`` seconds; its id."""
        if ttl_s < 1:
            raise InvalidArgument("a lease TTL is at least 1 s")

        def parse(reply: dict[str, Any]) -> int:
            if reply.get("error"):
                raise MetadataError(f"etcd lease grant: {reply['error']}")
            return int(reply["ID"])

        return await self._call("/lease/grant", {"TTL": str(ttl_s)}, parse)

    async def lease_keepalive(self, lease: int) -> int:
        """Refresh the lease once; its remaining TTL in seconds.

        Raises:
            LeaseNotFound: The lease expired or was revoked (its keys are gone).
        """

        def parse(reply: dict[str, Any]) -> int:
            result = reply.get("result", reply)
            return int(result.get("TTL", 0))

        ttl = await self._call("/lease/keepalive", {"ID": str(lease)}, parse)
        if ttl <= 0:
            raise LeaseNotFound(f"etcd lease {lease} expired or was revoked")
        return ttl

    async def lease_revoke(self, lease: int) -> None:
        """Revoke the lease, deleting every key attached to it (absent leases are ignored)."""
        with contextlib.suppress(LeaseNotFound):
            await self._call("/lease/revoke", {"ID": str(lease)}, lambda r: None)

    async def lease_ttl(self, lease: int) -> int:
        """Remaining TTL in seconds; -1 when the lease does not exist."""
        return await self._call("/lease/timetolive", {"ID": str(lease)}, lambda r: int(r.get("TTL", -1)))

    # --- watches ------------------------------------------------------------------------

    async def watch_prefix(self, prefix: bytes, *, start_revision: int) -> AsyncIterator[list[WatchEvent]]:
        """Changes under ``prefix`` from ``start_revision`` on, one list per etcd notification.

        Start from the revision :meth:`get_prefix` returned plus one to miss nothing between
        a read and its watch. The iterator ends (raising :class:`MetadataError`) if the stream
        breaks; the caller re-reads and watches again.
        """
        body = {
            "create_request": {
                "key": _b64(prefix),
                "range_end": _b64(prefix_end(prefix)),
                "start_revision": str(start_revision),
            }
        }
        url = self.endpoints[self._preferred] + GATEWAY_PREFIX + "/watch"
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=WATCH_CONNECT_TIMEOUT_S)
        try:
            async with self._http().post(url, json=body, timeout=timeout) as resp:
                if resp.status != 200:
                    raise self._error("/watch", resp.status, await resp.text())
                async for line in resp.content:
                    if not line.strip():
                        continue
                    result, events = _watch_line(line)
                    if result.get("canceled"):
                        reason = result.get("cancel_reason", "canceled")
                        raise MetadataError(f"etcd watch canceled: {reason}")
                    if events:
                        yield events
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise MetadataError("etcd watch stream broke") from exc
        raise MetadataError("etcd watch stream ended")
