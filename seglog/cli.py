"""The ``seglog`` command line.

Conventions: errors print one line (``seglog: error: ...``) on stderr and exit 1 (usage
errors exit 2, from argparse); ``--debug`` (before or after the command) shows tracebacks
instead. Ctrl-C exits 130; ``produce`` first appends the lines it has read. A closed stdout
(``seglog consume ... | head``) ends the command quietly with status 0. Read-only commands
(``consume``, ``stats``, ``groups``, ``inspect``) never create a file or directory.

The network commands (``admin``, and ``produce``/``consume`` with ``--url``) live in
:mod:`seglog.cli_net`; their errors name the error class (``seglog: DatabaseNotFound: ...``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import datetime as dt
import heapq
import json
import logging
import os
import random
import re
import shutil
import signal
import ssl
import sys
import time
from collections import Counter, deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any, Final

import pyarrow as pa
import pyarrow.compute as pc
from tqdm import tqdm

import seglog
from seglog.cluster.protocol import DEFAULT_PORT
from seglog.db_config import validate_db_name
from seglog.errors import DatabaseNotFound, InvalidArgument, InvalidRecord, SeglogError, StoreLocked
from seglog.readonly import check_store, db_view, group_lags, list_dbs
from seglog.record import (
    OFFSET_FIELD,
    decode_body,
    parse_header,
    records_from_table,
    records_to_batch,
    verify_frame,
)
from seglog.store import STORE_FILE, read_db_config
from seglog.tiering.targets import open_target
from seglog.topics import (
    filter_literal_prefix,
    filter_to_regex,
    is_wildcard_filter,
    topic_matches,
    validate_topic_filter,
)

__all__ = ["main"]

DEMO_RECORDS = 1_000_000
DEMO_DEVICES = 1000
DEMO_SITES = 10
DEMO_METRICS = ("temp", "humidity", "pressure", "co2")
DEMO_BATCH_RECORDS = 1000
DEMO_PRODUCERS = 4
DEMO_NET_RECORDS = 100_000
# Written into the directories ``seglog demo`` makes: only those may be wiped by a rerun.
DEMO_MARK: Final = ".seglog-demo"
# `seglog serve --tier`: a node tiers on its own, once a minute unless told otherwise.
DEFAULT_SERVE_TIER_INTERVAL_MS: Final = 60_000
READ_CHUNK_BYTES: Final = 1 << 16
_RECORD_PREFIX: Final = re.compile(r"^record \d+: ")


def _progress(args: argparse.Namespace) -> bool:
    """Whether to draw a progress bar: ``--progress``/``--no-progress``, else when stderr is a terminal."""
    flag: bool | None = getattr(args, "progress", None)
    return sys.stderr.isatty() if flag is None else flag


# --- demo ------------------------------------------------------------------------------


def _demo_records(n: int, start_us: int, seed: int = 7) -> list[seglog.Record]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        device = i % DEMO_DEVICES
        site = device % DEMO_SITES
        metric = DEMO_METRICS[(i // DEMO_DEVICES) % len(DEMO_METRICS)]
        out.append(
            seglog.Record(
                topic=f"sensors/site{site:02d}/dev{device:04d}/{metric}",
                value=f"{20 + 10 * rng.random():.3f}".encode(),
                ts=start_us + i * 1000,  # one record per ms across the fleet
                key=f"dev{device:04d}".encode(),
            )
        )
    return out


def _demo_made(directory: Path) -> bool:
    return (directory / DEMO_MARK).is_file()


def _demo_prepare(data: Path, tier_dir: Path, chart: Path, node_dir: Path | None = None) -> None:
    """Check that the demo may use its paths, then clear what an earlier demo left.

    A directory is used only when it is absent, empty, or was made by ``seglog demo`` (it
    holds :data:`DEMO_MARK`); the chart is overwritten only after an earlier demo run.

    Raises:
        InvalidArgument: A path holds something the demo did not make (nothing is touched).
    """
    dirs = (data, tier_dir) if node_dir is None else (data, tier_dir, node_dir)
    for d in dirs:
        if d.exists() and not d.is_dir():
            raise InvalidArgument(f"refusing to use {d}: it exists and is not a directory")
        if d.is_dir() and not _demo_made(d) and any(d.iterdir()):
            raise InvalidArgument(
                f"refusing to use {d}: it is not empty and was not made by `seglog demo` "
                "(give a new or empty directory)"
            )
    if chart.exists() and not _demo_made(data):
        raise InvalidArgument(f"refusing to overwrite {chart}: it was not made by `seglog demo`")
    if not data.parent.is_dir():
        raise InvalidArgument(f"cannot create {data}: {data.parent} does not exist")
    for d in dirs:
        if _demo_made(d):
            shutil.rmtree(d)
        d.mkdir(exist_ok=True)
        (d / DEMO_MARK).write_text("made by `seglog demo`; a rerun of the demo deletes this directory\n")


async def _demo(args: argparse.Namespace) -> int:
    data = Path(args.data).absolute()
    tier_dir = Path(str(data) + "-tier")
    chart = Path(str(data) + "-sites.png")
    # The network step's node serves its own data directory (inside, beside the demo mark).
    node_dir = None if args.no_network else Path(str(data) + "-node")
    _demo_prepare(data, tier_dir, chart, node_dir)
    n = args.records
    start_us = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z
    print(f"generating {n:,} records from {DEMO_DEVICES} devices ...")
    records = _demo_records(n, start_us)
    batches = [records[i : i + DEMO_BATCH_RECORDS] for i in range(0, n, DEMO_BATCH_RECORDS)]
    tier_uri = f"file://{tier_dir}"
    async with seglog.open(data, fsync="always", tier=tier_uri) as store:
        db = await store.create_db(
            "telemetry",
            shards=args.shards,
            segment_bytes=16 << 20,
            lts_thresholds=seglog.topics.DEFAULT_LTS_THRESHOLDS,
        )
        with tqdm(
            total=n, unit="rec", unit_scale=True, desc="ingest (fsync=always)", disable=not _progress(args)
        ) as bar:

            async def produce(k: int) -> None:
                for b in batches[k::DEMO_PRODUCERS]:
                    await db.append(b)
                    bar.update(len(b))

            t0 = time.perf_counter()
            await asyncio.gather(*(produce(k) for k in range(DEMO_PRODUCERS)))
            ingest_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        await db.seal()
        entries = await db.tier_now()
        tier_s = time.perf_counter() - t0
        tier_bytes = sum(e.bytes for e in entries)
    async with seglog.open(data, tier=tier_uri) as store:
        db = await store.open_db("telemetry")
        t0 = time.perf_counter()
        total = 0
        for shard in range(db.shards):
            offset = db.start_offset(shard)
            while True:
                table = await db.read_arrow(shard, offset, max_records=200_000)
                if table.num_rows == 0:
                    break
                total += table.num_rows
                offset += table.num_rows
        read_s = time.perf_counter() - t0
        if total != n:
            raise SeglogError(f"read back {total} records, wrote {n}")
        mid = dt.datetime.fromtimestamp(start_us / 1e6 + n // 2 / 1000, tz=dt.UTC)
        # The first shard holding records (with few records some shards have none).
        probe = next(s for s in range(db.shards) if db.end_offset(s) > db.start_offset(s))
        shard0_mid = await db.offset_for_time(probe, mid)
        if shard0_mid >= db.end_offset(probe):  # every record of the shard is older than mid
            shard0_mid = db.start_offset(probe)
        first = (await db.read(probe, shard0_mid, 1))[0]
        device = b"dev0042"
        by_key = await db.read_key(device)
        expected_key = len([r for r in records if r.key == device])
        stats = db.stats()
        stream_lines = await _demo_streams(db, records, start_us + n * 1000)
    print()
    print(
        f"{'ingested':<22}{n:>14,} records in {ingest_s:6.2f} s  = {n / ingest_s:>12,.0f} records/s (durable)"
    )
    print(
        f"{'read back (arrow)':<22}{total:>14,} records in {read_s:6.2f} s  = {total / read_s:>12,.0f} records/s"
    )
    print(
        f"{'offset_for_time':<22}shard {probe} at {mid:%H:%M:%S}Z -> offset {shard0_mid:,} ({first.topic}, ts {first.ts})"
    )
    print(
        f"{'read_key':<22}{device.decode()} -> {len(by_key):,} records on shard {db.shard_for(device)} "
        f"(expected {expected_key:,})"
    )
    for s in stats:
        print(
            f"  shard {s.shard}: offsets {s.start_offset:,}..{s.end_offset:,}, {s.segments} segment(s), "
            f"{s.bytes / 1e6:.1f} MB"
        )
    if len(by_key) != expected_key:
        raise SeglogError("key lookup mismatch")
    print(
        f"{'tiered':<22}{len(entries)} Parquet objects, {tier_bytes / 1e6:.1f} MB in {tier_s:.2f} s -> {tier_uri}"
    )
    for line in stream_lines:
        print(line)
    if not args.no_spark:
        _demo_spark(tier_uri, chart)
    if node_dir is not None:
        from seglog import cli_net

        net_n = min(n, args.net_records)
        await cli_net.demo_network(node_dir / "data", records[:net_n], args.shards, DEMO_BATCH_RECORDS)
    print(f"\ndata directory: {data}")
    return 0


DEMO_FILTER: Final = "sensors/site03/+/temp"
DEMO_SUBSCRIBERS = 3
DEMO_MAX_UNACKED = 50
DEMO_LIVE_ROUNDS = 5


async def _demo_streams(db: seglog.Database, records: list[seglog.Record], live_us: int) -> list[str]:
    """A wildcard read of one site's temperatures through streams, then subscriptions.

    Every subscriber subscribes to each stream of :data:`DEMO_FILTER` at its head, records
    for the site arrive, and every subscriber gets each of them once, acknowledging as it
    goes (at most :data:`DEMO_MAX_UNACKED` unacknowledged); the subscribers of a stream share
    its reads.

    Returns:
        The lines to print.

    Raises:
        SeglogError: A read or a subscription did not return what was written.
    """
    t0 = time.perf_counter()
    streams = db.get_streams(DEMO_FILTER)
    heads: list[seglog.Iterator] = []
    total = 0
    for stream in streams:
        it = db.make_iterator(stream, DEMO_FILTER)
        while True:
            it, table = await _stream_batch(db, it, db.end_offset(stream.shard))
            if table is None:
                break
            total += table.num_rows
        heads.append(it)
    read_s = time.perf_counter() - t0
    topics = Counter(r.topic for r in records)
    expected = sum(c for t, c in topics.items() if topic_matches(DEMO_FILTER, t))
    if total != expected:
        raise SeglogError(f"wildcard read of {DEMO_FILTER} returned {total} records, expected {expected}")
    site_topics = sorted(t for t in topics if topic_matches(DEMO_FILTER, t))
    lines = [
        f"{'wildcard read':<22}{DEMO_FILTER} -> {total:,} records of {len(records):,} from "
        f"{len(streams)} streams in {read_s:.2f} s"
    ]
    if not site_topics:
        return [*lines, f"{'subscriptions':<22}skipped: no records match {DEMO_FILTER}"]

    t0 = time.perf_counter()
    want = DEMO_LIVE_ROUNDS * len(site_topics)
    got = [0] * DEMO_SUBSCRIBERS
    batches = [0] * DEMO_SUBSCRIBERS
    most_unacked = 0
    finished = [asyncio.Event() for _ in range(DEMO_SUBSCRIBERS)]

    async def receive(k: int, sub: seglog.Subscription) -> None:
        nonlocal most_unacked
        async for batch in sub:
            most_unacked = max(most_unacked, sub.unacked)
            got[k] += len(batch)
            batches[k] += 1
            sub.suback(batch.seqno)
            if got[k] >= want:
                finished[k].set()

    subs = [db.subscribe(it, max_unacked=DEMO_MAX_UNACKED) for _ in range(DEMO_SUBSCRIBERS) for it in heads]
    tasks = [asyncio.create_task(receive(i // len(heads), sub)) for i, sub in enumerate(subs)]
    try:
        for r in range(DEMO_LIVE_ROUNDS):
            ts = live_us + r * len(site_topics)
            await db.append(
                [
                    seglog.Record(topic=t, value=b"21.500", ts=ts + i, key=t.split("/")[2].encode())
                    for i, t in enumerate(site_topics)
                ]
            )
        try:
            await asyncio.wait_for(asyncio.gather(*(f.wait() for f in finished)), timeout=60)
        except TimeoutError:
            raise SeglogError(f"subscribers got {got} of {want} live records within 60 s") from None
    finally:
        for sub in subs:
            await sub.unsubscribe()
        await asyncio.gather(*tasks, return_exceptions=True)
    sub_s = time.perf_counter() - t0
    stats = db.subscription_stats()
    if got != [want] * DEMO_SUBSCRIBERS or most_unacked > DEMO_MAX_UNACKED:
        raise SeglogError(f"subscribers got {got} records (wanted {want} each), {most_unacked} unacked")
    lines.append(
        f"{'subscriptions':<22}{DEMO_SUBSCRIBERS} subscribers x {len(heads)} streams got {want:,} live "
        f"records each in {sum(batches):,} batches (max_unacked={DEMO_MAX_UNACKED}, subacked) in {sub_s:.2f} s"
    )
    lines.append(
        f"{'':<22}{stats.shared_reads + stats.catchup_reads:,} stream reads for "
        f"{stats.records_delivered:,} deliveries: subscribers of a stream share its reads"
    )
    return lines


def _demo_spark(tier_uri: str, chart: Path) -> None:
    """Per site and minute: message count, mean and max of the metric, over the tier."""
    from seglog.spark import build_spark_session, site_minute_stats, write_site_minute_chart

    print("\nstarting Spark (local mode) over the tier ...")
    spark = build_spark_session(app_name="seglog-demo")
    try:
        t0 = time.perf_counter()
        table = site_minute_stats(spark, tier_uri, "telemetry")
        spark_s = time.perf_counter() - t0
    finally:
        spark.stop()
    rows = table.to_pylist()
    print(f"{'site':<8}{'minute (UTC)':<18}{'messages':>10}{'avg':>10}{'max':>10}")
    for r in rows[:12]:
        print(
            f"{r['site']:<8}{r['minute'].strftime('%Y-%m-%d %H:%M'):<18}{r['messages']:>10,}"
            f"{r['avg_value']:>10.3f}{r['max_value']:>10.3f}"
        )
    if len(rows) > 12:
        print(f"... {len(rows) - 12} more rows")
    write_site_minute_chart(table, chart)
    print(f"Spark job: {len(rows)} (site, minute) rows in {spark_s:.1f} s; chart written to {chart}")


# --- record output ---------------------------------------------------------------------


def _bytes_json(value: bytes | None, fmt: str) -> Any:
    """``fmt`` ``auto``: UTF-8 text as a JSON string, anything else as ``{"base64": ...}``;
    ``base64``: always a base64 string. Either way a reader can tell text from bytes."""
    if value is None:
        return None
    if fmt == "base64":
        return base64.b64encode(value).decode("ascii")
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(value).decode("ascii")}


def _format(rec: seglog.Record, fmt: str, value_format: str) -> bytes:
    if fmt == "raw":
        return rec.value + b"\n"
    doc = {
        "shard": rec.shard,
        "offset": rec.offset,
        "ts": rec.ts,
        "topic": rec.topic,
        "key": _bytes_json(rec.key, value_format),
        "value": _bytes_json(rec.value, value_format),
        "headers": None
        if not rec.headers
        else {k: _bytes_json(v, value_format) for k, v in rec.headers.items()},
    }
    return json.dumps(doc, ensure_ascii=False).encode() + b"\n"


# --- inspect ---------------------------------------------------------------------------


def _inspect(args: argparse.Namespace) -> int:
    path = Path(args.segment)
    data = path.read_bytes()
    pos = 0
    frames = records = 0
    bad: str | None = None
    out = sys.stdout.buffer
    while pos < len(data):
        try:
            header = parse_header(data, pos)
            verify_frame(data, pos, header)
        except SeglogError as exc:
            bad = str(exc)
            break
        frames += 1
        records += header.record_count
        if not args.quiet:
            out.write(
                json.dumps(
                    {
                        "pos": pos,
                        "base_offset": header.base_offset,
                        "records": header.record_count,
                        "leader_epoch": header.leader_epoch,
                        "min_ts": header.min_ts,
                        "max_ts": header.max_ts,
                        "body_bytes": header.body_len,
                        "compression": ["none", "zstd"][header.compression],
                        "crc": f"{header.crc:08x}",
                        "format": header.version,
                        **(
                            {
                                "producer_id": header.producer_id,
                                "producer_epoch": header.producer_epoch,
                                "base_sequence": header.base_sequence,
                            }
                            if header.producer_id >= 0
                            else {}
                        ),
                    }
                ).encode()
                + b"\n"
            )
            if args.records:
                batch = decode_body(data, pos, header)
                table = pa.Table.from_batches([batch]).add_column(
                    0, OFFSET_FIELD, pa.array(range(header.base_offset, header.next_offset), pa.int64())
                )
                rows = records_from_table(table, None)  # type: ignore[arg-type]
                out.write(b"".join(_format(r, "json", args.value_format) for r in rows))
        pos += header.size
    out.write(f"{path.name}: {frames} frames, {records} records, {pos} valid bytes of {len(data)}\n".encode())
    out.flush()
    if bad is not None:
        print(f"seglog: error: {path}: corrupt at position {pos}: {bad}", file=sys.stderr)
        return 1
    return 0


# --- stats, groups, tier -----------------------------------------------------------------


def _tier_target(args: argparse.Namespace) -> Any:
    if not args.tier:
        return None
    return open_target(args.tier, s3_endpoint=args.s3_endpoint)


def _stats(args: argparse.Namespace) -> int:
    root = check_store(args.data)
    target = _tier_target(args)
    rows: list[dict[str, Any]] = []
    try:
        for name in list_dbs(root):
            config, views = db_view(root, name, tier=target)
            for v in views:
                rows.append(
                    {
                        "db": name,
                        "engine": config.engine,
                        "shard": v.shard,
                        "start": v.start_offset,
                        "end": v.end_offset,
                        "segments": v.segments,
                        "bytes": v.bytes,
                        "hot": v.hot_bytes,
                        "warm": v.warm_bytes,
                        "cold": v.cold_bytes,
                    }
                )
    finally:
        if target is not None:
            target.close()
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{'db':<16}{'shard':>6}{'start':>12}{'end':>12}{'segments':>9}{'hot':>14}{'warm':>14}{'cold':>14}")
    for r in rows:
        print(
            f"{r['db']:<16}{r['shard']:>6}{r['start']:>12,}{r['end']:>12,}{r['segments']:>9}"
            f"{r['hot']:>14,}{r['warm']:>14,}{r['cold']:>14,}"
        )
    if not rows:
        print(f"no databases in {root}", file=sys.stderr)
    return 0


def _groups(args: argparse.Namespace) -> int:
    validate_db_name(args.db)
    lags = group_lags(args.data, args.db)
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "group": g.group,
                        "shard": g.shard,
                        "committed": g.committed,
                        "end": g.end_offset,
                        "lag": g.lag,
                    }
                    for g in lags
                ]
            )
        )
        return 0
    if not lags:
        print(f"no consumer groups in {args.db}", file=sys.stderr)
        return 0
    print(f"{'group':<24}{'shard':>6}{'committed':>12}{'end':>12}{'lag':>12}")
    for g in lags:
        committed = "-" if g.committed is None else f"{g.committed:,}"
        print(f"{g.group:<24}{g.shard:>6}{committed:>12}{g.end_offset:>12,}{g.lag:>12,}")
    totals: Counter[str] = Counter()
    for g in lags:
        totals[g.group] += g.lag
    for group, lag in totals.items():
        print(f"{group:<24}{'all':>6}{'':>12}{'':>12}{lag:>12,}")
    return 0


async def _tier(args: argparse.Namespace) -> int:
    if not args.tier:
        raise InvalidArgument("--tier is required (file:///abs/dir or s3://bucket/prefix)")
    check_store(args.data)
    async with seglog.open(
        args.data, tier=args.tier, s3_endpoint=args.s3_endpoint, retention_interval_ms=None
    ) as store:
        db = await store.open_db(args.db)
        if args.seal:
            await db.seal()
        entries = await db.tier_now()
        lines = tier_report_lines([e.to_json() for e in entries], [asdict(t) for t in db.tier_stats()])
        print("\n".join(lines))
    return 0


def tier_report_lines(
    committed: Sequence[Mapping[str, Any]], shards: Sequence[Mapping[str, Any]]
) -> list[str]:
    """What ``seglog tier`` and ``seglog admin tier`` print: one line per object committed
    (manifest entries as JSON), then one per shard (``Database.tier_stats`` as dicts)."""
    lines = [
        f"committed {e['key']}: offsets {e['base_offset']}..{e['end_offset']}, {e['rows']:,} rows, "
        f"{e['bytes']:,} bytes"
        for e in committed
    ]
    lines += [
        f"shard {t['shard']}: hot {t['hot_bytes']:,} B, warm {t['warm_bytes']:,} B, "
        f"cold {t['cold_bytes']:,} B ({t['tier_objects']} objects)"
        for t in shards
    ]
    return lines


# --- produce ---------------------------------------------------------------------------


class _Input:
    """Lines of a file descriptor, read on the event loop.

    Pipes and terminals are watched with ``add_reader``: each readiness gives one ``read``
    (which cannot block), and the bytes go straight into :attr:`lines` in the same loop
    callback, so whatever was read is in :attr:`lines` when a Ctrl-C is handled. Regular
    files (which cannot be watched, and never block) are read on demand with
    :meth:`read_more`.
    """

    def __init__(self, fd: int, wake: asyncio.Event, *, max_lines: int) -> None:
        self.fd = fd
        self.lines: deque[bytes] = deque()
        self.eof = False
        self.error: OSError | None = None  # a failed read, raised once the lines before it are in
        self._partial: list[bytes] = []
        self._wake = wake
        self._max_lines = max_lines
        self._loop = asyncio.get_running_loop()
        self._watching = False
        try:
            self._loop.add_reader(fd, self._on_readable)
            self._watching = True
            self.pollable = True
        except PermissionError:  # a regular file (or /dev/null): epoll refuses it
            self.pollable = False

    def _on_readable(self) -> None:
        try:
            data = os.read(self.fd, READ_CHUNK_BYTES)
        except OSError as exc:
            self.error, data = exc, b""
        self._feed(data)
        if len(self.lines) >= self._max_lines:
            self._unwatch()  # back-pressure: resumed by take()
        self._wake.set()

    def _unwatch(self) -> None:
        if self._watching:
            self._loop.remove_reader(self.fd)
            self._watching = False

    def _feed(self, data: bytes) -> None:
        if not data:
            self.eof = True
            self._unwatch()
            if self._partial:
                self.lines.append(b"".join(self._partial))
                self._partial = []
            return
        if b"\n" not in data:
            self._partial.append(data)
            return
        if self._partial:
            data = b"".join(self._partial) + data
        *lines, rest = data.split(b"\n")
        self._partial = [rest] if rest else []
        self.lines.extend(lines)

    def read_more(self) -> None:
        """Read the next chunk of a regular file (never blocks)."""
        self._feed(os.read(self.fd, READ_CHUNK_BYTES * 16))

    def take(self) -> bytes:
        """The next line (call only while :attr:`lines` is not empty)."""
        line = self.lines.popleft()
        if self.pollable and not self._watching and not self.eof and len(self.lines) < self._max_lines // 2:
            self._loop.add_reader(self.fd, self._on_readable)
            self._watching = True
        return line

    def close(self) -> None:
        self._unwatch()


class _BadLine(Exception):
    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


class _Producer:
    """Lines -> records -> appends, in batches of ``--batch`` lines or every ``--linger-ms``."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.db: seglog.Database | None = None
        self.bar: tqdm[Any] | None = None
        self.topic: str = args.topic
        self.key: bytes | None = None if args.key is None else args.key.encode()
        self.sep: bytes | None = None if args.key_separator is None else args.key_separator.encode()
        self.headers: dict[str, bytes] | None = _parse_headers(args.header)
        self.shard: int | None = args.shard
        self.batch_size: int = args.batch
        self.linger_s: float = args.linger_ms / 1000
        self.batch: list[seglog.Record] = []
        self.first_line = 0  # file line of batch[0]
        self.line_no = 0  # lines taken so far
        self.stored = 0
        self.shards: Counter[int] = Counter()
        self.deadline: float | None = None
        self.stopped = False
        self.wake = asyncio.Event()

    def interrupt(self) -> None:
        self.stopped = True
        self.wake.set()

    def _record(self, line: bytes) -> seglog.Record:
        if line.endswith(b"\r"):
            line = line[:-1]
        key = self.key
        if self.sep is not None:
            key, found, value = line.partition(self.sep)
            if not found:
                raise _BadLine(self.line_no, f"no key separator {self.sep.decode()!r} in the line")
            line = value
        return seglog.Record(topic=self.topic, value=line, key=key, headers=self.headers)

    def _take(self, source: _Input, limit: int) -> None:
        """Move up to ``limit`` lines into the batch (raises :class:`_BadLine`)."""
        while source.lines and len(self.batch) < limit:
            line = source.take()
            self.line_no += 1
            if not self.batch:
                self.first_line = self.line_no
                self.deadline = asyncio.get_running_loop().time() + self.linger_s
            self.batch.append(self._record(line))

    async def flush(self) -> None:
        """Append the batch; on an invalid record, append the lines before it and raise."""
        assert self.db is not None and self.bar is not None
        batch, first = self.batch, self.first_line
        self.batch, self.deadline = [], None
        n = len(batch)
        bad: InvalidRecord | None = None
        while n:
            try:
                metas = await self.db.append(batch[:n], shard=self.shard)
            except InvalidRecord as exc:
                if exc.index is None or exc.index >= n:
                    raise
                bad, n = exc, exc.index  # retried: the first bad one may be earlier
                continue
            self.stored += len(metas)
            self.shards.update(metas.shards.tolist())
            self.bar.update(len(metas))
            break
        if bad is not None and bad.index is not None:
            raise _BadLine(first + bad.index, _RECORD_PREFIX.sub("", str(bad)))

    async def run(self, source: _Input) -> None:
        """Until end of input or :meth:`interrupt`; what was read is appended either way."""
        loop = asyncio.get_running_loop()
        try:
            while not self.stopped:
                self._take(source, self.batch_size)
                if len(self.batch) >= self.batch_size:
                    await self.flush()
                    continue
                if source.eof and not source.lines:
                    break
                if not source.pollable:
                    source.read_more()
                    await asyncio.sleep(0)  # let a Ctrl-C be handled between chunks
                    continue
                if self.deadline is not None and loop.time() >= self.deadline:
                    await self.flush()
                    continue
                self.wake.clear()
                timeout = None if self.deadline is None else self.deadline - loop.time()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), timeout)
            # End of input or Ctrl-C: every line read so far is appended.
            while source.lines:
                self._take(source, len(self.batch) + len(source.lines))
            while self.batch:
                await self.flush()
            if source.error is not None:
                raise source.error
        except _BadLine:
            if self.batch:  # the lines before the bad one (a key-separator error)
                await self.flush()
            raise

    async def read_all(self, source: _Input) -> list[seglog.Record] | None:
        """Every line of the input as a record (``--atomic``); ``None`` if interrupted."""
        records: list[seglog.Record] = []
        while not self.stopped:
            while source.lines:
                line = source.take()
                self.line_no += 1
                records.append(self._record(line))
            if source.error is not None:
                raise source.error
            if source.eof:
                return records
            if not source.pollable:
                source.read_more()
                await asyncio.sleep(0)
                continue
            self.wake.clear()
            await self.wake.wait()
        return None

    def validate(self, records: list[seglog.Record], config: seglog.DbConfig) -> None:
        """Raise :class:`_BadLine` for the first record ``config`` would refuse."""
        for i in range(0, len(records), self.batch_size):
            try:
                records_to_batch(
                    records[i : i + self.batch_size],
                    max_record_bytes=config.max_record_bytes,
                    min_ts_us=config.min_ts_us,
                    max_ts_us=config.max_ts_us,
                )
            except InvalidRecord as exc:
                if exc.index is None:
                    raise
                raise _BadLine(i + exc.index + 1, _RECORD_PREFIX.sub("", str(exc))) from None

    async def append_all(self, records: list[seglog.Record]) -> None:
        for i in range(0, len(records), self.batch_size):
            self.batch, self.first_line = records[i : i + self.batch_size], i + 1
            await self.flush()

    def where(self) -> str:
        return ", ".join(f"shard {s}: {c}" for s, c in sorted(self.shards.items()))

    def summary(self, name: str) -> str:
        if not self.stored:
            return f"appended 0 records to {name}"
        return f"appended {self.stored} records to {name} ({self.where()})"


