"""``POST /v1/dbs/{db}/records``: a batch per request, Arrow IPC stream or JSON lines."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import time
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json
from aiohttp import web

from seglog.cluster import protocol
from seglog.cluster.context import NODE
from seglog.cluster.node import ClusterNode
from seglog.cluster.params import query_int
from seglog.db import Database
from seglog.errors import (
    AppendFailed,
    InvalidArgument,
    InvalidRecord,
    InvalidRequest,
    Overloaded,
    UnsupportedContentType,
)
from seglog.isr import Acks
from seglog.record import MAX_PRODUCER_EPOCH, MAX_SEQUENCE, Record, table_to_batch
from seglog.segment.producer_state import ProducerStamp

__all__ = [
    "acks_param",
    "ndjson_table",
    "parse_ndjson",
    "produce",
    "producer_param",
    "reply_parts",
    "reply_runs",
]


def _bytes(value: Any, what: str, index: int) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, dict) and set(value) == {"base64"} and isinstance(value["base64"], str):
        try:
            return base64.b64decode(value["base64"], validate=True)
        except binascii.Error:
            raise InvalidRecord(f"{what} is not valid base64", index=index) from None
    raise InvalidRecord(f'{what} must be a string or {{"base64": "..."}}', index=index)


def parse_ndjson(body: bytes) -> list[Record]:
    """Records from JSON lines ``{"topic", "value", "key"?, "ts"?, "headers"?}``.

    Text values are UTF-8 strings; other bytes ``{"base64": "..."}`` (as ``seglog consume``
    prints them). Blank lines are skipped.

    Raises:
        InvalidRecord: A line is not such an object (its index is in the error).
    """
    records: list[Record] = []
    for index, line in enumerate(body.splitlines()):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InvalidRecord(f"not valid JSON: {exc}", index=index) from None
        if not isinstance(obj, dict):
            raise InvalidRecord("a line must be a JSON object", index=index)
        unknown = set(obj) - {"topic", "value", "key", "ts", "headers"}
        if unknown:
            raise InvalidRecord(f"unknown fields {sorted(unknown)}", index=index)
        topic = obj.get("topic")
        if not isinstance(topic, str):
            raise InvalidRecord("topic must be a string", index=index)
        if "value" not in obj:
            raise InvalidRecord("value is missing", index=index)
        key = obj.get("key")
        ts = obj.get("ts")
        if ts is not None and type(ts) is not int:
            raise InvalidRecord("ts must be an integer (µs since 1970)", index=index)
        headers = obj.get("headers")
        if headers is not None:
            if not isinstance(headers, dict):
                raise InvalidRecord("headers must be an object", index=index)
            headers = {str(k): _bytes(v, f"header {k!r}", index) for k, v in headers.items()}
        records.append(
            Record(
                topic,
                _bytes(obj["value"], "value", index),
                key=None if key is None else _bytes(key, "key", index),
                ts=ts,
                headers=headers,
            )
        )
    return records


def acks_param(request: web.Request) -> Acks:
    """The ``acks`` query parameter: ``1``, ``quorum`` or ``all`` (the default; ``-1`` too).

    On a database that is not replicated all three wait for the same thing, the node's local
    write made durable under its fsync policy; on a replicated one ``1`` is the leader's
    durable write, ``quorum`` a majority of the replicas, ``all`` every in-sync replica.

    Raises:
        InvalidRequest: Anything else (checked before the body is read).
    """
    try:
        return Acks.parse(request.query.get("acks", Acks.ALL.value))
    except InvalidArgument as exc:
        raise InvalidRequest(f"query parameter {exc}") from None


_NDJSON_FAST_SCHEMA: Final = pa.schema(
    [("topic", pa.string()), ("value", pa.string()), ("key", pa.string()), ("ts", pa.int64())]
)
_NDJSON_FAST_PARSE: Final = pa_json.ParseOptions(
    explicit_schema=_NDJSON_FAST_SCHEMA, unexpected_field_behavior="error"
)
_NDJSON_FAST_READ: Final = pa_json.ReadOptions(use_threads=False, block_size=1 << 26)


def ndjson_table(body: bytes) -> pa.Table | None:
    """The common JSON lines (text ``topic``/``value``, optional text ``key``, integer ``ts``)
    parsed in one vectorised pass, as ``append_arrow`` columns; ``None`` for anything else.

    A pure fast path of :func:`parse_ndjson`: it accepts only bodies that function would turn
    into the same records (every line one object with exactly those fields and types, no
    null topic or value); ``None`` sends the body there (headers, base64 values, and every
    error with its line index).
    """
    try:
        table = pa_json.read_json(
            pa.BufferReader(body), read_options=_NDJSON_FAST_READ, parse_options=_NDJSON_FAST_PARSE
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    n = table.num_rows
    if not n or table.column("topic").null_count or table.column("value").null_count:
        return None
    # pyarrow also takes several objects on one line (json.loads does not): one row per line.
    if sum(1 for line in body.splitlines() if line.strip()) != n:
        return None
    return pa.table(
        {
            "ts": table.column("ts"),
            "topic": table.column("topic"),
            "key": table.column("key").cast(pa.binary()),
            "value": table.column("value").cast(pa.binary()),
        }
    )


def _parse_arrow(body: bytes) -> pa.Table:
    try:
        reader = pa.ipc.open_stream(body)
        return reader.read_all()
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as exc:
        raise InvalidRequest(f"the body is not a complete Arrow IPC stream: {exc}") from None


def _shards_param(request: web.Request, shards: int) -> list[int] | None:
    """``?shards=a,b,c``: the shard of each record batch of the Arrow stream, in order."""
    raw = request.query.get("shards")
    if raw is None:
        return None
    if "shard" in request.query:
        raise InvalidRequest("pass ?shard= or ?shards=, not both")
    try:
        out = [int(x, 10) for x in raw.split(",")]
    except ValueError:
        raise InvalidRequest(
            f"query parameter shards must be comma-separated shard numbers, not {raw[:40]!r}"
        ) from None
    bad = next((x for x in out if not 0 <= x < shards), None)
    if bad is not None:
        raise InvalidArgument(f"shard must be an int in 0..{shards - 1}, not {bad}")
    return out


def _parse_arrow_batches(
    body: bytes, shards: list[int] | int
) -> tuple[pa.Table, np.ndarray[Any, Any], list[int]]:
    """The stream's rows, each row's shard (record batch ``i`` goes to ``shards[i]``, or all
    to one shard) and each record batch's row count."""
    try:
        reader = pa.ipc.open_stream(body)
        batches = list(reader)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as exc:
        raise InvalidRequest(f"the body is not a complete Arrow IPC stream: {exc}") from None
    if isinstance(shards, int):
        shards = [shards] * len(batches)
    if len(batches) != len(shards):
        raise InvalidRequest(f"?shards= names {len(shards)} shards for {len(batches)} record batches")
    counts = [b.num_rows for b in batches]
    rows = np.repeat(np.asarray(shards, np.int32), counts)
    return pa.Table.from_batches(batches, reader.schema), rows, counts


