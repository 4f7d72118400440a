"""MQTT streams over HTTP: list the streams of a topic filter, make iterators, read them (long poll).

The embedded API (``Database.get_streams`` / ``make_iterator`` / ``next_arrow``) on the wire:

* ``GET .../streams?filter=F[&start_time_us=T][&shards=a,b]`` ->
  ``{"streams": [{"shard", "id", "structure", "special", "generation", "pattern"}, ...]}``;
* ``POST .../iterators`` ``{"stream": {...one of those}, "filter", "start_time_us"?}`` ->
  ``{"iterator": base64}`` (``{"streams": [...]}`` -> ``{"iterators": [...]}``: many at once);
* ``POST .../next`` ``{"iterator", "max_records"?, "wait_ms"?}`` -> the records as an Arrow
  IPC stream (``read_arrow``'s columns), the moved iterator in ``Seglog-Iterator`` and
  ``Seglog-End-Of-Stream: 1`` once its generation is closed and read to the end. An empty
  stream means nothing more yet; with ``wait_ms`` the reply waits for an append to the
  shard (a long poll, woken, never a sleep loop) before answering empty;
* ``POST .../next`` ``{"iterators": [base64, ...], "max_records"?, "wait_ms"?}``: many
  iterators in one long poll (a reader of a filter with many streams), answered as soon as
  any has records (or reached ``end_of_stream``); ``max_records`` is the budget of them all,
  spent in the order given (clients rotate it). The reply (``application/vnd.seglog.next-reply``)
  is ``uint32 big-endian n``, ``n`` bytes of JSON ``{"iterators": [...], "end_of_stream":
  [...], "counts": [...]}`` (each moved iterator and how many rows are its), then one Arrow
  IPC stream of every iterator's rows, in iterator order;
* ``GET .../generations`` -> ``{"generations": [slab, ...]}`` (``Database.list_slabs``);
  ``POST .../generations`` adds one (201, the new slab); ``DELETE .../generations/{n}`` drops
  a closed one (``{"generation", "freed_bytes"}``). Generations are not replicated: a
  replicated database refuses both changes (``InvalidArgument``).

Iterators and streams are the embedded ones with the database id replaced on the wire by
:func:`~seglog.cluster.protocol.wire_db_id` of the database's name, the same on every replica:
an iterator made on one node goes on on another after a failover (the stream's structure
check still guards the stream id), and one of another database is ``ForeignIterator``.
Reads stop below the shard's high watermark, so a consumer never sees a record that a
failover could take back. On a replicated database every replica answers, below its own
high watermark (a follower's trails its leader's by a fetch round); a reader given the
cluster (``StreamReader(bootstrap=...)``) asks each shard's leader.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import replace
from typing import Any, Final

import pyarrow as pa
from aiohttp import web

from seglog.cluster import protocol
from seglog.cluster.context import NODE
from seglog.cluster.params import json_body, query_int
from seglog.cluster.stream_wire import (
    MAX_NEXT_ITERATORS,
    MAX_NEXT_RECORDS,
    NEXT_REPLY,
    encode_next_reply,
    iterator_from_text,
    iterator_text,
    stream_from_json,
    stream_json,
)
from seglog.db import Database
from seglog.errors import ForeignIterator, InvalidArgument, InvalidIterator, InvalidRequest
from seglog.iterators import Iterator, Slab, Stream
from seglog.record import READ_SCHEMA

__all__ = ["DEFAULT_NEXT_RECORDS", "add_routes"]

DEFAULT_NEXT_RECORDS: Final = 1000
# The rows of an iterator not read this round (tables are immutable: one serves them all).
_NO_ROWS: Final = READ_SCHEMA.empty_table()


def add_routes(app: web.Application, db_path: str) -> None:
    """Serve the stream endpoints under ``db_path`` (``/v1/dbs/{db}``)."""
    app.router.add_get(db_path + "/streams", get_streams)
    app.router.add_post(db_path + "/iterators", make_iterator)
    app.router.add_post(db_path + "/next", next_records)
    app.router.add_get(db_path + "/generations", list_generations)
    app.router.add_post(db_path + "/generations", add_generation)
    app.router.add_delete(db_path + "/generations/{generation}", drop_generation)


def _stream(obj: Any, db: Database) -> Stream:
    try:
        return stream_from_json(obj, db.id)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None


def iterator_to_wire(it: Iterator, db: Database) -> str:
    """The iterator with the database's wire id, base64."""
    return iterator_text(it, protocol.wire_db_id(db.name))