def _parse_headers(items: Sequence[str] | None) -> dict[str, bytes] | None:
    if not items:
        return None
    out: dict[str, bytes] = {}
    for item in items:
        name, found, value = item.partition("=")
        if not found or not name:
            raise InvalidArgument(f"--header {item!r}: expected NAME=VALUE")
        out[name] = value.encode()
    return out


def _writable_data_dir(path: str) -> Path:
    """The data directory ``produce`` may use: a store, an empty or new directory whose parent exists.

    Raises:
        InvalidArgument: It would mean creating parents or writing into a foreign directory.
    """
    p = Path(path).absolute()
    if (p / STORE_FILE).is_file():
        return p
    if p.exists():
        if not p.is_dir():
            raise InvalidArgument(f"{p} exists and is not a directory")
        if any(p.iterdir()):
            raise InvalidArgument(
                f"{p} is not empty and is not a seglog data directory (no {STORE_FILE}); not writing into it"
            )
        return p
    if not p.parent.is_dir():
        raise InvalidArgument(f"cannot create {p}: its parent directory {p.parent} does not exist")
    return p


def _check_topic(topic: str) -> None:
    try:
        records_to_batch([seglog.Record(topic=topic, value=b"")])
    except InvalidRecord as exc:
        raise InvalidArgument(f"--topic {topic!r}: {_RECORD_PREFIX.sub('', str(exc))}") from None