def producer_param(request: web.Request) -> tuple[int, int, list[int]] | None:
    """``?producer_id=P&producer_epoch=E&seqs=a,b,...`` of an idempotent produce (``None``
    without ``producer_id``): the sequence number of each record batch's first record.

    Raises:
        InvalidRequest: Malformed or partial parameters.
    """
    pid = query_int(request, "producer_id", None, maximum=2**63 - 1)
    if pid is None:
        if "seqs" in request.query or "producer_epoch" in request.query:
            raise InvalidRequest("seqs and producer_epoch go with producer_id")
        return None
    epoch = query_int(request, "producer_epoch", 0, maximum=MAX_PRODUCER_EPOCH)
    raw = request.query.get("seqs")
    if raw is None:
        raise InvalidRequest("an idempotent produce (producer_id) needs seqs")
    try:
        seqs = [int(x, 10) for x in raw.split(",")]
    except ValueError:
        raise InvalidRequest(
            f"query parameter seqs must be comma-separated integers, not {raw[:40]!r}"
        ) from None
    if any(not 0 <= q <= MAX_SEQUENCE for q in seqs):
        raise InvalidRequest(f"query parameter seqs must hold integers in 0..{MAX_SEQUENCE}")
    assert epoch is not None
    return pid, epoch, seqs


