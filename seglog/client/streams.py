"""MQTT stream reads over a node's HTTP API: the embedded ``get_streams`` / ``make_iterator`` /
``next_arrow`` for services that are not the store's process.

    async with StreamReader("http://127.0.0.1:7070", "telemetry") as reader:
        for stream in await reader.get_streams("sensors/+/temp"):
            it = await reader.make_iterator(stream, "sensors/+/temp")
            it, table = await reader.next_arrow(it, 1000, wait_ms=500)

Iterators are :class:`seglog.Iterator` objects: ``it.to_bytes()`` stores one in a few dozen
bytes, and it goes on later on any node of the database (a replicated database's iterators
survive a failover). Records come below the shard's high watermark only. With
``bootstrap=`` (a cluster) each shard's requests go to its leader, found again after
``NotLeader`` or a node that stopped answering.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Final

import pyarrow as pa

from seglog.client._http import DEFAULT_REQUEST_TIMEOUT_S, NodeSession
from seglog.client._metadata import LeaderCache
from seglog.cluster import protocol
from seglog.cluster.stream_wire import (
    MAX_NEXT_ITERATORS,
    MAX_NEXT_RECORDS,
    decode_next_reply,
    iterator_from_text,
    iterator_text,
    stream_from_json,
    stream_json,
)
from seglog.errors import (
    ClosedResourceError,
    ForeignIterator,
    InvalidArgument,
    InvalidIterator,
    NotLeader,
    RemoteError,
    ServerUnavailable,
)
from seglog.iterators import Iterator, Stream
from seglog.record import READ_SCHEMA, Record, records_from_table

__all__ = ["StreamReader"]

# Routed requests: how many times a shard's leader is looked up again after NotLeader or an
# unreachable node before the error reaches the caller (a failover takes a lease TTL).
_ROUTE_ATTEMPTS: Final = 8
# An iterator's rows until its node answers (tables are immutable: one serves them all).
_NO_ROWS: Final = READ_SCHEMA.empty_table()


class StreamReader:
    """Reads a database's MQTT streams from a node (or a cluster's shard leaders).

    Args:
        url: A node's URL.
        db: The database.
        bootstrap: The other nodes of a cluster: requests then go to each shard's leader.
        token: A bearer token with ``read`` on the database.
        ssl: TLS context for ``https://`` nodes.
        request_timeout_s: Per request, on top of a long poll's ``wait_ms``.
    """

    def __init__(
        self,
        url: str,
        db: str,
        *,
        bootstrap: Sequence[str] | None = None,
        token: str | None = None,
        ssl: ssl.SSLContext | None = None,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    ) -> None:
        if not isinstance(db, str) or not db:
            raise InvalidArgument(f"db must be a database name, not {db!r}")
        protocol.check_http_url(url)
        self.db = db
        self._path = f"{protocol.API_PREFIX}/dbs/{db}"
        self._wire_id = protocol.wire_db_id(db)
        self._timeout_s = request_timeout_s
        self._session = NodeSession(url, token=token, ssl_context=ssl, timeout_s=request_timeout_s)
        self._leaders = (
            None
            if bootstrap is None
            else LeaderCache([url, *bootstrap], token=token, ssl_context=ssl, timeout_s=request_timeout_s)
        )
        self._closed = False

    async def __aenter__(self) -> StreamReader:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connections; idempotent."""
        self._closed = True
        await self._session.close()
        if self._leaders is not None:
            await self._leaders.close()

    # --- routing -------------------------------------------------------------------------

    async def _to_shard(self, shard: int, method: str, path: str, **kw: Any) -> Any:
        """One request to ``shard``'s leader (any node without ``bootstrap``)."""
        if self._closed:
            raise ClosedResourceError("the stream reader is closed")
        if self._leaders is None:
            return await self._session.request(method, self._path + path, **kw)
        last: Exception | None = None
        for attempt in range(_ROUTE_ATTEMPTS):
            try:
                url = await self._leaders.leader_url(self.db, shard)
                return await self._leaders.session(url).request(method, self._path + path, **kw)
            except (NotLeader, ServerUnavailable) as exc:
                last = exc
                await self._leaders.refresh(force=attempt > 0)
        assert last is not None
        raise last

    async def _shards_by_leader(self) -> list[tuple[int | None, list[int] | None]]:
        """``(a shard of the group, the group's shards)`` per leader; one ``(None, None)``
        (every shard, one node) without ``bootstrap``."""
        if self._leaders is None:
            return [(None, None)]
        view = await self._leaders.refresh(want_db=self.db)
        leaders = view.leaders.get(self.db)
        if leaders is None:
            await self._leaders.leader_url(self.db, 0)  # raises DatabaseNotFound
            leaders = self._leaders.view.leaders[self.db]
        groups: dict[int, list[int]] = {}
        for shard, (leader, _epoch) in enumerate(leaders):
            groups.setdefault(leader, []).append(shard)
        return [(shards[0], shards) for shards in groups.values()]

    # --- the API -------------------------------------------------------------------------

    async def get_streams(self, topic_filter: str, start_time_us: int = 0) -> list[Stream]:
        """The streams that may hold records matching an MQTT topic filter (as
        ``Database.get_streams``), ordered by generation, shard and id.

        Raises:
            InvalidTopicFilter: A malformed filter.
            InvalidArgument: The database has no streams.
        """
        if not isinstance(topic_filter, str):
            raise InvalidArgument(f"topic_filter must be a string, not {topic_filter!r}")
        if type(start_time_us) is not int:
            raise InvalidArgument(f"start_time_us must be an int (µs), not {start_time_us!r}")
        found: list[Stream] = []
        for shard, shards in await self._shards_by_leader():
            params: dict[str, str | int] = {"filter": topic_filter, "start_time_us": start_time_us}
            if shards is None or shard is None:
                reply = await self._to_shard(0, "GET", "/streams", params=params)
            else:
                params["shards"] = ",".join(map(str, shards))
                reply = await self._to_shard(shard, "GET", "/streams", params=params)
            found.extend(self._stream(obj) for obj in _json(reply)["streams"])
        found.sort(key=lambda s: (s.generation, s.shard, s.id))
        return found

    def _stream(self, obj: Any) -> Stream:
        try:
            return stream_from_json(obj, self._wire_id)
        except ValueError as exc:
            raise RemoteError(f"malformed stream in a node's reply: {exc}") from exc

    async def make_iterator(self, stream: Stream, topic_filter: str, start_time_us: int = 0) -> Iterator:
        """An iterator at the start of ``stream`` for the records matching ``topic_filter``.

        Raises:
            ForeignIterator: ``stream`` is another database's.
            UnknownStream: The database has no such stream (any more).
            StreamFilterMismatch: The filter can match no topic of the stream.
        """
        (it,) = await self.make_iterators([stream], topic_filter, start_time_us)
        return it

    async def make_iterators(
        self, streams: Sequence[Stream], topic_filter: str, start_time_us: int = 0
    ) -> list[Iterator]:
        """:meth:`make_iterator` for many streams: one request per node, in the order given."""
        streams = list(streams)
        for stream in streams:
            if not isinstance(stream, Stream):
                raise InvalidArgument(f"make_iterators takes Streams, not {type(stream).__name__}")
            if stream.db_id != self._wire_id:
                raise ForeignIterator(f"a stream is not one of {self.db!r}'s")
        if len(streams) > MAX_NEXT_ITERATORS:
            raise InvalidArgument(f"make_iterators takes at most {MAX_NEXT_ITERATORS} streams")
        groups: dict[str | None, list[int]] = {}
        for i, stream in enumerate(streams):
            url = None if self._leaders is None else await self._leaders.leader_url(self.db, stream.shard)
            groups.setdefault(url, []).append(i)
        out: list[Iterator | None] = [None] * len(streams)
        for indexes in groups.values():
            body = {
                "streams": [stream_json(streams[i]) for i in indexes],
                "filter": topic_filter,
                "start_time_us": start_time_us,
            }
            reply = await self._to_shard(streams[indexes[0]].shard, "POST", "/iterators", json_body=body)
            made = _json(reply).get("iterators")
            if not isinstance(made, list) or len(made) != len(indexes):
                raise RemoteError("a node answered for other streams than it was asked")
            for i, text in zip(indexes, made, strict=True):
                out[i] = _iterator(text)
        return [it for it in out if it is not None]

    async def next_arrow(
        self, iterator: Iterator, n: int = 1000, *, wait_ms: int = 0
    ) -> tuple[Iterator, pa.Table]:
        """The iterator's next records (at most ``n``), as ``Database.next_arrow``; with
        ``wait_ms`` an empty answer waits that long for an append first.

        Returns:
            ``(next iterator, table)``: an empty table means nothing more yet, unless the
            iterator has ``end_of_stream``.

        Raises:
            ForeignIterator: The iterator is another database's.
            UnknownStream: The database has no such stream (any more).
            GenerationDropped: The iterator's generation was dropped.
        """
        ((moved, table),) = await self.next_many([iterator], n, wait_ms=wait_ms)
        return moved, table

    async def next_many(
        self, iterators: Sequence[Iterator], n: int = 1000, *, wait_ms: int = 0
    ) -> list[tuple[Iterator, pa.Table]]:
        """The next records of many iterators at once: one long poll per node (each shard's
        leader with ``bootstrap=``), answered as soon as any has records.

        ``n`` is the budget of one node's answer, spent in the order given: rotate the
        iterators between calls so that a busy stream does not starve the rest.

        Returns:
            ``(next iterator, table)`` per iterator, in the order given; an iterator whose node
            did not answer first (another one had records) comes back unchanged.
        """
        its = list(iterators)
        if not its:
            raise InvalidArgument("next_many needs at least one iterator")
        if len(its) > MAX_NEXT_ITERATORS:
            raise InvalidArgument(f"next_many takes at most {MAX_NEXT_ITERATORS} iterators")
        for it in its:
            if not isinstance(it, Iterator):
                raise InvalidArgument(f"next_many takes Iterators, not {type(it).__name__}")
            if it.db_id != self._wire_id:
                raise ForeignIterator(f"an iterator is not one of {self.db!r}'s")
        if type(n) is not int or not 1 <= n <= MAX_NEXT_RECORDS:
            raise InvalidArgument(f"n must be an int in 1..{MAX_NEXT_RECORDS}, not {n!r}")
        if type(wait_ms) is not int or wait_ms < 0:
            raise InvalidArgument(f"wait_ms must be an int >= 0, not {wait_ms!r}")
        groups: dict[str | None, list[int]] = {}
        for i, it in enumerate(its):
            url = None if self._leaders is None else await self._leaders.leader_url(self.db, it.shard)
            groups.setdefault(url, []).append(i)
        out: list[tuple[Iterator, pa.Table]] = [(it, _NO_ROWS) for it in its]

        async def ask(indexes: list[int]) -> None:
            body = {
                "iterators": [iterator_text(its[i], self._wire_id) for i in indexes],
                "max_records": n,
                "wait_ms": wait_ms,
            }
            reply = await self._to_shard(
                its[indexes[0]].shard,
                "POST",
                "/next",
                json_body=body,
                timeout_s=self._timeout_s + wait_ms / 1000,
            )
            wired, ends, tables = decode_next_reply(reply.body)
            if len(wired) != len(indexes):
                raise RemoteError("a node answered for other iterators than it was asked")
            for i, text, end, table in zip(indexes, wired, ends, tables, strict=True):
                moved = _iterator(text)
                if moved.end_of_stream != end:
                    raise RemoteError("a node's next reply disagrees with its own iterator on end_of_stream")
                out[i] = (moved, table)

        tasks = [asyncio.ensure_future(ask(indexes)) for indexes in groups.values()]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # its error, if it failed
        finally:
            for task in tasks:
                task.cancel()  # a read changes nothing on the node: the unanswered stay as they were
            await asyncio.gather(*tasks, return_exceptions=True)
        return out

    async def next(
        self, iterator: Iterator, n: int = 1000, *, wait_ms: int = 0
    ) -> tuple[Iterator, list[Record]]:
        """Like :meth:`next_arrow`, as :class:`~seglog.Record` objects (``shard`` and ``offset`` set)."""
        it, table = await self.next_arrow(iterator, n, wait_ms=wait_ms)
        return it, records_from_table(table, iterator.shard)


def _json(reply: Any) -> Any:
    try:
        return reply.json()
    except ValueError as exc:
        raise RemoteError(f"a node's reply is not JSON: {reply.body[:120]!r}") from exc


def _iterator(text: Any) -> Iterator:
    try:
        return iterator_from_text(text)
    except InvalidIterator as exc:
        raise RemoteError(f"a node sent a malformed iterator: {exc}") from exc