async def _produce(args: argparse.Namespace) -> int:
    # Everything that can be checked is checked before anything is created.
    validate_db_name(args.db)
    _check_topic(args.topic)
    if args.key_separator == "":
        raise InvalidArgument("--key-separator must not be empty")
    producer = _Producer(args)
    data = _writable_data_dir(args.data)
    if not args.file and sys.stdin is None:
        raise InvalidArgument("stdin is closed: pipe lines in or use --file")
    file: IO[bytes] | None = open(args.file, "rb") if args.file else None  # noqa: SIM115
    fd = file.fileno() if file is not None else sys.stdin.fileno()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, producer.interrupt)
    source = _Input(fd, producer.wake, max_lines=4 * args.batch)
    try:
        records: list[seglog.Record] | None = None
        if args.atomic:
            records = await producer.read_all(source)
            if records is None:
                print("interrupted: nothing stored (--atomic)", file=sys.stderr)
                return 130
            producer.validate(records, _config_for(data, args))
        async with seglog.open(data) as store:
            db = await store.create_db(args.db, args.shards, exist_ok=True)
            if args.shard is not None and not 0 <= args.shard < db.shards:
                raise InvalidArgument(f"--shard {args.shard}: {args.db} has shards 0..{db.shards - 1}")
            with tqdm(unit="rec", unit_scale=True, desc="produce", disable=not _progress(args)) as bar:
                producer.db, producer.bar = db, bar
                if records is not None:
                    await producer.append_all(records)  # a Ctrl-C now waits for the end
                else:
                    await producer.run(source)
    except _BadLine as bad:
        if args.atomic:
            after = "nothing was stored (--atomic)"
        elif producer.stored:
            after = (
                f"the {producer.stored} records before it were appended to {args.db} ({producer.where()}), "
                "nothing after it"
            )
        else:
            after = "nothing was appended"
        raise InvalidRecord(f"line {bad.line}: {bad.message}; {after}") from None
    finally:
        source.close()
        loop.remove_signal_handler(signal.SIGINT)
        if file is not None:
            file.close()
    if producer.stopped and not args.atomic:
        print(f"interrupted: {producer.summary(args.db)}", file=sys.stderr)
        return 130
    print(producer.summary(args.db), file=sys.stderr)
    return 0