def _stamp(producer: tuple[int, int, list[int]], batch_shards: list[int], counts: list[int]) -> ProducerStamp:
    """Each shard's first sequence; a shard's later batches must continue its numbering."""
    pid, epoch, seqs = producer
    if len(seqs) != len(counts):
        raise InvalidRequest(f"seqs has {len(seqs)} numbers for {len(counts)} record batches")
    first: dict[int, int] = {}
    following: dict[int, int] = {}
    for shard, seq, n in zip(batch_shards, seqs, counts, strict=True):
        if shard in following and following[shard] != seq:
            raise InvalidRequest(
                f"shard {shard}: a batch at sequence {seq} does not follow {following[shard] - 1}"
            )
        first.setdefault(shard, seq)
        following[shard] = seq + n
    return ProducerStamp(pid, epoch, {s: q for s, q in first.items() if following[s] > q})


def reply_runs(shards: np.ndarray[Any, Any], offsets: np.ndarray[Any, Any]) -> list[dict[str, int]]:
    """Per shard, in row order, the runs of consecutive offsets of its rows (an idempotent
    produce: rows stored earlier keep their offsets, ``-1`` when too old to place)."""
    if not len(shards):
        return []
    # Vectorised (it was a Python object per row, ``tolist()``, and a pass per shard): rows
    # grouped by shard, shards in order of first appearance, each shard's rows in row order.
    uniq, first = np.unique(shards, return_index=True)
    if len(uniq) == 1:
        by_shard, offs = shards, offsets
    else:
        rank = np.empty(len(uniq), np.int64)
        rank[np.argsort(first)] = np.arange(len(uniq))
        order = np.argsort(rank[np.searchsorted(uniq, shards)], kind="stable")
        by_shard, offs = shards[order], offsets[order]
    # A run ends at a new shard, at a gap in the offsets, or before a row too old to place.
    breaks = (
        np.flatnonzero((by_shard[1:] != by_shard[:-1]) | (offs[1:] != offs[:-1] + 1) | (offs[1:] < 0)) + 1
    )
    starts = np.r_[0, breaks]
    counts = np.diff(np.r_[starts, len(offs)])
    return [
        {"shard": shard, "base_offset": base, "count": count}
        for shard, base, count in zip(
            by_shard[starts].tolist(), offs[starts].tolist(), counts.tolist(), strict=True
        )
    ]


def _ends(shards: np.ndarray[Any, Any], offsets: np.ndarray[Any, Any], db: Database) -> dict[int, int]:
    """Per shard, the end offset replication must reach before the reply (the log end when
    some rows are duplicates too old to place)."""
    out = {}
    for shard in dict.fromkeys(shards.tolist()):
        offs = offsets[shards == shard]
        out[shard] = db.end_offset(shard) if bool((offs < 0).any()) else int(offs.max()) + 1
    return out


def reply_parts(shards: np.ndarray[Any, Any], offsets: np.ndarray[Any, Any]) -> list[dict[str, int]]:
    """Per shard, the base offset and count of its rows (one shard's rows are contiguous)."""
    if not len(shards):
        return []
    # One sort instead of a pass over every row per shard (a thousand shards, a thousand passes).
    order = np.argsort(shards, kind="stable")
    by_shard = shards[order]
    starts = np.flatnonzero(np.r_[True, by_shard[1:] != by_shard[:-1]])
    bases = np.minimum.reduceat(offsets[order], starts)
    counts = np.diff(np.r_[starts, len(by_shard)])
    return [
        {"shard": shard, "base_offset": base, "count": count}
        for shard, base, count in zip(by_shard[starts].tolist(), bases.tolist(), counts.tolist(), strict=True)
    ]


