"""Fetch: stored frames byte for byte, long-polled, of one shard or of many in one request.

``GET /v1/dbs/{db}/shards/{shard}/frames`` answers for one shard; ``POST /v1/dbs/{db}/fetch``
for every shard a consumer reads (:mod:`seglog.cluster.fetch_wire`), so that one append
that reaches all of them wakes one poll, not one per shard.
"""

from __future__ import annotations

import asyncio
import contextlib

import pyarrow as pa
from aiohttp import web

from seglog.cluster import fetch_wire, protocol
from seglog.cluster.context import NODE, NodeContext
from seglog.cluster.fetch_wire import FetchPart
from seglog.cluster.params import query_int, shard_param
from seglog.db import Database
from seglog.errors import CorruptFrame, InvalidArgument, OffsetOutOfRange, SeglogError, UnsupportedContentType

__all__ = ["DEFAULT_FETCH_BYTES", "fetch", "fetch_many"]

DEFAULT_FETCH_BYTES = 1 << 20


def _offsets_headers(db: Database, shard: int) -> dict[str, str]:
    return {
        protocol.HEADER_LOG_START: str(db.start_offset(shard)),
        protocol.HEADER_LOG_END: str(db.end_offset(shard)),
        protocol.HEADER_HIGH_WATERMARK: str(db.high_watermark(shard)),
    }


async def fetch(request: web.Request) -> web.Response:
    """Frames of one shard from ``offset``, once the high watermark is past it or ``wait_ms`` ran out.

    Consumers see only records below the high watermark: the frames may hold more (a frame
    is never cut), and the client drops rows at or past the ``Seglog-High-Watermark`` it is
    sent. Below the local log (tiered data) the reply is an Arrow IPC stream of the rows
    instead, with an ``offset`` column.
    """
    node = request.app[NODE]
    db = await node.database(request.match_info["db"])
    shard = shard_param(request, db.shards)
    offset = query_int(request, "offset", 0)
    assert offset is not None
    max_bytes = query_int(request, "max_bytes", DEFAULT_FETCH_BYTES, minimum=1)
    assert max_bytes is not None
    max_bytes = min(max_bytes, node.limits.max_fetch_bytes)
    wait_ms = query_int(request, "wait_ms", 0)
    assert wait_ms is not None
    wait_ms = min(wait_ms, node.limits.max_wait_ms)

    start, end = db.start_offset(shard), db.end_offset(shard)
    if not start <= offset <= end:
        raise OffsetOutOfRange(offset, start, end, shard=shard)
    lag = end - offset
    if wait_ms and offset >= db.high_watermark(shard):
        event = node.waiters.event(db.name, shard)  # before the re-check: no lost wake-up
        if offset >= db.high_watermark(shard) and not node.closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), wait_ms / 1000)
    headers = _offsets_headers(db, shard)
    hw = int(headers[protocol.HEADER_HIGH_WATERMARK])
    if offset >= hw:
        node.metrics.fetch_done(db.name, 0, lag)
        return web.Response(body=b"", content_type=protocol.FRAMES, headers=headers)
    if offset < db.local_start_offset(shard):
        body = await _tiered_rows(db, shard, offset, max_bytes, hw)
        node.metrics.fetch_done(db.name, len(body), lag)
        return web.Response(body=body, content_type=protocol.ARROW_STREAM, headers=headers)
    frames = await _read_frames(node, db, shard, offset, max_bytes)
    node.metrics.fetch_done(db.name, len(frames), lag)
    return web.Response(body=frames, content_type=protocol.FRAMES, headers=headers)


async def _read_frames(node: NodeContext, db: Database, shard: int, offset: int, max_bytes: int) -> bytes:
    """The stored frames from ``offset`` (CRC-checked); a damaged one starts its repair and raises.

    Raises:
        CorruptFrame: The frame holding ``offset`` is damaged on this node (never served).
    """
    try:
        return await db.read_frames(shard, offset, max_bytes)
    except CorruptFrame:
        if node.cluster is not None and node.cluster.replicated(db.name):
            node.cluster.frame_damaged(db.name, shard, offset)
        raise


