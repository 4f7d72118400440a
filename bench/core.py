"""Storage-core benchmark: durable append and reads vs a raw write+fdatasync loop, same run.

    python -m bench.core [--quick] [--records-100 N] [--records-1k N] [--lookup-records N]

Append: fsync="always", batches of 1000, 4 shards, 4 concurrent producers; the raw loop
writes the same encoded frame bytes (one os.write + os.fdatasync per batch) to one file.
Reads: sequential ``read_arrow`` and ``read`` over everything written. Lookups:
``offset_for_time`` and random ``read(shard, offset, 1)`` on one shard of
``--lookup-records`` records, p50/p99.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

import seglog
from seglog.record import encode_frame, records_to_batch

SHARDS = 4
BATCH_RECORDS = 1000
PRODUCERS = 4


def make_batches(n: int, value_bytes: int, seed: int = 1) -> list[list[seglog.Record]]:
    rng = random.Random(seed)
    payload = rng.randbytes(value_bytes * 64)
    recs = [
        seglog.Record(
            topic=f"sensors/{i % 100}/{i % 1000}/temp",
            value=payload[(i % 64) * value_bytes : (i % 64 + 1) * value_bytes],
            ts=1_700_000_000_000_000 + i,
        )
        for i in range(n)
    ]
    return [recs[i : i + BATCH_RECORDS] for i in range(0, n, BATCH_RECORDS)]


def raw_loop(directory: Path, batches: list[list[seglog.Record]]) -> dict[str, float]:
    """os.write + os.fdatasync per batch of pre-encoded frames (the physical limit here)."""
    encoded = [b"".join(bytes(b) for b in encode_frame(records_to_batch(batch), 0).buffers) for batch in batches]
    path = directory / "raw.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    t0 = time.perf_counter()
    for chunk in encoded:
        os.write(fd, chunk)
        os.fdatasync(fd)
    elapsed = time.perf_counter() - t0
    os.close(fd)
    n = sum(len(b) for b in batches)
    nbytes = sum(len(c) for c in encoded)
    path.unlink()
    return {"records_s": n / elapsed, "mb_s": nbytes / elapsed / 1e6, "bytes": nbytes}


async def seglog_append(directory: Path, batches: list[list[seglog.Record]], *, arrow: bool) -> dict[str, float]:
    shutil.rmtree(directory, ignore_errors=True)
    tables = [records_to_batch(b) for b in batches] if arrow else []
    async with seglog.open(directory, fsync="always") as store:
        db = await store.create_db("bench", shards=SHARDS)

        async def produce(k: int) -> None:
            if arrow:
                for t in tables[k::PRODUCERS]:
                    await db.append_arrow(t)
            else:
                for b in batches[k::PRODUCERS]:
                    await db.append(b)

        t0 = time.perf_counter()
        await asyncio.gather(*(produce(k) for k in range(PRODUCERS)))
        elapsed = time.perf_counter() - t0
        nbytes = sum(s.bytes for s in db.stats())
    n = sum(len(b) for b in batches)
    return {"records_s": n / elapsed, "mb_s": nbytes / elapsed / 1e6}


async def seglog_reads(directory: Path) -> dict[str, float]:
    async with seglog.open(directory) as store:
        db = await store.open_db("bench")
        out: dict[str, float] = {}
        for name, max_records in (("read_arrow", 100_000), ("read", 10_000)):
            t0 = time.perf_counter()
            total = 0
            for shard in range(db.shards):
                offset = 0
                while True:
                    if name == "read_arrow":
                        got = (await db.read_arrow(shard, offset, max_records)).num_rows
                    else:
                        got = len(await db.read(shard, offset, max_records))
                    if not got:
                        break
                    total += got
                    offset += got
            out[name] = total / (time.perf_counter() - t0)
    return out


async def lookups(directory: Path, n: int, samples: int = 2000) -> dict[str, float]:
    """p50/p99 of offset_for_time and random read(shard, offset, 1) on a shard of n records."""
    shutil.rmtree(directory, ignore_errors=True)
    chunk = 200_000
    value = b"x" * 100
    async with seglog.open(directory, fsync="never") as store:
        db = await store.create_db("lookup", shards=1)
        for start in range(0, n, chunk):
            m = min(chunk, n - start)
            await db.append_arrow(pa.table({
                "ts": pa.array(range(start * 10, (start + m) * 10, 10), pa.int64()),
                "topic": pa.array(["sensors/a/b/temp"] * m),
                "value": pa.array([value] * m, pa.binary()),
            }), shard=0)
    rng = random.Random(3)
    async with seglog.open(directory) as store:
        db = await store.open_db("lookup")
        t_time, t_read = [], []
        for _ in range(samples):
            ts = rng.randrange(0, n * 10)
            t0 = time.perf_counter()
            off = await db.offset_for_time(0, ts)
            t_time.append(time.perf_counter() - t0)
            assert off == (ts + 9) // 10
            o = rng.randrange(0, n)
            t0 = time.perf_counter()
            rec = await db.read(0, o, 1)
            t_read.append(time.perf_counter() - t0)
            assert rec[0].offset == o
    q = lambda xs, p: statistics.quantiles(xs, n=100)[p - 1] * 1000  # noqa: E731
    return {"time_p50_ms": q(t_time, 50), "time_p99_ms": q(t_time, 99), "read1_p50_ms": q(t_read, 50), "read1_p99_ms": q(t_read, 99)}


async def engine_figures(directory: Path, engine: str, batches: list[list[seglog.Record]]) -> dict[str, float]:
    """Durable append (Records, 4 producers) and read_arrow throughput on one engine."""
    shutil.rmtree(directory, ignore_errors=True)
    n = sum(len(b) for b in batches)
    async with seglog.open(directory, fsync="always") as store:
        db = await store.create_db("e", shards=SHARDS, engine=engine)

        async def produce(k: int) -> None:
            for b in batches[k::PRODUCERS]:
                await db.append(b)

        t0 = time.perf_counter()
        await asyncio.gather(*(produce(k) for k in range(PRODUCERS)))
        append_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        total = 0
        for shard in range(SHARDS):
            offset = 0
            while True:
                got = (await db.read_arrow(shard, offset, 100_000)).num_rows
                if not got:
                    break
                total += got
                offset += got
        read_s = time.perf_counter() - t0
        assert total == n
    shutil.rmtree(directory, ignore_errors=True)
    return {"append": n / append_s, "read_arrow": n / read_s}


async def tail_latency(directory: Path, engine: str, rate_rps: int, seconds: float) -> dict[str, float]:
    """Append -> delivered-to-tail latency at a steady rate (batches every 10 ms)."""
    shutil.rmtree(directory, ignore_errors=True)
    tick_s = 0.01
    per_tick = max(1, int(rate_rps * tick_s))
    ticks = int(seconds / tick_s)
    sent_at: dict[int, float] = {}
    lat: list[float] = []
    async with seglog.open(directory, fsync="always") as store:
        db = await store.create_db("tail", shards=1, engine=engine)
        done = asyncio.Event()

        async def consume() -> None:
            async for table in db.tail_arrow(0, 0, max_records=10_000):
                now = time.perf_counter()
                for off in table.column("offset").to_pylist():
                    lat.append(now - sent_at[off])
                if len(lat) >= per_tick * ticks:
                    done.set()
                    return

        consumer = asyncio.create_task(consume())
        loop = asyncio.get_running_loop()
        start = loop.time()
        next_offset = 0
        appends: list[asyncio.Task[Any]] = []
        for i in range(ticks):
            # Pacing the producer on a schedule is the workload, not synchronisation.
            await asyncio.sleep(max(0.0, start + i * tick_s - loop.time()))
            batch = [seglog.Record(topic="t/a", value=b"x" * 100) for _ in range(per_tick)]
            t = time.perf_counter()
            for j in range(per_tick):
                sent_at[next_offset + j] = t
            next_offset += per_tick
            appends.append(loop.create_task(db.append(batch)))
        await asyncio.wait_for(done.wait(), timeout=60)
        await asyncio.gather(*appends)
        await consumer
    shutil.rmtree(directory, ignore_errors=True)
    q = statistics.quantiles(lat, n=100)
    return {"p50_ms": q[49] * 1000, "p99_ms": q[98] * 1000, "rate": len(lat) / seconds}


async def run(args: argparse.Namespace) -> str:
    base = Path(tempfile.mkdtemp(prefix="seglog-bench-", dir=args.dir))
    rows: list[str] = []
    try:
        for value_bytes, n in ((100, args.records_100), (1024, args.records_1k)):
            batches = make_batches(n, value_bytes)
            raw = raw_loop(base, batches)
            rec = await seglog_append(base / "rec", batches, arrow=False)
            reads = await seglog_reads(base / "rec")
            arr = await seglog_append(base / "arrow", batches, arrow=True)
            shutil.rmtree(base / "arrow", ignore_errors=True)
            for name, r in (("raw write+fdatasync", raw), ("seglog append (Record)", rec), ("seglog append_arrow", arr)):
                rows.append(
                    f"| {value_bytes} B | {name} | {r['records_s']:,.0f} | {r['mb_s']:,.1f} | "
                    f"{r['records_s'] / raw['records_s']:.2f} | {r['mb_s'] / raw['mb_s']:.2f} |"
                )
            rows.append(f"| {value_bytes} B | seglog read_arrow | {reads['read_arrow']:,.0f} | | | |")
            rows.append(f"| {value_bytes} B | seglog read (Record) | {reads['read']:,.0f} | | | |")
            shutil.rmtree(base / "rec", ignore_errors=True)
        lk = await lookups(base / "lookup", args.lookup_records)
        engine_rows = []
        eng_batches = make_batches(args.records_engines, 100)
        for engine in ("segment", "memory", "lmdb"):
            e = await engine_figures(base / f"eng-{engine}", engine, eng_batches)
            t = await tail_latency(base / f"tail-{engine}", engine, 50_000, args.tail_seconds)
            engine_rows.append(
                f"| {engine} | {e['append']:,.0f} | {e['read_arrow']:,.0f} | {t['p50_ms']:.2f} | {t['p99_ms']:.2f} |"
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    table = "\n".join([
        f"Durable append (fsync=always, batches of {BATCH_RECORDS}, {SHARDS} shards, {PRODUCERS} producers) and reads",
        "",
        "| value | system | records/s | MB/s | records/s ÷ raw | MB/s ÷ raw |",
        "|---|---|---:|---:|---:|---:|",
        *rows,
        "",
        f"Lookups on a {args.lookup_records:,}-record shard: offset_for_time p50 {lk['time_p50_ms']:.3f} ms, "
        f"p99 {lk['time_p99_ms']:.3f} ms; read(shard, offset, 1) p50 {lk['read1_p50_ms']:.3f} ms, "
        f"p99 {lk['read1_p99_ms']:.3f} ms",
        "",
        f"Engines (fsync=always, 100 B values, {args.records_engines:,} records, {SHARDS} shards; tail latency = "
        "append call -> record delivered by db.tail_arrow, steady 50k records/s, batches every 10 ms)",
        "",
        "| engine | append records/s | read_arrow records/s | tail p50 ms | tail p99 ms |",
        "|---|---:|---:|---:|---:|",
        *engine_rows,
    ])
    return table


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="small sizes (for tests)")
    p.add_argument("--records-100", type=int, default=1_000_000)
    p.add_argument("--records-1k", type=int, default=300_000)
    p.add_argument("--lookup-records", type=int, default=10_000_000)
    p.add_argument("--records-engines", type=int, default=400_000)
    p.add_argument("--tail-seconds", type=float, default=5.0)
    p.add_argument("--dir", default=None, help="where to put temporary data (default: system temp)")
    args = p.parse_args()
    if args.quick:
        args.records_100, args.records_1k, args.lookup_records = 20_000, 5_000, 50_000
        args.records_engines, args.tail_seconds = 20_000, 0.5
    print(asyncio.run(run(args)))


if __name__ == "__main__":
    main()