async def _produce_replicated(
    request: web.Request, cluster: ClusterNode, db: Database, shard: int | None, acks: Acks
) -> web.Response:
    """A produce to a replicated database: one shard, led here, acknowledged per ``acks``."""
    if shard is None:
        raise InvalidRequest("a replicated database takes one shard per produce request (?shard=N)")
    lead = cluster.leader_for_append(db.name, shard, acks)  # before reading or writing anything
    producer = producer_param(request)
    body = await request.read()
    started = time.perf_counter()
    node = request.app[NODE]
    if producer is not None:
        table, rows, counts = _parse_arrow_batches(body, shard)
        stamp = _stamp(producer, [shard] * len(counts), counts)
        result = await db.append_arrow(table, shard=shard, leader_epoch=lead.leader_epoch, producer=stamp)
        offsets = result.column("offset").to_numpy()
        if len(offsets):
            await cluster.appended(db, shard, lead, _ends(rows, offsets, db)[shard], acks)
        node.metrics.append_done(db.name, len(offsets), len(body), time.perf_counter() - started)
        return web.json_response({"count": len(offsets), "parts": reply_runs(rows, offsets)})
    if request.content_type == protocol.ARROW_STREAM:
        result = await db.append_arrow(_parse_arrow(body), shard=shard, leader_epoch=lead.leader_epoch)
        offsets = result.column("offset").to_numpy()
    else:
        meta = await db.append(parse_ndjson(body), shard=shard, leader_epoch=lead.leader_epoch)
        offsets = meta.offsets
    count = len(offsets)
    base = int(offsets[0]) if count else db.end_offset(shard)
    await cluster.appended(db, shard, lead, base + count, acks)
    node.metrics.append_done(db.name, count, len(body), time.perf_counter() - started)
    parts = [{"shard": shard, "base_offset": base, "count": count}] if count else []
    return web.json_response({"count": count, "parts": parts})


async def _produce_replicated_many(
    request: web.Request, cluster: ClusterNode, db: Database, batch_shards: list[int], acks: Acks
) -> web.Response:
    """A produce of many shards to a replicated database, every one of them led here.

    Leadership (and ``acks="all"``'s ISR size) is checked for every shard before the body is
    read, and the whole body validated before any shard is written, so a refused request
    writes nothing. Frames are stamped with each shard's own leader epoch and every shard is
    acknowledged per ``acks``; the reply waits for all of them. If one fails after others were written, the
    request fails and a retry may store those others twice (at least once, as any ambiguous
    failure).
    """
    if request.content_type != protocol.ARROW_STREAM:
        raise InvalidRequest(f"?shards= takes an {protocol.ARROW_STREAM} body")
    leads = {s: cluster.leader_for_append(db.name, s, acks) for s in dict.fromkeys(batch_shards)}
    producer = producer_param(request)
    body = await request.read()
    started = time.perf_counter()
    table, rows, counts = _parse_arrow_batches(body, batch_shards)
    stamp = None if producer is None else _stamp(producer, batch_shards, counts)
    # Frames carry their shard's leader epoch: one append per epoch among the shards (usually
    # one). With several, the whole body is validated first so a bad row writes nothing.
    by_epoch: dict[int, list[int]] = {}
    for shard, lead in leads.items():
        by_epoch.setdefault(lead.leader_epoch, []).append(shard)
    if len(by_epoch) > 1:
        cfg = db.config
        table_to_batch(
            table, max_record_bytes=cfg.max_record_bytes, min_ts_us=cfg.min_ts_us, max_ts_us=cfg.max_ts_us
        )

    async def append(epoch: int, shards: list[int]) -> list[dict[str, int]]:
        if len(by_epoch) == 1:
            part, part_rows = table, rows
        else:
            keep = np.flatnonzero(np.isin(rows, shards))
            part, part_rows = table.take(pa.array(keep)), rows[keep]
        mine = None if stamp is None else stamp._replace(sequences={s: stamp.sequences[s] for s in shards})
        result = await db.append_arrow(part, shards=part_rows, leader_epoch=epoch, producer=mine)
        shard_col, offset_col = result.column("shard").to_numpy(), result.column("offset").to_numpy()
        if mine is not None:
            ends = _ends(shard_col, offset_col, db)
            await asyncio.gather(*(cluster.appended(db, s, leads[s], end, acks) for s, end in ends.items()))
            return reply_runs(shard_col, offset_col)
        parts = reply_parts(shard_col, offset_col)
        await asyncio.gather(
            *(
                cluster.appended(db, p["shard"], leads[p["shard"]], p["base_offset"] + p["count"], acks)
                for p in parts
            )
        )
        return parts

    outcomes = await asyncio.gather(*(append(e, s) for e, s in by_epoch.items()), return_exceptions=True)
    failed = next((o for o in outcomes if isinstance(o, BaseException)), None)
    if failed is not None:
        raise failed
    parts = [p for o in outcomes if not isinstance(o, BaseException) for p in o]
    count = sum(p["count"] for p in parts)
    request.app[NODE].metrics.append_done(db.name, count, len(body), time.perf_counter() - started)
    return web.json_response({"count": count, "parts": parts})


