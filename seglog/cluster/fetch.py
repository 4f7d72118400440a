"""``GET /v1/dbs/{db}/shards/{shard}/frames``: stored frames byte for byte, long-polled."""

from __future__ import annotations

import asyncio
import contextlib

import pyarrow as pa
from aiohttp import web

from seglog.cluster import protocol
from seglog.cluster.context import NODE
from seglog.cluster.params import query_int, shard_param
from seglog.db import Database
from seglog.errors import OffsetOutOfRange

__all__ = ["DEFAULT_FETCH_BYTES", "fetch"]

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
        # Tiered: no stored frames here; the rows, as Arrow (rare: a consumer far behind).
        table = await db.read_arrow(shard, offset, max(1, max_bytes // 128), upper=hw)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        body = sink.getvalue().to_pybytes()
        node.metrics.fetch_done(db.name, len(body), lag)
        return web.Response(body=body, content_type=protocol.ARROW_STREAM, headers=headers)
    frames = await db.read_frames(shard, offset, max_bytes)
    node.metrics.fetch_done(db.name, len(frames), lag)
    return web.Response(body=frames, content_type=protocol.FRAMES, headers=headers)