def iterator_from_wire(text: Any, db: Database) -> Iterator:
    """An iterator of :func:`iterator_to_wire`, bound to this node's copy of ``db``.

    Raises:
        InvalidIterator: Not base64 of an iterator.
        ForeignIterator: Another database's iterator.
    """
    it = iterator_from_text(text)
    if it.db_id != protocol.wire_db_id(db.name):
        raise ForeignIterator(f"this iterator belongs to another database, not {db.name!r}")
    return replace(it, db_id=db.id)


async def get_streams(request: web.Request) -> web.Response:
    """``GET .../streams``: the streams that may hold topics matching ``filter``."""
    node = request.app[NODE]
    db = await node.database(request.match_info["db"])
    topic_filter = request.query.get("filter")
    if topic_filter is None:
        raise InvalidRequest("streams needs ?filter=<MQTT topic filter>")
    start = query_int(request, "start_time_us", 0, minimum=-(1 << 63))
    assert start is not None
    shards = _shards_param(request, db.shards)
    found = [s for s in db.get_streams(topic_filter, start) if s.shard in shards]
    return web.json_response({"streams": [stream_json(s) for s in found]})


def _shards_param(request: web.Request, count: int) -> list[int]:
    raw = request.query.get("shards")
    if raw is None:
        return list(range(count))
    try:
        shards = [int(s) for s in raw.split(",")]
    except ValueError:
        raise InvalidRequest(f"shards must be comma-separated ints, not {raw!r}") from None
    bad = [s for s in shards if not 0 <= s < count]
    if bad:
        raise InvalidRequest(f"shard must be in 0..{count - 1}, not {bad[0]}")
    return shards


async def make_iterator(request: web.Request) -> web.Response:
    """``POST .../iterators``: an iterator at the start of a stream, for a filter."""
    node = request.app[NODE]
    db = await node.database(request.match_info["db"])
    body = await json_body(request)
    topic_filter = body.get("filter")
    if not isinstance(topic_filter, str):
        raise InvalidRequest("an iterator needs the topic filter (a string) under 'filter'")
    start = body.get("start_time_us", 0)
    if type(start) is not int:
        raise InvalidRequest("start_time_us is an int of µs")
    if "streams" in body:  # many at once: {"streams": [...]} -> {"iterators": [...]}, in order
        raw = body["streams"]
        if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_NEXT_ITERATORS:
            raise InvalidRequest(f"streams is a list of 1..{MAX_NEXT_ITERATORS} streams")
        made = [db.make_iterator(stream_from_json(obj, db.id), topic_filter, start) for obj in raw]
        return web.json_response({"iterators": [iterator_to_wire(it, db) for it in made]})
    it = db.make_iterator(_stream(body.get("stream"), db), topic_filter, start)
    return web.json_response({"iterator": iterator_to_wire(it, db)})


async def next_records(request: web.Request) -> web.Response:
    """``POST .../next``: the iterator's next records below the high watermark (long-polled)."""
    node = request.app[NODE]
    db = await node.database(request.match_info["db"])
    body = await json_body(request)
    n = body.get("max_records", DEFAULT_NEXT_RECORDS)
    wait_ms = body.get("wait_ms", 0)
    if type(n) is not int or not 1 <= n <= MAX_NEXT_RECORDS:
        raise InvalidRequest(f"max_records is an int in 1..{MAX_NEXT_RECORDS}")
    if type(wait_ms) is not int or wait_ms < 0:
        raise InvalidRequest("wait_ms is an int >= 0")
    if "iterators" in body:
        its = _iterators(body["iterators"], db)
        tables = await _read_or_wait(request, db, its, n, wait_ms)
        reply = encode_next_reply(
            [iterator_to_wire(it, db) for it in its], [it.end_of_stream for it in its], tables
        )
        return web.Response(body=reply, content_type=NEXT_REPLY)
    its = [iterator_from_wire(body.get("iterator"), db)]
    (table,) = await _read_or_wait(request, db, its, n, wait_ms)
    (it,) = its
    headers = {
        protocol.HEADER_ITERATOR: iterator_to_wire(it, db),
        protocol.HEADER_END_OF_STREAM: "1" if it.end_of_stream else "0",
        protocol.HEADER_HIGH_WATERMARK: str(db.high_watermark(it.shard)),
    }
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return web.Response(
        body=sink.getvalue().to_pybytes(), content_type=protocol.ARROW_STREAM, headers=headers
    )


