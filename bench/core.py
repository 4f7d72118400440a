"""Storage-core benchmark: durable appends against same-run raw write+fdatasync baselines, reads.

    python -m bench.core [--quick] [--records-100 N] [--records-1k N] [--lookup-records N]
                         [--out FILE.md] [--dir DIR]

Every append row is ``fsync="always"``, producer batches of 1000 records, each awaited until
durable. Each seglog row is divided by a raw baseline of the *same shape* run just before it:
``os.write`` + ``os.fdatasync`` of the same records, pre-encoded as seglog frames before timing.

* ``1p/1s`` (like for like): 1 producer, 1 shard vs 1 writer, 1 file, one fdatasync per batch,
  so both sides sync the same bytes per fdatasync.
* ``4p/4s topics``: 4 producers, 4 shards, routed by topic (no keys) vs 4 writer threads that
  split each batch by shard exactly as seglog routes it and append each shard's frame to that
  shard's file, one fdatasync per touched file per batch.
* ``4p/16s keys``: every record has a key (10,000 devices), 16 shards, 4 producers; raw as above
  with 16 files.

seglog may merge concurrent producers' batches into one fdatasync per shard (group commit); the
raw threads never do, so in the multi-producer shapes a ratio above 1 means batching, not a
faster disk. ``syncs`` counts the ``os.fdatasync``/``os.fsync`` calls made from Python in the
timed region on both sides (LMDB's own syncs are not seen; the segment engine's index is not
synced per write).

Reads: sequential ``read_arrow`` and ``read`` over the ``4p/4s`` database. Lookups:
``offset_for_time`` and random ``read(shard, offset, 1)`` on one shard of ``--lookup-records``
records, p50/p99. Engines: append (4 producers, 4 shards) and ``read_arrow`` per engine, and
append -> ``tail_arrow`` latency.

The full run writes ``bench/results/core-<date>.md`` and ``.json`` (``--out`` to change);
``--quick`` only prints unless ``--out`` is given.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

import seglog
from bench.compare import _filesystem, _machine
from seglog._routing import routing_hashes
from seglog.record import encode_frame, records_to_batch

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "bench" / "results"
SHARDS = 4
BATCH_RECORDS = 1000
PRODUCERS = 4
KEYED_SHARDS = 16
DEVICES = 10_000
# The keyed shard-count table: 4 producers, a key on every record, S shards.
SCALING_SHARDS = (1, 4, 16, 64, 256, 1024)


@dataclass(frozen=True)
class Shape:
    """How an append row is driven: producers, shards, and whether records carry keys."""

    label: str
    producers: int
    shards: int
    keyed: bool
    raw_desc: str


SHAPES = (
    Shape("1p/1s", 1, 1, False, "1 writer, 1 file, 1 fdatasync per batch"),
    Shape(
        "4p/4s topics",
        PRODUCERS,
        SHARDS,
        False,
        f"{PRODUCERS} writer threads, {SHARDS} files, 1 fdatasync per touched file per batch",
    ),
    Shape(
        "4p/16s keys",
        PRODUCERS,
        KEYED_SHARDS,
        True,
        f"{PRODUCERS} writer threads, {KEYED_SHARDS} files, 1 fdatasync per touched file per batch",
    ),
)


@dataclass
class AppendRow:
    """One measured append row (seglog or its raw baseline)."""

    value_bytes: int
    shape: str
    system: str
    records: int
    seconds: float
    bytes: int
    syncs: int
    ratio_vs_raw: float | None = None

    @property
    def records_s(self) -> float:
        return self.records / self.seconds

    @property
    def mb_s(self) -> float:
        return self.bytes / self.seconds / 1e6

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "records_s": self.records_s,
            "mb_s": self.mb_s,
            "bytes_per_sync": self.bytes / self.syncs if self.syncs else None,
        }


class SyncCounter:
    """Counts ``os.fdatasync``/``os.fsync`` calls from Python (any thread) while entered."""

    def __init__(self) -> None:
        self.calls = 0
        self._lock = threading.Lock()

    def _wrap(self, fn: Callable[[int], None]) -> Callable[[int], None]:
        def counted(fd: int) -> None:
            with self._lock:
                self.calls += 1
            fn(fd)

        return counted

    @contextlib.contextmanager
    def counting(self) -> Iterator[SyncCounter]:
        saved = os.fdatasync, os.fsync
        os.fdatasync, os.fsync = self._wrap(saved[0]), self._wrap(saved[1])
        try:
            yield self
        finally:
            os.fdatasync, os.fsync = saved


def make_batches(
    n: int, value_bytes: int, *, keyed: bool = False, seed: int = 1
) -> list[list[seglog.Record]]:
    """``n`` records of MQTT-style topics (and device keys when ``keyed``) in batches of 1000."""
    rng = random.Random(seed)
    payload = rng.randbytes(value_bytes * 64)
    recs = [
        seglog.Record(
            topic=f"sensors/{i % 100}/{i % 1000}/temp",
            value=payload[(i % 64) * value_bytes : (i % 64 + 1) * value_bytes],
            ts=1_700_000_000_000_000 + i,
            key=f"dev-{(i * 7919) % DEVICES}".encode() if keyed else None,
        )
        for i in range(n)
    ]
    return [recs[i : i + BATCH_RECORDS] for i in range(0, n, BATCH_RECORDS)]


def _frame_bytes(batch: pa.RecordBatch) -> bytes:
    return b"".join(bytes(b) for b in encode_frame(batch, 0).buffers)


def _routes(batch: pa.RecordBatch, shards: int) -> np.ndarray[Any, Any]:
    """seglog's routing (key, else topic) for every row, as in ``Database._routes``."""
    routes = routing_hashes(batch.column(1)) % np.uint64(shards)
    keys = batch.column(2)
    if keys.null_count != len(keys):
        key_routes = routing_hashes(keys) % np.uint64(shards)
        routes = np.where(keys.is_valid().to_numpy(zero_copy_only=False), key_routes, routes)
    return routes.astype(np.int64)