async def _tiered_rows(db: Database, shard: int, offset: int, max_bytes: int, hw: int) -> bytes:
    """Rows from ``offset`` below the node's local log, as an Arrow IPC stream (no stored frames
    here; rare: a consumer far behind)."""
    table = await db.read_arrow(shard, offset, max(1, max_bytes // 128), upper=hw)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()  # type: ignore[no-any-return]


def _has_news(db: Database, offsets: dict[int, int], refused: dict[int, SeglogError]) -> bool:
    """Whether a poll of ``offsets`` has something to answer: records or an error."""
    if refused:
        return True
    for shard, offset in offsets.items():
        if offset < db.high_watermark(shard) or not db.start_offset(shard) <= offset <= db.end_offset(shard):
            return True
    return False


async def _read_parts(
    node: NodeContext, db: Database, offsets: dict[int, int], max_bytes: int, refused: dict[int, SeglogError]
) -> list[FetchPart]:
    """The parts of the shards with records (or an error) for ``offsets``, in request order.

    Shards are read in the order asked (the client rotates it) until ``max_bytes`` is spent;
    the first read flushes every tailed shard's buffered rows, so the rest read from memory.
    """
    parts = []
    budget = max_bytes
    total = lag = 0
    for shard, offset in offsets.items():
        if shard in refused:
            parts.append(FetchPart(db.name, shard, error=refused[shard]))
            continue
        start, end, hw = db.start_offset(shard), db.end_offset(shard), db.high_watermark(shard)
        if not start <= offset <= end:
            parts.append(FetchPart(db.name, shard, error=OffsetOutOfRange(offset, start, end, shard=shard)))
            continue
        lag += end - offset
        if offset >= hw or budget <= 0:
            continue
        arrow = offset < db.local_start_offset(shard)
        if arrow:
            body = await _tiered_rows(db, shard, offset, budget, hw)
        else:
            try:
                body = await _read_frames(node, db, shard, offset, budget)
            except CorruptFrame as exc:
                parts.append(FetchPart(db.name, shard, error=exc))
                continue
        budget -= len(body)
        total += len(body)
        parts.append(FetchPart(db.name, shard, body, hw, start, end, arrow=arrow))
    node.metrics.fetch_done(db.name, total, lag)
    return parts


async def fetch_many(request: web.Request) -> web.Response:
    """``POST /v1/dbs/{db}/fetch``: frames of many shards, once any has records or ``wait_ms`` ran out.

    The reply lists only the shards with records below their high watermark (their frames,
    or Arrow rows for tiered data) and those whose offset is out of range (an
    ``OffsetOutOfRange`` part); an empty list when the wait ran out.
    """
    node = request.app[NODE]
    db = await node.database(request.match_info["db"])
    if request.content_type != protocol.JSON:
        raise UnsupportedContentType(f"fetch takes {protocol.JSON}, not {request.content_type}")
    asked = fetch_wire.decode_shards_request(await request.read())
    offsets = asked.offsets
    bad = next((s for s in offsets if s >= db.shards), None)
    if bad is not None:
        raise InvalidArgument(f"shard must be an int in 0..{db.shards - 1}, not {bad}")
    wait_ms = min(asked.wait_ms, node.limits.max_wait_ms)
    max_bytes = min(asked.max_bytes, node.limits.max_fetch_bytes)
    refused: dict[int, SeglogError] = {}
    cluster = node.cluster
    if asked.leader_only and cluster is not None and cluster.replicated(db.name):
        for shard in offsets:
            error = cluster.not_leader(db.name, shard)
            if error is not None:
                refused[shard] = error
    if wait_ms and not node.closing and not _has_news(db, offsets, refused):
        with node.waiters.watching((db.name, s) for s in offsets) as moved:
            if not _has_news(db, offsets, refused):  # re-checked once armed: no lost wake-up
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(moved.wait(), wait_ms / 1000)
    parts = await _read_parts(node, db, offsets, max_bytes, refused)
    return web.Response(body=fetch_wire.encode_reply(parts), content_type=fetch_wire.FETCH_REPLY)