def _config_for(data: Path, args: argparse.Namespace) -> seglog.DbConfig:
    """The config ``args.db`` has (it exists) or will get (read without opening the store)."""
    with contextlib.suppress(DatabaseNotFound):
        return read_db_config(data, args.db)
    return seglog.DbConfig() if args.shards is None else seglog.DbConfig(shards=args.shards)


# --- consume ---------------------------------------------------------------------------


def _parse_time(text: str) -> int:
    """ISO 8601 (naive means UTC) -> µs since the epoch."""
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise InvalidArgument(f"--from-time: not an ISO 8601 time: {text!r}") from None
    return seglog.timestamp_us(moment)


Commit = Callable[[int, int], Awaitable[None]]


async def _consume(args: argparse.Namespace) -> int:
    validate_db_name(args.db)
    if args.topic is not None:
        validate_topic_filter(args.topic)  # InvalidTopicFilter: one line, exit 1
    root = check_store(args.data)  # never creates the directory
    config = read_db_config(root, args.db)
    if args.shard is not None and not 0 <= args.shard < config.shards:
        raise InvalidArgument(f"--shard {args.shard}: {args.db} has shards 0..{config.shards - 1}")
    if args.from_offset is not None and args.shard is None:
        if config.shards != 1:
            raise InvalidArgument(
                f"--from OFFSET needs --shard N: {args.db} has {config.shards} shards, each with "
                "its own offsets (--from-time works on every shard)"
            )
        args.shard = 0
    shards = [args.shard] if args.shard is not None else list(range(config.shards))
    from_time = None if args.from_time is None else _parse_time(args.from_time)
    if args.follow:
        return await _consume_read_only(args, root, shards, from_time, stop_at_end=False)
    store = seglog.open(root, retention_interval_ms=None)
    try:
        await store
    except StoreLocked:
        # Another process owns the store: print what it has written so far, read-only.
        return await _consume_read_only(args, root, shards, from_time, stop_at_end=True)
    try:
        db = await store.open_db(args.db)
        group = args.group
        through_streams = args.topic is not None and db.streams_enabled
        streams: dict[int, list[seglog.Stream]] = {shard: [] for shard in shards}
        if through_streams:
            for stream in db.get_streams(args.topic, from_time or 0):
                if stream.shard in streams:
                    streams[stream.shard].append(stream)
        sources: dict[int, AsyncGenerator[pa.Table, None]] = {}
        for shard in shards:
            committed = await db.committed(group, shard) if group else None
            if from_time is not None:
                offset = await db.offset_for_time(shard, from_time)
            elif args.from_offset is not None:
                offset = args.from_offset
            elif committed is not None:
                offset = max(committed, db.start_offset(shard))
            else:
                offset = db.start_offset(shard)
            if through_streams:
                sources[shard] = _streams_until_end(db, args.topic, streams[shard], offset)
            elif args.topic is not None:
                sources[shard] = _topic_filtered(_until_end(db, shard, offset), args.topic)
            else:
                sources[shard] = _until_end(db, shard, offset)

        async def commit(shard: int, offset: int) -> None:
            await db.commit(group, shard, offset)

        await _print_merged(sources, args, commit if group else None)
    finally:
        await store.close()
    if args.topic is not None:
        if through_streams:
            how = f"wildcard read of {sum(map(len, streams.values()))} stream(s)"
        else:
            how = f"filtered scan ({args.db} has no streams)"
        print(f"--topic {args.topic!r}: {how}", file=sys.stderr)
    return 0