def encode_per_shard(batches: list[list[seglog.Record]], shards: int) -> list[list[tuple[int, bytes]]]:
    """Every batch as ``(shard, frame bytes)`` chunks, split the way seglog routes it."""
    out = []
    for records in batches:
        batch = records_to_batch(records)
        if shards == 1:
            out.append([(0, _frame_bytes(batch))])
            continue
        routes = _routes(batch, shards)
        out.append([(int(s), _frame_bytes(batch.filter(pa.array(routes == s)))) for s in np.unique(routes)])
    return out


def raw_loop(
    directory: Path, batches: list[list[seglog.Record]], shape: Shape, value_bytes: int
) -> AppendRow:
    """The raw baseline of ``shape``: write + fdatasync of pre-encoded frames, no batching."""
    encoded = encode_per_shard(batches, shape.shards)
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / f"raw-{s}.bin" for s in range(shape.shards)]
    fds = [os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644) for p in paths]

    def writer(k: int) -> None:
        for chunks in encoded[k :: shape.producers]:
            for shard, data in chunks:
                os.write(fds[shard], data)
            for shard, _ in chunks:
                os.fdatasync(fds[shard])

    counter = SyncCounter()
    try:
        with counter.counting():
            t0 = time.perf_counter()
            if shape.producers == 1:
                writer(0)
            else:
                threads = [threading.Thread(target=writer, args=(k,)) for k in range(shape.producers)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
            elapsed = time.perf_counter() - t0
    finally:
        for fd in fds:
            os.close(fd)
    for p in paths:
        p.unlink()
    return AppendRow(
        value_bytes,
        shape.label,
        f"raw write+fdatasync ({shape.raw_desc})",
        sum(len(b) for b in batches),
        elapsed,
        sum(len(d) for c in encoded for _, d in c),
        counter.calls,
    )


async def seglog_append(
    directory: Path,
    batches: list[list[seglog.Record]],
    shape: Shape,
    value_bytes: int,
    *,
    arrow: bool,
    keep: bool = False,
) -> AppendRow:
    """``shape.producers`` tasks appending their share of ``batches`` to ``shape.shards`` shards."""
    shutil.rmtree(directory, ignore_errors=True)
    tables = [records_to_batch(b) for b in batches] if arrow else []
    counter = SyncCounter()
    async with seglog.open(directory, fsync="always") as store:
        db = await store.create_db("bench", shards=shape.shards)

        async def produce(k: int) -> None:
            if arrow:
                for t in tables[k :: shape.producers]:
                    await db.append_arrow(t)
            else:
                for b in batches[k :: shape.producers]:
                    await db.append(b)

        with counter.counting():
            t0 = time.perf_counter()
            await asyncio.gather(*(produce(k) for k in range(shape.producers)))
            elapsed = time.perf_counter() - t0
        await db.seal()  # pending rows of many-shard appends into their segments (not timed)
        nbytes = sum(s.bytes for s in db.stats())
    if not keep:
        shutil.rmtree(directory, ignore_errors=True)
    system = "seglog append_arrow" if arrow else "seglog append (Record)"
    return AppendRow(
        value_bytes, shape.label, system, sum(len(b) for b in batches), elapsed, nbytes, counter.calls
    )


async def seglog_reads(directory: Path) -> dict[str, float]:
    async with seglog.open(directory) as store:
        db = await store.open_db("bench")
        out: dict[str, float] = {}
        for name, max_records in (("read_arrow", 100_000), ("read", 10_000), ("read_1000", 1000)):
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


LOOKUP_TS0 = 1_700_000_000_000_000  # µs; databases accept 2000..2200 by default


async def lookups(directory: Path, n: int, samples: int = 2000) -> dict[str, float]:
    """p50/p99 of offset_for_time and random read(shard, offset, 1) on a shard of n records."""
    shutil.rmtree(directory, ignore_errors=True)
    chunk = 200_000
    value = b"x" * 100
    async with seglog.open(directory, fsync="never") as store:
        db = await store.create_db("lookup", shards=1)
        for start in range(0, n, chunk):
            m = min(chunk, n - start)
            await db.append_arrow(
                pa.table(
                    {
                        "ts": pa.array(
                            range(LOOKUP_TS0 + start * 10, LOOKUP_TS0 + (start + m) * 10, 10), pa.int64()
                        ),
                        "topic": pa.array(["sensors/a/b/temp"] * m),
                        "value": pa.array([value] * m, pa.binary()),
                    }
                ),
                shard=0,
            )
    rng = random.Random(3)
    async with seglog.open(directory) as store:
        db = await store.open_db("lookup")
        t_time, t_read = [], []
        for _ in range(samples):
            ts = LOOKUP_TS0 + rng.randrange(0, n * 10)
            t0 = time.perf_counter()
            off = await db.offset_for_time(0, ts)
            t_time.append(time.perf_counter() - t0)
            assert off == (ts - LOOKUP_TS0 + 9) // 10
            o = rng.randrange(0, n)
            t0 = time.perf_counter()
            rec = await db.read(0, o, 1)
            t_read.append(time.perf_counter() - t0)
            assert rec[0].offset == o
    q = lambda xs, p: statistics.quantiles(xs, n=100)[p - 1] * 1000  # noqa: E731
    return {
        "time_p50_ms": q(t_time, 50),
        "time_p99_ms": q(t_time, 99),
        "read1_p50_ms": q(t_read, 50),
        "read1_p99_ms": q(t_read, 99),
    }


async def engine_figures(
    directory: Path, engine: str, batches: list[list[seglog.Record]]
) -> dict[str, float]:
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


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_meta(
    args: argparse.Namespace,
    load_start: float,
    t_start: float,
    *,
    git: str | bool = True,
    skip_args: tuple[str, ...] = ("out", "dir"),
    **extra: Any,
) -> dict[str, Any]:
    """The header every bench result file starts with: date, machine, load, code, runtime, args.

    ``git``: ``True`` for :func:`_git_state`, a string to say it otherwise, ``False`` to leave
    it out; ``extra`` entries (a peer's version, the sides of an A/B) follow it.
    """
    return {
        "date": dt.date.today().isoformat(),
        "mode": "quick" if args.quick else "full",
        "machine": ", ".join(f"{k} {v}" for k, v in _machine().items()),
        "filesystem": _filesystem(Path(args.dir) if args.dir else Path(tempfile.gettempdir())),
        "load": f"1-min load average {load_start:.1f} at start, {os.getloadavg()[0]:.1f} at end",
        **({} if git is False else {"git": _git_state() if git is True else git}),
        **extra,
        "runtime_s": round(time.perf_counter() - t_start, 1),
        "args": {
            k: (str(v) if isinstance(v, Path) else sorted(v) if isinstance(v, set) else v)
            for k, v in vars(args).items()
            if k not in skip_args
        },
    }


def _git_state() -> str:
    """HEAD and whether the working tree had uncommitted changes when the bench ran."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head} (uncommitted changes in {len(dirty.splitlines())} tracked files)" if dirty else head


async def append_rows(base: Path, value_bytes: int, n: int) -> tuple[list[AppendRow], dict[str, float]]:
    """Every shape at one value size: raw baseline, then seglog Record and Arrow appends."""
    rows: list[AppendRow] = []
    reads: dict[str, float] = {}
    for shape in SHAPES:
        batches = make_batches(n, value_bytes, keyed=shape.keyed)
        raw = raw_loop(base / "raw", batches, shape, value_bytes)
        rows.append(raw)
        for arrow in (False, True):
            keep = shape.label == "4p/4s topics" and not arrow
            row = await seglog_append(base / "db", batches, shape, value_bytes, arrow=arrow, keep=keep)
            row.ratio_vs_raw = row.records_s / raw.records_s
            rows.append(row)
            if keep:
                reads = await seglog_reads(base / "db")
                shutil.rmtree(base / "db", ignore_errors=True)
        _log(
            f"  {value_bytes} B {shape.label}: "
            + ", ".join(f"{r.system.split(' (')[0]} {r.records_s:,.0f}/s" for r in rows[-3:])
        )
    return rows, reads


async def scaling_rows(base: Path, n: int, shard_counts: tuple[int, ...]) -> list[AppendRow]:
    """Keyed appends (4 producers) at each shard count against one raw single-file loop of the same run."""
    batches = make_batches(n, 100, keyed=True)
    raw = raw_loop(base / "raw", batches, SHAPES[0], 100)
    raw.shape = "raw"
    rows = [raw]
    for shards in shard_counts:
        shape = Shape(f"4p/{shards}s keys", PRODUCERS, shards, True, "")
        for arrow in (False, True):
            row = await seglog_append(base / "db", batches, shape, 100, arrow=arrow)
            row.ratio_vs_raw = row.records_s / raw.records_s
            rows.append(row)
        _log(
            f"  scaling {shards} shards: " + ", ".join(f"{r.system} {r.records_s:,.0f}/s" for r in rows[-2:])
        )
    return rows


def render_scaling(rows: list[AppendRow]) -> list[str]:
    """The keyed shard-count table."""
    raw = rows[0]
    out = [
        "",
        f"Keyed appends by shard count (4 producers, {BATCH_RECORDS}-record batches of 100 B values, a key on "
        f'every record from {DEVICES:,} devices, fsync="always"); ratio against the raw single-file loop '
        f"(1 writer, os.write + os.fdatasync per {BATCH_RECORDS} records) of the same run: "
        f"{raw.records_s:,.0f} records/s.",
        "",
        "| shards | system | records/s | syncs | records/s ÷ raw |",
        "|---:|---|---:|---:|---:|",
    ]
    for r in rows[1:]:
        shards = r.shape.split("/")[1].split("s")[0]
        out.append(f"| {shards} | {r.system} | {r.records_s:,.0f} | {r.syncs:,} | {r.ratio_vs_raw:.3f} |")
    return out


def render(
    meta: dict[str, Any],
    rows: list[AppendRow],
    reads: dict[int, dict[str, float]],
    lk: dict[str, float],
    engines: list[dict[str, Any]],
    scaling: list[AppendRow],
) -> str:
    """The Markdown report."""
    out = [
        f"# seglog core benchmark, {meta['date']} ({meta['mode']})",
        "",
        f"Machine: {meta['machine']}; data dir filesystem: {meta['filesystem']}; {meta['load']}; "
        f"code: {meta['git']}.",
        "",
        f'Durable append: fsync="always", producer batches of {BATCH_RECORDS} records, each awaited until '
        "durable. Each seglog row's ratio is against the raw row of the same shape above it (same records, "
        "pre-encoded as seglog frames before timing; raw never merges batches). 1p/1s is like for like: the "
        "same bytes per fdatasync on both sides. syncs = os.fdatasync/os.fsync calls from Python in the timed "
        "region; KB/sync = bytes written / syncs.",
        "",
        "| value | shape | system | records/s | MB/s | syncs | KB/sync | records/s ÷ raw (same shape) |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ratio = "" if r.ratio_vs_raw is None else f"{r.ratio_vs_raw:.2f}"
        per_sync = f"{r.bytes / r.syncs / 1000:,.1f}" if r.syncs else "-"
        out.append(
            f"| {r.value_bytes} B | {r.shape} | {r.system} | {r.records_s:,.0f} | {r.mb_s:,.1f} | "
            f"{r.syncs:,} | {per_sync} | {ratio} |"
        )
    out += [
        "",
        "Shapes: 1p/1s = 1 producer, 1 shard; 4p/4s topics = 4 producers, 4 shards, routed by topic; "
        f"4p/16s keys = 4 producers, 16 shards, a key on every record ({DEVICES:,} devices). In the "
        "multi-producer shapes seglog can group-commit several producers' batches into one fdatasync per "
        "shard, which the raw threads do not do: a ratio there mixes batching with per-record cost.",
        *render_scaling(scaling),
        "",
        "Sequential reads of the 4p/4s topics database (served from the page cache; read_arrow takes "
        "100,000 records per call, read 10,000 unless stated):",
        "",
        "| value | reader | records/s |",
        "|---|---|---:|",
        *(
            f"| {v} B | {name} | {r[key]:,.0f} |"
            for v, r in reads.items()
            for name, key in (
                ("seglog read_arrow", "read_arrow"),
                ("seglog read (Record)", "read"),
                ("seglog read (Record), 1,000 per call", "read_1000"),
            )
            if key in r
        ),
        "",
        f"Lookups on a {meta['args']['lookup_records']:,}-record shard: offset_for_time p50 {lk['time_p50_ms']:.3f} ms, "
        f"p99 {lk['time_p99_ms']:.3f} ms; read(shard, offset, 1) p50 {lk['read1_p50_ms']:.3f} ms, "
        f"p99 {lk['read1_p99_ms']:.3f} ms",
        "",
        f"Engines (fsync=always, 100 B values, {meta['args']['records_engines']:,} records, {SHARDS} shards, "
        f"{PRODUCERS} producers; tail latency = append call -> record delivered by db.tail_arrow, steady 50k "
        "records/s, batches every 10 ms)",
        "",
        "| engine | append records/s | read_arrow records/s | tail p50 ms | tail p99 ms |",
        "|---|---:|---:|---:|---:|",
        *(
            f"| {e['engine']} | {e['append']:,.0f} | {e['read_arrow']:,.0f} | {e['tail_p50_ms']:.2f} | "
            f"{e['tail_p99_ms']:.2f} |"
            for e in engines
        ),
        "",
        "One run per row without warm-up; fsync-bound rates vary between runs on a shared VM, so compare "
        "rows within one report.",
    ]
    return "\n".join(out) + "\n"


async def run(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """Run every section; returns the Markdown report and the same results as JSON data."""
    base = Path(tempfile.mkdtemp(prefix="seglog-bench-", dir=args.dir))
    load_start = os.getloadavg()[0]
    t_start = time.perf_counter()
    rows: list[AppendRow] = []
    reads: dict[int, dict[str, float]] = {}
    engines: list[dict[str, Any]] = []
    try:
        for value_bytes, n in ((100, args.records_100), (1024, args.records_1k)):
            got, reads[value_bytes] = await append_rows(base, value_bytes, n)
            rows += got
        scaling = await scaling_rows(base, args.records_scaling, args.scaling_shards)
        _log("  lookups")
        lk = await lookups(base / "lookup", args.lookup_records)
        shutil.rmtree(base / "lookup", ignore_errors=True)
        eng_batches = make_batches(args.records_engines, 100)
        for engine in ("segment", "memory", "lmdb"):
            _log(f"  engine {engine}")
            e = await engine_figures(base / f"eng-{engine}", engine, eng_batches)
            t = await tail_latency(base / f"tail-{engine}", engine, 50_000, args.tail_seconds)
            engines.append({"engine": engine, **e, "tail_p50_ms": t["p50_ms"], "tail_p99_ms": t["p99_ms"]})
    finally:
        shutil.rmtree(base, ignore_errors=True)
    meta = run_meta(args, load_start, t_start)
    data = {
        "meta": meta,
        "shapes": [asdict(s) for s in SHAPES],
        "append": [r.to_json() for r in rows],
        "reads": {str(v): r for v, r in reads.items()},
        "lookups": lk,
        "engines": engines,
        "scaling": [r.to_json() for r in scaling],
    }
    return render(meta, rows, reads, lk, engines, scaling), data


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--quick", action="store_true", help="small sizes (for tests); writes no file without --out"
    )
    p.add_argument("--records-100", type=int, default=500_000)
    p.add_argument("--records-1k", type=int, default=100_000)
    p.add_argument("--lookup-records", type=int, default=5_000_000)
    p.add_argument("--records-engines", type=int, default=200_000)
    p.add_argument("--tail-seconds", type=float, default=3.0)
    p.add_argument("--records-scaling", type=int, default=200_000)
    p.add_argument(
        "--scaling-shards",
        type=lambda v: tuple(int(x) for x in v.split(",")),
        default=SCALING_SHARDS,
        help="comma-separated shard counts of the keyed table",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="Markdown file; JSON goes next to it (default: bench/results/core-<date>.md)",
    )
    p.add_argument("--dir", default=None, help="where to put temporary data (default: system temp)")
    args = p.parse_args(argv)
    if args.quick:
        args.records_100, args.records_1k, args.lookup_records = 20_000, 5_000, 50_000
        args.records_engines, args.tail_seconds = 20_000, 0.5
        args.records_scaling, args.scaling_shards = 10_000, (1, 16, 64)
    text, data = asyncio.run(run(args))
    print(text)
    out = args.out if args.out is not None or args.quick else RESULTS_DIR / f"core-{data['meta']['date']}.md"
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        out.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
        _log(f"wrote {out} and {out.with_suffix('.json')} ({data['meta']['runtime_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