def _iterators(raw: Any, db: Database) -> list[Iterator]:
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_NEXT_ITERATORS:
        raise InvalidRequest(f"iterators is a list of 1..{MAX_NEXT_ITERATORS} base64 iterators")
    its = []
    for i, text in enumerate(raw):
        try:
            its.append(iterator_from_wire(text, db))
        except InvalidIterator as exc:
            raise type(exc)(f"iterator {i}: {exc}") from None
    return its


async def _read_or_wait(
    request: web.Request, db: Database, its: list[Iterator], n: int, wait_ms: int
) -> list[pa.Table]:
    """Read ``its`` on (moved in place), ``n`` records in all, below each shard's high
    watermark; with nothing to answer, wait up to ``wait_ms`` for one of their shards to move.

    Answers once any iterator has records or newly reached ``end_of_stream``. An iterator a
    read left below its shard's high watermark (its frame budget) reads on at once.
    """
    node = request.app[NODE]
    ended = [it.end_of_stream for it in its]
    shards = {it.shard for it in its}
    deadline = time.monotonic() + min(wait_ms, node.limits.max_wait_ms) / 1000
    while True:
        tables: list[pa.Table] = []
        budget = n
        for i, it in enumerate(its):
            if budget > 0 and not it.end_of_stream:
                its[i], table = await node.stream_reads.next_arrow(
                    db, it, budget, db.high_watermark(it.shard)
                )
                budget -= table.num_rows
            else:
                table = _NO_ROWS
            tables.append(table)
        news = budget < n or any(it.end_of_stream and not e for it, e in zip(its, ended, strict=True))
        remaining = deadline - time.monotonic()
        if news or node.closing or remaining <= 0:
            break
        with node.waiters.watching((db.name, s) for s in shards) as moved:  # armed before the re-check
            if all(it.end_of_stream or it.position >= db.high_watermark(it.shard) for it in its):
                node.metrics.stream_waiting.inc()
                try:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(moved.wait(), remaining)
                finally:
                    node.metrics.stream_waiting.dec()
    node.metrics.stream_read_done(db.name, n - budget)
    return tables


def slab_json(slab: Slab) -> dict[str, Any]:
    """One generation as the wire carries it."""
    return {
        "generation": slab.generation,
        "created_us": slab.created_us,
        "until_us": slab.until_us,
        "since": list(slab.since),
        "until": None if slab.until is None else list(slab.until),
        "dropped": slab.dropped,
        "current": slab.current,
    }


async def list_generations(request: web.Request) -> web.Response:
    """``GET .../generations``: every generation, dropped ones too, oldest first."""
    db = await request.app[NODE].database(request.match_info["db"])
    return web.json_response({"generations": [slab_json(s) for s in db.list_slabs()]})


def _refuse_replicated(request: web.Request, db: Database, what: str) -> None:
    cluster = request.app[NODE].cluster
    if cluster is not None and cluster.replicated(db.name):
        raise InvalidArgument(
            f"cannot {what} of {db.name!r}: generations are not replicated yet, and its replicas "
            "would stamp other stream ids"
        )


async def add_generation(request: web.Request) -> web.Response:
    """``POST .../generations``: close the current generation and start the next (201)."""
    db = await request.app[NODE].database(request.match_info["db"])
    if await json_body(request):
        raise InvalidRequest("adding a generation takes no body")
    _refuse_replicated(request, db, "add a generation")
    return web.json_response(slab_json(await db.add_generation()), status=201)


async def drop_generation(request: web.Request) -> web.Response:
    """``DELETE .../generations/{generation}``: drop a closed generation and what only it holds."""
    db = await request.app[NODE].database(request.match_info["db"])
    raw = request.match_info["generation"]
    if not raw.isdigit():
        raise InvalidRequest(f"a generation is a positive int, not {raw!r}")
    _refuse_replicated(request, db, "drop a generation")
    freed = await db.drop_slab(int(raw))
    return web.json_response({"generation": int(raw), "freed_bytes": freed})