async def _consume_read_only(
    args: argparse.Namespace, root: Path, shards: list[int], from_time: int | None, *, stop_at_end: bool
) -> int:
    async with contextlib.AsyncExitStack() as stack:
        followers = {}
        for shard in shards:
            followers[shard] = await stack.enter_async_context(
                seglog.follow(
                    root,
                    args.db,
                    shard,
                    offset=args.from_offset,
                    from_time_us=from_time,
                    group=args.group,
                )
            )

        async def commit(shard: int, offset: int) -> None:
            await followers[shard].commit(offset)

        if stop_at_end:
            sources = {s: f.batches(stop_at_end=True) for s, f in followers.items()}
            if args.topic is not None:
                sources = {s: _topic_filtered(b, args.topic) for s, b in sources.items()}
            await _print_merged(sources, args, commit if args.group else None)
        else:
            await _print_live(followers, args, commit if args.group else None)
    if args.topic is not None:
        print(
            f"--topic {args.topic!r}: filtered scan (read-only: another process owns the store)",
            file=sys.stderr,
        )
    return 0


def _write(recs: list[seglog.Record], args: argparse.Namespace) -> None:
    out = sys.stdout.buffer
    out.write(b"".join(_format(r, args.format, args.value_format) for r in recs))
    out.flush()