async def produce(request: web.Request) -> web.Response:
    """Append the body's records; all or nothing per request when validation fails."""
    node = request.app[NODE]
    db = await node.database(request.match_info["db"])
    shard = query_int(request, "shard", None, maximum=db.shards - 1)
    batch_shards = _shards_param(request, db.shards)
    acks = acks_param(request)
    content_type = request.content_type
    if content_type not in (protocol.ARROW_STREAM, protocol.NDJSON):
        raise UnsupportedContentType(
            f"produce takes {protocol.ARROW_STREAM} or {protocol.NDJSON}, not {content_type}"
        )
    if node.inflight_appends >= node.limits.max_inflight_appends:
        raise Overloaded(
            f"{node.inflight_appends} appends in flight (max_inflight_appends); retry later", retry_after_s=1
        )
    node.inflight_appends += 1
    node.metrics.inflight_appends.inc()
    node.idle.clear()
    try:
        if node.cluster is not None and node.cluster.replicated(db.name):
            if batch_shards is not None:
                return await _produce_replicated_many(request, node.cluster, db, batch_shards, acks)
            return await _produce_replicated(request, node.cluster, db, shard, acks)
        producer = producer_param(request)
        if producer is not None and content_type != protocol.ARROW_STREAM:
            raise InvalidRequest(f"an idempotent produce (producer_id) takes an {protocol.ARROW_STREAM} body")
        body = await request.read()
        started = time.perf_counter()
        idempotent = False
        try:
            if producer is not None:
                table, rows, counts = _parse_arrow_batches(
                    body, batch_shards if batch_shards is not None else 0
                )
                if batch_shards is None:
                    if shard is None and db.shards > 1:
                        raise InvalidRequest("an idempotent produce names its shards (?shard= or ?shards=)")
                    rows[:] = shard or 0
                stamp = _stamp(producer, batch_shards or [shard or 0] * len(counts), counts)
                result = await db.append_arrow(table, shards=rows, producer=stamp)
                shard_col = result.column("shard").to_numpy()
                offset_col = result.column("offset").to_numpy()
                idempotent = True
            elif batch_shards is not None:
                if content_type != protocol.ARROW_STREAM:
                    raise InvalidRequest(f"?shards= takes an {protocol.ARROW_STREAM} body")
                table, rows, _ = _parse_arrow_batches(body, batch_shards)
                result = await db.append_arrow(table, shards=rows)
                shard_col = result.column("shard").to_numpy()
                offset_col = result.column("offset").to_numpy()
            elif content_type == protocol.ARROW_STREAM:
                table = _parse_arrow(body)
                result = await db.append_arrow(table, shard=shard)
                shard_col = result.column("shard").to_numpy()
                offset_col = result.column("offset").to_numpy()
            else:
                fast = ndjson_table(body)
                if fast is not None:
                    result = await db.append_arrow(fast, shard=shard)
                    shard_col = result.column("shard").to_numpy()
                    offset_col = result.column("offset").to_numpy()
                else:
                    meta = await db.append(parse_ndjson(body), shard=shard)
                    shard_col, offset_col = meta.shards, meta.offsets
        except AppendFailed as exc:
            # The parts written (other shards) are durable: make them visible like any other.
            node.publish(db, sorted(exc.written))
            raise
        parts = reply_runs(shard_col, offset_col) if idempotent else reply_parts(shard_col, offset_col)
        node.publish(db, list(dict.fromkeys(p["shard"] for p in parts)))
        node.metrics.append_done(db.name, len(shard_col), len(body), time.perf_counter() - started)
    finally:
        node.inflight_appends -= 1
        node.metrics.inflight_appends.dec()
        if not node.inflight_appends:
            node.idle.set()
    return web.json_response({"count": len(shard_col), "parts": parts})
