"""The ``seglog`` command line."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import random
import shutil
import sys
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
from tqdm import tqdm

import seglog
from seglog._routing import shard_for
from seglog.errors import CorruptFrame, InvalidArgument, SeglogError, StoreLocked
from seglog.record import parse_header, records_from_table, verify_frame

__all__ = ["main"]

DEMO_RECORDS = 1_000_000
DEMO_DEVICES = 1000
DEMO_SITES = 10
DEMO_METRICS = ("temp", "humidity", "pressure", "co2")
DEMO_BATCH_RECORDS = 1000
DEMO_PRODUCERS = 4


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


async def _demo(args: argparse.Namespace) -> int:
    data = Path(args.data)
    if data.exists():
        shutil.rmtree(data)
    n = args.records
    start_us = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z
    print(f"generating {n:,} records from {DEMO_DEVICES} devices ...")
    records = _demo_records(n, start_us)
    batches = [records[i : i + DEMO_BATCH_RECORDS] for i in range(0, n, DEMO_BATCH_RECORDS)]
    tier_dir = Path(str(data) + "-tier")
    if tier_dir.exists():
        shutil.rmtree(tier_dir)
    tier_uri = f"file://{tier_dir.absolute()}"
    async with seglog.open(data, fsync="always", tier=tier_uri) as store:
        db = await store.create_db("telemetry", shards=args.shards, segment_bytes=16 << 20)
        bar = tqdm(total=n, unit="rec", unit_scale=True, desc="ingest (fsync=always)")

        async def produce(k: int) -> None:
            for b in batches[k::DEMO_PRODUCERS]:
                await db.append(b)
                bar.update(len(b))

        t0 = time.perf_counter()
        await asyncio.gather(*(produce(k) for k in range(DEMO_PRODUCERS)))
        ingest_s = time.perf_counter() - t0
        bar.close()
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
            print(f"error: read back {total} records, wrote {n}", file=sys.stderr)
            return 1
        mid_ts = start_us + (n // 2) * 1000
        shard0_mid = await db.offset_for_time(0, mid_ts)
        first = (await db.read(0, shard0_mid, 1))[0]
        device = b"dev0042"
        key_shard = shard_for(device, db.shards)
        by_key = await db.read_key(key_shard, device)
        expected_key = len([r for r in records if r.key == device])
        stats = db.stats()
    print()
    print(f"{'ingested':<22}{n:>14,} records in {ingest_s:6.2f} s  = {n / ingest_s:>12,.0f} records/s (durable)")
    print(f"{'read back (arrow)':<22}{total:>14,} records in {read_s:6.2f} s  = {total / read_s:>12,.0f} records/s")
    print(f"{'offset_for_time':<22}shard 0 at {time.strftime('%H:%M:%S', time.gmtime(mid_ts / 1e6))}Z -> offset "
          f"{shard0_mid:,} ({first.topic}, ts {first.ts})")
    print(f"{'read_key':<22}{device.decode()} -> {len(by_key):,} records on shard {key_shard} "
          f"(expected {expected_key:,})")
    for s in stats:
        print(f"  shard {s.shard}: offsets {s.start_offset:,}..{s.end_offset:,}, {s.segments} segment(s), "
              f"{s.bytes / 1e6:.1f} MB")
    if len(by_key) != expected_key:
        print("error: key lookup mismatch", file=sys.stderr)
        return 1
    print(f"{'tiered':<22}{len(entries)} Parquet objects, {tier_bytes / 1e6:.1f} MB in {tier_s:.2f} s -> {tier_uri}")
    if not args.no_spark:
        _demo_spark(tier_uri, Path(str(data) + "-sites.png"))
    print(f"\ndata directory: {data}")
    return 0


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
        print(f"{r['site']:<8}{r['minute'].strftime('%Y-%m-%d %H:%M'):<18}{r['messages']:>10,}"
              f"{r['avg_value']:>10.3f}{r['max_value']:>10.3f}")
    if len(rows) > 12:
        print(f"... {len(rows) - 12} more rows")
    write_site_minute_chart(table, chart)
    print(f"Spark job: {len(rows)} (site, minute) rows in {spark_s:.1f} s; chart written to {chart}")


def _inspect(args: argparse.Namespace) -> int:
    path = Path(args.segment)
    data = path.read_bytes()
    pos = 0
    frames = records = 0
    bad: str | None = None
    while pos < len(data):
        try:
            header = parse_header(data, pos)
            verify_frame(data, pos, header)
        except CorruptFrame as exc:
            bad = str(exc)
            break
        frames += 1
        records += header.record_count
        if not args.quiet:
            print(json.dumps({
                "pos": pos, "base_offset": header.base_offset, "records": header.record_count,
                "leader_epoch": header.leader_epoch, "min_ts": header.min_ts, "max_ts": header.max_ts,
                "body_bytes": header.body_len, "compression": ["none", "zstd"][header.compression],
                "crc": f"{header.crc:08x}",
            }))
        pos += header.size
    print(f"{path.name}: {frames} frames, {records} records, {pos} valid bytes of {len(data)}")
    if bad is not None:
        print(f"error: corrupt at position {pos}: {bad}", file=sys.stderr)
        return 1
    return 0


def _open_with_tier(args: argparse.Namespace) -> seglog.Store:
    return seglog.open(
        args.data,
        tier=args.tier,
        s3_endpoint=args.s3_endpoint,
        retention_interval_ms=None,
    )


async def _stats(args: argparse.Namespace) -> int:
    async with _open_with_tier(args) as store:
        rows: list[dict[str, Any]] = []
        for name in store.list_dbs():
            db = await store.open_db(name)
            tiers = {t.shard: t for t in db.tier_stats()}
            for s in db.stats():
                t = tiers[s.shard]
                rows.append({"db": name, "shard": s.shard, "start": s.start_offset, "end": s.end_offset,
                             "segments": s.segments, "bytes": s.bytes, "hot": t.hot_bytes,
                             "warm": t.warm_bytes, "cold": t.cold_bytes})
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{'db':<16}{'shard':>6}{'start':>12}{'end':>12}{'segments':>9}{'hot':>14}{'warm':>14}{'cold':>14}")
    for r in rows:
        print(f"{r['db']:<16}{r['shard']:>6}{r['start']:>12,}{r['end']:>12,}{r['segments']:>9}"
              f"{r['hot']:>14,}{r['warm']:>14,}{r['cold']:>14,}")
    return 0


async def _tier(args: argparse.Namespace) -> int:
    if not args.tier:
        raise InvalidArgument("--tier is required (file:///abs/dir or s3://bucket/prefix)")
    async with _open_with_tier(args) as store:
        db = await store.open_db(args.db)
        if args.seal:
            await db.seal()
        entries = await db.tier_now()
        for e in entries:
            print(f"committed {e.key}: offsets {e.base_offset}..{e.end_offset}, {e.rows:,} rows, {e.bytes:,} bytes")
        for t in db.tier_stats():
            print(f"shard {t.shard}: hot {t.hot_bytes:,} B, warm {t.warm_bytes:,} B, cold {t.cold_bytes:,} B "
                  f"({t.tier_objects} objects)")
    return 0


def _parse_time(text: str) -> int:
    """ISO 8601 (naive means UTC) -> µs since the epoch."""
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise InvalidArgument(f"--from-time: not an ISO 8601 time: {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return int(moment.timestamp() * 1_000_000)


async def _produce(args: argparse.Namespace) -> int:
    source = open(args.file, "rb") if args.file else sys.stdin.buffer  # noqa: SIM115
    key = args.key.encode() if args.key is not None else None
    total = 0
    try:
        async with seglog.open(args.data) as store:
            db = await store.create_db(args.db, args.shards, exist_ok=True)
            bar = tqdm(unit="rec", unit_scale=True, desc="produce", disable=not args.file)
            batch: list[seglog.Record] = []
            for line in source:
                batch.append(seglog.Record(topic=args.topic, value=line.rstrip(b"\r\n"), key=key))
                if len(batch) >= 1000:
                    await db.append(batch, shard=args.shard)
                    total += len(batch)
                    bar.update(len(batch))
                    batch = []
            if batch:
                await db.append(batch, shard=args.shard)
                total += len(batch)
                bar.update(len(batch))
            bar.close()
    finally:
        if args.file:
            source.close()
    print(f"appended {total} records to {args.db}", file=sys.stderr)
    return 0


def _format(rec: seglog.Record, fmt: str) -> bytes:
    if fmt == "raw":
        return rec.value + b"\n"
    doc = {
        "shard": rec.shard, "offset": rec.offset, "ts": rec.ts, "topic": rec.topic,
        "key": None if rec.key is None else rec.key.decode("utf-8", "backslashreplace"),
        "value": rec.value.decode("utf-8", "backslashreplace"),
        "headers": None if not rec.headers else {k: v.decode("utf-8", "backslashreplace") for k, v in rec.headers.items()},
    }
    return json.dumps(doc, ensure_ascii=False).encode() + b"\n"


async def _consume(args: argparse.Namespace) -> int:
    if args.follow:
        return await _consume_read_only(args, stop_at_end=False)
    store = seglog.open(args.data, retention_interval_ms=None)
    try:
        await store
    except StoreLocked:
        # Another process owns the store: print what it has written so far, read-only.
        return await _consume_read_only(args, stop_at_end=True)
    try:
        db = await store.open_db(args.db)
        shard = args.shard
        committed = await db.committed(args.group, shard) if args.group else None
        if args.from_time is not None:
            offset = await db.offset_for_time(shard, _parse_time(args.from_time))
        elif args.from_offset is not None:
            offset = args.from_offset
        elif committed is not None:
            offset = max(committed, db.start_offset(shard))
        else:
            offset = db.start_offset(shard)
        group = args.group

        async def commit(offset: int) -> None:
            await db.commit(group, shard, offset)

        await _print_records(_until_end(db, shard, offset), args, commit if group else None)
    finally:
        await store.close()
    return 0


async def _consume_read_only(args: argparse.Namespace, *, stop_at_end: bool) -> int:
    follower = seglog.follow(
        args.data,
        args.db,
        args.shard,
        offset=args.from_offset,
        from_time_us=None if args.from_time is None else _parse_time(args.from_time),
        group=args.group,
    )
    async with follower:
        await _print_records(
            follower.batches(stop_at_end=stop_at_end), args, follower.commit if args.group else None
        )
    return 0


async def _print_records(
    tables: AsyncGenerator[pa.Table, None],
    args: argparse.Namespace,
    commit: Callable[[int], Awaitable[None]] | None,
) -> None:
    """Print records as they come; with a group, commit after each printed batch."""
    out = sys.stdout.buffer
    remaining: int | None = args.max
    try:
        async for table in tables:
            if remaining is not None:
                table = table.slice(0, remaining)
                remaining -= table.num_rows
            recs = records_from_table(table, args.shard)
            out.write(b"".join(_format(r, args.format) for r in recs))
            out.flush()
            if commit is not None and recs:
                # Committed after the records are written out: at-least-once delivery.
                await commit(recs[-1].offset + 1)  # type: ignore[operator]
            if remaining is not None and remaining <= 0:
                break
    finally:
        await tables.aclose()


async def _until_end(db: seglog.Database, shard: int, offset: int) -> AsyncGenerator[pa.Table, None]:
    while True:
        table = await db.read_arrow(shard, offset, max_records=1000)
        if table.num_rows == 0:
            return
        offset += table.num_rows
        yield table


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="seglog", description="A durable segmented log for MQTT-style data.")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="ingest synthetic MQTT telemetry, reopen and read it back")
    d.add_argument("data", help="data directory (wiped first)")
    d.add_argument("--records", type=int, default=DEMO_RECORDS)
    d.add_argument("--shards", type=int, default=4)
    d.add_argument("--no-spark", action="store_true", help="skip the PySpark job over the tier")
    i = sub.add_parser("inspect", help="dump frame headers of a segment file and verify every CRC")
    i.add_argument("segment")
    i.add_argument("--quiet", "-q", action="store_true", help="only the summary line")
    pr = sub.add_parser("produce", help="append lines of stdin (or --file) as records")
    pr.add_argument("data")
    pr.add_argument("db")
    pr.add_argument("--topic", required=True)
    pr.add_argument("--file", help="read lines from this file instead of stdin")
    pr.add_argument("--key", help="record key for every line")
    pr.add_argument("--shard", type=int, help="append to this shard (default: route by key/topic)")
    pr.add_argument("--shards", type=int, default=None, help="shards when the database is created")
    co = sub.add_parser("consume", help="print records of one shard")
    co.add_argument("data")
    co.add_argument("db")
    co.add_argument("--shard", type=int, default=0)
    start = co.add_mutually_exclusive_group()
    start.add_argument("--from", dest="from_offset", type=int, help="first offset (default: the start)")
    start.add_argument("--from-time", help="first record at or after this ISO 8601 time (UTC if naive)")
    co.add_argument("--max", type=int, help="stop after this many records")
    co.add_argument("--group", help="consumer group: start at its committed offset, commit as records print")
    co.add_argument("--format", choices=("json", "raw"), default="json")
    co.add_argument(
        "--follow",
        action="store_true",
        help="keep printing new records as they are written, also while another process owns the store "
        "(read-only; Ctrl-C to stop)",
    )
    s = sub.add_parser("stats", help="databases, shards, offsets, segments and hot/warm/cold bytes")
    s.add_argument("data")
    s.add_argument("--json", action="store_true")
    t = sub.add_parser("tier", help="upload sealed segments of a database to the tier now")
    t.add_argument("data")
    t.add_argument("db")
    t.add_argument("--seal", action="store_true", help="seal the active segments first")
    for cmd in (s, t):
        cmd.add_argument("--tier", help="tier URI: file:///abs/dir or s3://bucket/prefix")
        cmd.add_argument("--s3-endpoint", help="S3 endpoint (credentials from the AWS_* environment)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``seglog`` console script."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "demo":
            return asyncio.run(_demo(args))
        if args.command == "inspect":
            return _inspect(args)
        if args.command == "stats":
            return asyncio.run(_stats(args))
        if args.command == "tier":
            return asyncio.run(_tier(args))
        if args.command == "produce":
            return asyncio.run(_produce(args))
        if args.command == "consume":
            return asyncio.run(_consume(args))
    except (SeglogError, OSError) as exc:
        if args.debug:
            raise
        print(f"seglog: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())