async def _commit_printed(recs: list[seglog.Record], commit: Commit | None) -> None:
    """Commit after the records were written out: at-least-once delivery."""
    if commit is None:
        return
    ends: dict[int, int] = {}
    for r in recs:
        ends[r.shard] = r.offset + 1  # type: ignore[index,operator]
    for shard, offset in sorted(ends.items()):
        await commit(shard, offset)


def _merge_key(rec: seglog.Record) -> tuple[int, int, int]:
    """Records read back always have ``ts``, ``shard`` and ``offset``."""
    return rec.ts or 0, rec.shard or 0, rec.offset or 0


async def _print_merged(
    sources: dict[int, AsyncGenerator[pa.Table, None]], args: argparse.Namespace, commit: Commit | None
) -> None:
    """Print every shard's records to their end, merged by (ts, shard, offset)."""
    remaining: int | None = args.max
    pending: dict[int, deque[seglog.Record]] = {}
    heap: list[tuple[int, int, int]] = []  # (ts, shard, offset) of each shard's next record

    async def refill(shard: int) -> None:
        table = await anext(sources[shard], None)
        if table is not None and table.num_rows:
            pending[shard] = deque(records_from_table(table, shard))
            heapq.heappush(heap, _merge_key(pending[shard][0]))

    try:
        for shard in sources:
            await refill(shard)
        out: list[seglog.Record] = []
        while heap and (remaining is None or remaining > 0):
            _, shard, _ = heapq.heappop(heap)
            out.append(pending[shard].popleft())
            if remaining is not None:
                remaining -= 1
            if pending[shard]:
                heapq.heappush(heap, _merge_key(pending[shard][0]))
            elif remaining is None or remaining > 0:
                _write(out, args)  # before waiting on a read
                await _commit_printed(out, commit)
                out = []
                await refill(shard)
            if len(out) >= 1000:
                _write(out, args)
                await _commit_printed(out, commit)
                out = []
        _write(out, args)
        await _commit_printed(out, commit)
    finally:
        for source in sources.values():
            await source.aclose()


async def _print_live(
    followers: dict[int, seglog.Follower], args: argparse.Namespace, commit: Commit | None
) -> None:
    """Print new records of every shard as they arrive (each shard in offset order)."""
    remaining: int | None = args.max
    poll_s = min(f.poll_interval_ms for f in followers.values()) / 1000
    while True:
        got = False
        for shard, follower in followers.items():
            table = await follower.read_available()
            if args.topic is not None:
                table = table.filter(_topic_mask(table, args.topic))
            if not table.num_rows:
                continue
            got = True
            if remaining is not None:
                table = table.slice(0, remaining)
                remaining -= table.num_rows
            recs = records_from_table(table, shard)
            _write(recs, args)
            await _commit_printed(recs, commit)
            if remaining is not None and remaining <= 0:
                return
        if not got:
            await asyncio.sleep(poll_s)


async def _until_end(db: seglog.Database, shard: int, offset: int) -> AsyncGenerator[pa.Table, None]:
    while True:
        table = await db.read_arrow(shard, offset, max_records=1000)
        if table.num_rows == 0:
            return
        offset += table.num_rows
        yield table


def _topic_mask(table: pa.Table, topic_filter: str) -> pa.Array:
    """Which rows of ``table`` have a topic matching the MQTT filter (a valid one)."""
    topics = table.column("topic").combine_chunks()
    if not is_wildcard_filter(topic_filter):
        return pc.equal(topics, topic_filter)
    prefix = filter_literal_prefix(topic_filter)
    matched = pc.match_substring_regex(topics, filter_to_regex(topic_filter))
    return pc.and_(pc.starts_with(topics, prefix), matched) if prefix else matched


async def _topic_filtered(
    source: AsyncGenerator[pa.Table, None], topic_filter: str
) -> AsyncGenerator[pa.Table, None]:
    """The rows of ``source`` whose topic matches the filter (a scan: every record is read)."""
    try:
        async for table in source:
            kept = table.filter(_topic_mask(table, topic_filter))
            if kept.num_rows:
                yield kept  # an empty table would end the shard in _print_merged
    finally:
        await source.aclose()


async def _stream_batch(
    db: seglog.Database, it: seglog.Iterator, end: int
) -> tuple[seglog.Iterator, pa.Table | None]:
    """The next non-empty batch of a stream before ``end``, or ``None`` when it has no more."""
    while it.position < end:
        nxt, table = await db.next_arrow(it, 1000)
        if table.num_rows:
            return nxt, table
        if nxt.position <= it.position:
            break
        it = nxt  # a read that skipped frames without a match: go on after them
    return it, None


async def _streams_until_end(
    db: seglog.Database, topic_filter: str, streams: list[seglog.Stream], offset: int
) -> AsyncGenerator[pa.Table, None]:
    """One shard's records matching the filter from ``offset``, read through its streams.

    Each stream is read with its own iterator (only frames holding the stream are read);
    the streams are merged by offset, so the shard's records come in the order a filtered
    scan gives them.
    """
    if not streams:
        return
    end = db.end_offset(streams[0].shard)
    iters = [db.make_iterator(s, topic_filter).advanced(offset) for s in streams]
    heads: list[pa.Table | None] = [None] * len(iters)
    for k in range(len(iters)):
        iters[k], heads[k] = await _stream_batch(db, iters[k], end)
    while True:
        live = [(k, head) for k, head in enumerate(heads) if head is not None]
        if not live:
            return
        firsts = [(head.column("offset")[0].as_py(), k) for k, head in live]
        _, k = min(firsts)
        bound = min((o for o, j in firsts if j != k), default=None)
        head = heads[k]
        assert head is not None
        take = head.num_rows if bound is None else pc.sum(pc.less(head.column("offset"), bound)).as_py()
        yield head.slice(0, take)
        if take < head.num_rows:
            heads[k] = head.slice(take)
        else:
            iters[k], heads[k] = await _stream_batch(db, iters[k], end)


# --- arguments -------------------------------------------------------------------------


def _int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, not {value}")
        return value

    parse.__name__ = f"int >= {minimum}"
    return parse


def _parser(network: bool = False) -> argparse.ArgumentParser:
    """The command line; ``network``: ``produce``/``consume`` are their ``--url`` forms."""
    from seglog import cli_net  # here, not at the top: it imports this module

    p = argparse.ArgumentParser(prog="seglog", description="A durable segmented log for MQTT-style data.")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.add_argument("--version", action="version", version=f"seglog {seglog.__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
    bar = argparse.ArgumentParser(add_help=False)
    bar.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar on stderr (default: when stderr is a terminal)",
    )
    values = argparse.ArgumentParser(add_help=False)
    values.add_argument(
        "--value-format",
        choices=("auto", "base64"),
        default="auto",
        help="JSON keys/values/headers: auto = UTF-8 text as a string, other bytes as "
        '{"base64": "..."}; base64 = always a base64 string',
    )
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser(
        "demo", parents=[common, bar], help="ingest synthetic MQTT telemetry, read it back, tier it"
    )
    d.add_argument(
        "data",
        help="new or empty data directory (a rerun reuses one made by the demo; "
        "DATA-tier, DATA-node and DATA-sites.png are made next to it)",
    )
    d.add_argument("--records", type=_int_at_least(1), default=DEMO_RECORDS)
    d.add_argument("--shards", type=_int_at_least(1), default=4)
    d.add_argument("--no-spark", action="store_true", help="skip the PySpark job over the tier")
    d.add_argument(
        "--net-records",
        type=_int_at_least(1),
        default=DEMO_NET_RECORDS,
        help="records of the network step: one producer and one consumer through `seglog serve` "
        f"on DATA-node (default {DEMO_NET_RECORDS:,}, at most --records)",
    )
    d.add_argument("--no-network", action="store_true", help="skip the network step")

    dc = sub.add_parser(
        "demo-cluster",
        parents=[common],
        help="a 3-node cluster (etcd + `seglog serve` nodes): SIGKILL a leader mid-stream, lose nothing acknowledged",
    )
    dc.add_argument("--seconds", type=float, default=6.0, help="how long the producer runs (default 6)")
    dc.add_argument(
        "--kill-after", type=float, default=2.0, help="SIGKILL shard 0's leader after this (default 2)"
    )
    dc.add_argument("--shards", type=_int_at_least(1), default=4, help="shards of the database (default 4)")
    dc.add_argument("--rate", type=_int_at_least(20), default=2000, help="records/s sent (default 2000)")
    dc.add_argument(
        "--node-ttl-s", type=_int_at_least(1), default=2, help="node lease TTL: failure detection (default 2)"
    )
    dc.add_argument(
        "--dir", default=None, help="parent of the temporary work directory (default: system temp)"
    )
    dc.add_argument("--keep", action="store_true", help="keep the work directory (etcd, node data, logs)")

    i = sub.add_parser(
        "inspect", parents=[common, values], help="dump frame headers of a segment file and verify every CRC"
    )
    i.add_argument("segment")
    i.add_argument("--quiet", "-q", action="store_true", help="only the summary line")
    i.add_argument("--records", action="store_true", help="also print every record (JSON lines)")

    if network:
        cli_net.add_produce_parser(sub, [common])
        cli_net.add_consume_parser(sub, [common, values])
    else:
        _add_produce_consume(sub, common, bar, values)
    _add_other_commands(sub, common)
    cli_net.add_admin_parser(sub, [common])
    return p


_NETWORK_EPILOG: Final = (
    "With --url URL this is the network form (a node started with `seglog serve`): "
    "`seglog {cmd} --url URL DB ...`; see `seglog {cmd} --url URL --help`."
)


def _add_produce_consume(
    sub: Any, common: argparse.ArgumentParser, bar: argparse.ArgumentParser, values: argparse.ArgumentParser
) -> None:
    pr = sub.add_parser(
        "produce",
        parents=[common, bar],
        help="append lines of stdin (or --file) as records (--url URL: to a node)",
        epilog=_NETWORK_EPILOG.format(cmd="produce"),
    )
    pr.add_argument("data", help="data directory (created if missing; its parent must exist)")
    pr.add_argument("db")
    pr.add_argument("--topic", required=True)
    pr.add_argument("--file", help="read lines from this file instead of stdin")
    keys = pr.add_mutually_exclusive_group()
    keys.add_argument("--key", help="record key for every line")
    keys.add_argument("--key-separator", metavar="SEP", help="each line is KEY<SEP>VALUE")
    pr.add_argument(
        "--header", action="append", metavar="NAME=VALUE", help="a header on every record (repeatable)"
    )
    pr.add_argument(
        "--shard", type=_int_at_least(0), help="append to this shard (default: route by key/topic)"
    )
    pr.add_argument(
        "--shards", type=_int_at_least(1), default=None, help="shards when the database is created"
    )
    pr.add_argument(
        "--batch", type=_int_at_least(1), default=1000, help="most lines per append (default 1000)"
    )
    pr.add_argument(
        "--linger-ms",
        type=_int_at_least(0),
        default=50,
        help="append a partial batch this long after its first line arrived (default 50)",
    )
    pr.add_argument(
        "--atomic", action="store_true", help="read and validate the whole input before appending anything"
    )

    co = sub.add_parser(
        "consume",
        parents=[common, values],
        help="print records of every shard (merged by timestamp), or of one (--url URL: of a node)",
        epilog=_NETWORK_EPILOG.format(cmd="consume"),
    )
    co.add_argument("data")
    co.add_argument("db")
    co.add_argument("--shard", type=_int_at_least(0), help="only this shard (default: every shard)")
    start = co.add_mutually_exclusive_group()
    start.add_argument(
        "--from",
        dest="from_offset",
        type=_int_at_least(0),
        help="first offset (needs --shard unless the database has one shard; default: the start)",
    )
    start.add_argument("--from-time", help="first record at or after this ISO 8601 time (UTC if naive)")
    co.add_argument("--max", type=_int_at_least(1), help="stop after this many records")
    co.add_argument(
        "--topic",
        metavar="FILTER",
        help="only records whose topic matches this MQTT filter (+ one level, # the rest; "
        "$-topics only by a filter naming them): a database with streams reads only the matching "
        "streams, one without scans and filters",
    )
    co.add_argument("--group", help="consumer group: start at its committed offsets, commit as records print")
    co.add_argument("--format", choices=("json", "raw"), default="json")
    co.add_argument(
        "--follow",
        action="store_true",
        help="keep printing new records as they are written, also while another process owns the store "
        "(read-only; shards interleaved as records arrive; Ctrl-C to stop)",
    )


def _add_other_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    s = sub.add_parser(
        "stats",
        parents=[common],
        help="databases, shards, offsets, segments and hot/warm/cold bytes (read-only)",
    )
    s.add_argument("data")
    s.add_argument("--json", action="store_true")

    g = sub.add_parser(
        "groups", parents=[common], help="consumer groups of a database with their lag per shard"
    )
    g.add_argument("data")
    g.add_argument("db")
    g.add_argument("--json", action="store_true")

    sv = sub.add_parser("serve", parents=[common], help="serve a data directory over HTTP (the node API)")
    sv.add_argument("data", help="data directory (created if missing; its parent must exist)")
    sv.add_argument(
        "--listen", default=f"127.0.0.1:{DEFAULT_PORT}", help=f"HOST:PORT (default 127.0.0.1:{DEFAULT_PORT})"
    )
    sv.add_argument("--fsync", choices=("always", "interval", "never"), default="always")
    sv.add_argument(
        "--thp",
        choices=("disable", "keep"),
        default="disable",
        help="transparent huge pages for the node process (default: off, see seglog.open's thp)",
    )
    sv.add_argument("--tls-cert", help="PEM certificate chain: serve HTTPS (needs --tls-key)")
    sv.add_argument("--tls-key", help="PEM private key of --tls-cert")
    sv.add_argument(
        "--tokens", help="tokens file (TOKEN PRINCIPAL PERMS per line); without it: loopback only, no auth"
    )
    sv.add_argument("--max-body-bytes", type=int, help="largest request body (413 above it; default 64 MiB)")
    sv.add_argument(
        "--max-inflight-appends",
        type=int,
        help="produce requests written at once; more get 503 (default 256)",
    )
    sv.add_argument("--idle-timeout-s", type=float, help="close a client that stalls this long (default 60)")
    sv.add_argument("--quota-bytes", type=int, help="soft cap on the store's bytes; appends past it get 429")
    sv.add_argument(
        "--tier",
        help="tier sealed segments as Parquet: file:///abs/dir or s3://bucket/prefix (not with --etcd)",
    )
    sv.add_argument("--s3-endpoint", help="S3 endpoint of --tier (credentials from the AWS_* environment)")
    sv.add_argument(
        "--tier-interval-ms",
        type=int,
        help=f"tier every database this often (default {DEFAULT_SERVE_TIER_INTERVAL_MS}; 0: only on "
        "`seglog admin tier`)",
    )
    sv.add_argument("--etcd", help="join a cluster: etcd endpoints http://HOST:PORT[,...] (needs --node-id)")
    sv.add_argument("--node-id", type=int, help="this node's id in the cluster (unique, >= 0)")
    sv.add_argument(
        "--advertise", help="URL other nodes and clients reach this node at (default: the bound URL)"
    )
    sv.add_argument(
        "--replica-lag-time-max-ms", type=int, help="drop an ISR member behind for this long (default 30000)"
    )
    sv.add_argument(
        "--replica-fetch-wait-ms",
        type=int,
        help="how long a follower's fetch waits at its leader for new frames (default 500)",
    )
    sv.add_argument("--node-ttl-s", type=int, help="node lease TTL: silent this long = dead (default 6)")
    sv.add_argument("--peer-token", help="bearer token for requests to other nodes (their --tokens)")
    sv.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default="warning",
        help="stderr log level",
    )

    t = sub.add_parser("tier", parents=[common], help="upload sealed segments of a database to the tier now")
    t.add_argument("data")
    t.add_argument("db")
    t.add_argument("--seal", action="store_true", help="seal the active segments first")
    for cmd in (s, t):
        cmd.add_argument("--tier", help="tier URI: file:///abs/dir or s3://bucket/prefix")
        cmd.add_argument("--s3-endpoint", help="S3 endpoint (credentials from the AWS_* environment)")


def _serve(args: argparse.Namespace) -> int:
    # aiohttp only when serving
    from seglog.cluster.context import ServerLimits
    from seglog.cluster.server import NodeServer, parse_listen, run

    host, port = parse_listen(args.listen)
    if (args.tls_cert is None) != (args.tls_key is None):
        raise InvalidArgument("--tls-cert and --tls-key go together")
    context = None
    if args.tls_cert is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(args.tls_cert, args.tls_key)
    limits = {
        name: value
        for name, value in (
            ("max_body_bytes", args.max_body_bytes),
            ("max_inflight_appends", args.max_inflight_appends),
            ("idle_timeout_s", args.idle_timeout_s),
        )
        if value is not None
    }
    for name, value in limits.items():
        if value <= 0:
            raise InvalidArgument(f"--{name.replace('_', '-')} must be > 0")
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    data = _writable_data_dir(args.data)
    cluster = _cluster_config(args)
    tiering = _serve_tier_options(args)
    server = NodeServer(
        data,
        host=host,
        port=port,
        ssl_context=context,
        tokens=args.tokens,
        limits=ServerLimits(**limits),
        fsync=args.fsync,
        quota_bytes=args.quota_bytes,
        thp=args.thp,
        cluster=cluster,
        **tiering,
    )
    return run(server)


def _serve_tier_options(args: argparse.Namespace) -> dict[str, Any]:
    """The store options of ``serve --tier ...`` (empty without ``--tier``)."""
    if args.tier is None:
        for flag in ("s3_endpoint", "tier_interval_ms"):
            if getattr(args, flag) is not None:
                raise InvalidArgument(f"--{flag.replace('_', '-')} needs --tier")
        return {}
    interval = DEFAULT_SERVE_TIER_INTERVAL_MS if args.tier_interval_ms is None else args.tier_interval_ms
    if interval < 0:
        raise InvalidArgument("--tier-interval-ms must be >= 0 (0: tier only on `seglog admin tier`)")
    return {"tier": args.tier, "s3_endpoint": args.s3_endpoint, "tier_interval_ms": interval or None}


def _cluster_config(args: argparse.Namespace) -> Any:
    """The ``ClusterConfig`` of ``serve --etcd ...``, or ``None`` for a standalone node."""
    from seglog.cluster.node import ClusterConfig

    if args.etcd is None:
        for flag in (
            "node_id",
            "advertise",
            "replica_lag_time_max_ms",
            "replica_fetch_wait_ms",
            "node_ttl_s",
            "peer_token",
        ):
            if getattr(args, flag) is not None:
                raise InvalidArgument(f"--{flag.replace('_', '-')} needs --etcd")
        return None
    if args.node_id is None or args.node_id < 0:
        raise InvalidArgument("--etcd needs --node-id N (N >= 0)")
    options: dict[str, Any] = {}
    if args.replica_lag_time_max_ms is not None:
        if args.replica_lag_time_max_ms <= 0:
            raise InvalidArgument("--replica-lag-time-max-ms must be > 0")
        options["replica_lag_time_max_ms"] = args.replica_lag_time_max_ms
    if args.replica_fetch_wait_ms is not None:
        if args.replica_fetch_wait_ms <= 0:
            raise InvalidArgument("--replica-fetch-wait-ms must be > 0")
        options["fetch_wait_ms"] = args.replica_fetch_wait_ms
    if args.node_ttl_s is not None:
        if args.node_ttl_s < 1:
            raise InvalidArgument("--node-ttl-s must be >= 1")
        options["node_ttl_s"] = args.node_ttl_s
    return ClusterConfig(
        node_id=args.node_id,
        advertise_url=args.advertise or "",
        etcd=tuple(u for u in args.etcd.split(",") if u),
        token=args.peer_token,
        **options,
    )


def _run(args: argparse.Namespace) -> int:
    if getattr(args, "network", None):
        from seglog import cli_net

        return cli_net.run(args)
    if args.command == "demo":
        return asyncio.run(_demo(args))
    if args.command == "demo-cluster":
        from seglog.cluster import demo as cluster_demo

        return 0 if asyncio.run(cluster_demo.run_demo(args)).ok else 1
    if args.command == "inspect":
        return _inspect(args)
    if args.command == "stats":
        return _stats(args)
    if args.command == "groups":
        return _groups(args)
    if args.command == "tier":
        return asyncio.run(_tier(args))
    if args.command == "produce":
        return asyncio.run(_produce(args))
    if args.command == "serve":
        return _serve(args)
    if args.command == "consume":
        return asyncio.run(_consume(args))
    raise InvalidArgument(f"unknown command {args.command!r}")


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's last flush cannot fail again."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``seglog`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    from seglog import cli_net

    args = _parser(network=cli_net.network_mode(argv)).parse_args(argv)
    try:
        code = _run(args)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # The reader went away (``| head``): not an error of ours.
        _silence_stdout()
        return 0
    except (SeglogError, OSError) as exc:
        if args.debug:
            raise
        sys.stderr.flush()
        if getattr(args, "network", None):
            print(cli_net.error_line(exc), file=sys.stderr)
        else:
            print(f"seglog: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
