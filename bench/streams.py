"""Streams: a selective wildcard read through streams vs a filtered full scan; the append cost of stamping.

    python -m bench.streams [--quick] [--records N] [--topics T] [--repeats R] [--out FILE.md] [--dir DIR]
                            [--fleet-only] [--fleet-records N] [--fleet-topics T]

Topics are ``siteNNN/devNNNNN/temp``: 100 sites, ``T / 100`` devices each (``T`` topics in
all; 100,000 by default). The database has 4 shards (records routed by topic) and LTS
thresholds ``[100, 0, 100]`` -- EMQX's documented shape for ``sensor/<clientid>/...``: the
site level keeps up to 100 static values, the device level always varies -- so each site is
one stream per shard and ``site042/#`` (1 % of the records) reads 4 streams.

**Selective read.** ``N`` records (1,000,000 by default) appended in batches of 1000, in two
layouts, each in its own database:

* ``per-site batches``: every append carries one site's records (a gateway per site, or a
  broker batching per publisher group): each frame holds one stream.
* ``interleaved``: every append carries records of random topics of all sites: every frame
  holds every stream, so no frame can be skipped and a stream read saves only the per-row
  filter.

Each is read with ``site042/#`` through ``get_streams`` / ``make_iterator`` / ``next_arrow``
(100,000 rows per call) and by a full scan: ``read_arrow`` of every shard (100,000 rows per
call) filtered with the MQTT filter as a regex (``pyarrow.compute.match_substring_regex``).
Both read the page cache (the data was just written); the row counts must agree. Best of
``R`` runs each.

**Append cost.** 1 producer, ``fsync="always"``, ``--append-records`` records (1,000,000) in
batches of 1000 random topics (every batch: ~1000 distinct topics of the 100,000, the
cache's worst case), ``append`` (Record objects) and ``append_arrow``, one shard; a database
with streams against one with ``lts_thresholds=None`` (the same-run baseline). The same
records go in twice: the first pass meets every topic for the first time (learning), the
second knows them all. Runs alternate between the two databases; the median of ``R``.

**Fleet append (the cache's common case).** A device fleet re-sending its topics: ``append_arrow``
of keyed 1000-record batches (key = device id, routed by key) of ``--fleet-topics`` topics
``fleet/siteNNN/devNNNNN/temp`` (10,000), default thresholds, in three shapes: one producer
into 1 and into 16 shards with ``fsync="never"`` (no disk wait to hide the stamping), and 4
producers into 16 shards with ``fsync="always"`` (what users run). Each run learns the topics (one untimed
pass), then times a pass of ``--fleet-records`` records (300,000) whose topics are all
known; with and without streams alternate in one process, the median of ``R`` runs.
``--fleet-only`` runs just this part. It also times :meth:`StreamStamper.stamp` alone on the
same batches of known topics (µs per 1000-row call, median of ``R`` passes), with the
compiled cache (``seglog.topics._topic_cache``, when built) and the NumPy one.

The report goes to ``bench/results/streams-<date>.md`` (and ``.json``); ``--quick`` only
prints unless ``--out`` is given.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import seglog
from bench.compare import _filesystem, _machine
from seglog._routing import route_rows
from seglog.topics import DEFAULT_LTS_THRESHOLDS, filter_to_regex
from seglog.topics.streams import StreamStamper

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "bench" / "results"
SITES = 100
SHARDS = 4
BATCH = 1000
THRESHOLDS = [100, 0, 100]
READ_SITE = 42
ROWS_PER_CALL = 100_000


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def topic(site: int, dev: int) -> str:
    return f"site{site:03d}/dev{dev:05d}/temp"


def batches(
    layout: str, records: int, devices: int, seed: int = 1
) -> list[tuple[list[str], np.ndarray[Any, Any]]]:
    """``(topics, ts)`` of each 1000-record append of a layout."""
    rng = random.Random(seed)
    out = []
    ts0 = seglog.now_us()
    for b in range(records // BATCH):
        if layout == "per-site":
            site = b % SITES
            topics = [topic(site, rng.randrange(devices)) for _ in range(BATCH)]
        else:
            topics = [topic(rng.randrange(SITES), rng.randrange(devices)) for _ in range(BATCH)]
        out.append((topics, np.arange(ts0 + b * BATCH, ts0 + (b + 1) * BATCH, dtype=np.int64)))
    return out


VALUE = b"x" * 100


async def fill(db: seglog.Database, plan: list[tuple[list[str], np.ndarray[Any, Any]]]) -> None:
    values = pa.array([VALUE] * BATCH, pa.binary())
    for topics, ts in plan:
        await db.append_arrow(pa.table({"ts": ts, "topic": pa.array(topics, pa.string()), "value": values}))


async def read_streams(db: seglog.Database, topic_filter: str) -> tuple[int, float, int]:
    eng: Any = db._engine
    frames_before = eng.stream_frames_read
    t0 = time.perf_counter()
    rows = 0
    for stream in db.get_streams(topic_filter):
        it = db.make_iterator(stream, topic_filter)
        while True:
            it, table = await db.next_arrow(it, ROWS_PER_CALL)
            if not table.num_rows:
                break
            rows += table.num_rows
    return rows, time.perf_counter() - t0, eng.stream_frames_read - frames_before


async def full_scan(db: seglog.Database, topic_filter: str) -> tuple[int, float]:
    regex = filter_to_regex(topic_filter)
    t0 = time.perf_counter()
    rows = 0
    for shard in range(db.shards):
        offset = db.start_offset(shard)
        end = db.end_offset(shard)
        while offset < end:
            table = await db.read_arrow(shard, offset, ROWS_PER_CALL)
            offset += table.num_rows
            picked = table.filter(pc.match_substring_regex(table.column("topic"), regex))
            rows += picked.num_rows
    return rows, time.perf_counter() - t0


def _frames(db: seglog.Database) -> int:
    eng: Any = db._engine
    return sum(
        len(list(s.log.frames_from(s.log.segments_snapshot()[0], 0, s.durable_end))) for s in eng._shards
    )


def read_filter(records: int) -> str:
    """``site042/#``, or a site the per-site layout has when there are fewer than 43 batches."""
    return f"site{READ_SITE % max(1, min(SITES, records // BATCH)):03d}/#"


async def read_rows(base: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    devices = max(1, args.topics // SITES)
    rows = []
    READ_FILTER = read_filter(args.records)
    for layout in ("per-site", "interleaved"):
        directory = base / f"read-{layout}"
        plan = batches(layout, args.records, devices)
        async with seglog.open(directory, fsync="never") as store:
            db = await store.create_db("r", shards=SHARDS, lts_thresholds=THRESHOLDS)
            t0 = time.perf_counter()
            await fill(db, plan)
            _log(f"{layout}: {args.records:,} records appended in {time.perf_counter() - t0:.1f} s")
        async with seglog.open(directory, fsync="never") as store:
            db = await store.open_db("r")
            total_frames = _frames(db)
            streams = db.get_streams(READ_FILTER)
            s_times, f_times = [], []
            s_rows = f_rows = frames_read = 0
            for _ in range(args.repeats):
                s_rows, s_t, frames_read = await read_streams(db, READ_FILTER)
                f_rows, f_t = await full_scan(db, READ_FILTER)
                s_times.append(s_t)
                f_times.append(f_t)
            if s_rows != f_rows:
                raise AssertionError(f"{layout}: streams read {s_rows} rows, the scan {f_rows}")
            row = {
                "layout": layout,
                "records": args.records,
                "topics": devices * SITES,
                "streams_total": len(db.get_streams("#")),
                "streams_read": len(streams),
                "rows": s_rows,
                "share": s_rows / args.records,
                "frames": total_frames,
                "frames_read": frames_read,
                "streams_s": min(s_times),
                "scan_s": min(f_times),
                "speedup": min(f_times) / min(s_times),
            }
            _log(f"  {row}")
            rows.append(row)
    return rows


async def append_once(
    directory: Path, streams: bool, api: str, plan: list[tuple[list[str], Any]]
) -> tuple[float, float]:
    """records/s of two passes over the same plan: the first learns the topics, the second knows them."""
    shutil.rmtree(directory, ignore_errors=True)
    rates = []
    async with seglog.open(directory, fsync="always") as store:
        db = await store.create_db("a", lts_thresholds=THRESHOLDS if streams else None)
        values = pa.array([VALUE] * BATCH, pa.binary())
        for _ in range(2):
            if api == "append":
                work: list[Any] = [
                    [seglog.Record(t, VALUE, ts=int(x)) for t, x in zip(topics, ts.tolist(), strict=True)]
                    for topics, ts in plan
                ]
            else:
                work = [
                    pa.table({"ts": ts, "topic": pa.array(topics), "value": values}) for topics, ts in plan
                ]
            t0 = time.perf_counter()
            for item in work:
                if api == "append":
                    await db.append(item)
                else:
                    await db.append_arrow(item)
            rates.append(len(plan) * BATCH / (time.perf_counter() - t0))
    shutil.rmtree(directory, ignore_errors=True)
    return rates[0], rates[1]


async def append_rows(base: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    devices = max(1, args.topics // SITES)
    plan = batches("interleaved", args.append_records, devices, seed=2)
    out = []
    for api in ("append", "append_arrow"):
        runs: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for _ in range(args.repeats):
            for streams in (False, True):  # alternating: drifts of the shared VM hit both sides
                runs[streams].append(await append_once(base / "append", streams, api, plan))
        for phase, label in ((0, "first pass: learns the topics"), (1, "second pass: topics known")):
            without = statistics.median(r[phase] for r in runs[False])
            with_ = statistics.median(r[phase] for r in runs[True])
            row = {
                "api": api,
                "phase": label,
                "records": len(plan) * BATCH,
                "distinct_topics": len({t for topics, _ in plan for t in topics}),
                "without_streams": without,
                "with_streams": with_,
                "ratio": with_ / without,
                "runs_without": [r[phase] for r in runs[False]],
                "runs_with": [r[phase] for r in runs[True]],
            }
            _log(f"  {row}")
            out.append(row)
    return out


def fleet_plan(records: int, topics: int, seed: int = 3) -> list[pa.Table]:
    """Keyed 1000-record ``append_arrow`` tables of random devices of a fleet."""
    rng = np.random.default_rng(seed)
    names = np.array([f"fleet/site{i % 100:03d}/dev{i:05d}/temp" for i in range(topics)], object)
    keys = np.array([f"dev{i:05d}".encode() for i in range(topics)], object)
    values = pa.array([VALUE] * BATCH, pa.binary())
    ts0 = seglog.now_us()
    out = []
    for b in range(max(1, records // BATCH)):
        devices = rng.integers(0, topics, BATCH)
        out.append(
            pa.table(
                {
                    "ts": np.arange(ts0 + b * BATCH, ts0 + (b + 1) * BATCH, dtype=np.int64),
                    "topic": pa.array(names[devices].tolist(), pa.string()),
                    "key": pa.array(keys[devices].tolist(), pa.binary()),
                    "value": values,
                }
            )
        )
    return out


# Fleet shapes: (shards, producers, fsync). One producer with fsync="never" leaves nothing to
# hide the stamping behind; 4 producers into 16 shards with fsync="always" is what users run.
FLEET_SHAPES: Final = ((1, 1, "never"), (16, 1, "never"), (16, 4, "always"))


async def fleet_once(
    directory: Path,
    streams: bool,
    shards: int,
    plan: list[pa.Table],
    producers: int = 1,
    fsync: str = "never",
) -> tuple[float, float, float]:
    """Records per second, per CPU second (the process's, all threads) and the event loop's CPU
    µs per append, of a pass whose topics are all known (after an untimed learning pass).

    On a shared machine the CPU figures are the steadier ones; the loop's is where stamping
    runs, apart from the I/O thread's kernel time for writes and syncs, which swings by 3x
    between runs of one shape with ``fsync="always"``. ``producers`` tasks append every
    ``producers``-th table each, concurrently.
    """
    shutil.rmtree(directory, ignore_errors=True)
    async with seglog.open(directory, fsync=fsync) as store:  # type: ignore[arg-type]
        db = await store.create_db(
            "f", shards=shards, lts_thresholds=seglog.topics.DEFAULT_LTS_THRESHOLDS if streams else None
        )

        async def produce(tables: list[pa.Table]) -> None:
            for table in tables:
                await db.append_arrow(table)

        parts = [plan[i::producers] for i in range(producers)]
        await asyncio.gather(*(produce(part) for part in parts))
        t0, c0, l0 = time.perf_counter(), time.process_time(), time.thread_time()
        await asyncio.gather(*(produce(part) for part in parts))
        wall, cpu, loop = time.perf_counter() - t0, time.process_time() - c0, time.thread_time() - l0
    shutil.rmtree(directory, ignore_errors=True)
    return len(plan) * BATCH / wall, len(plan) * BATCH / cpu, loop * 1e6 / len(plan)


async def fleet_rows(base: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    plan = fleet_plan(args.fleet_records, args.fleet_topics)
    out = []
    for shards, producers, fsync in FLEET_SHAPES:
        runs: dict[bool, list[tuple[float, float, float]]] = {True: [], False: []}
        for _ in range(args.repeats):
            for streams in (False, True):
                runs[streams].append(
                    await fleet_once(base / "fleet", streams, shards, plan, producers, fsync)
                )
        without = statistics.median(r[0] for r in runs[False])
        with_ = statistics.median(r[0] for r in runs[True])
        cpu_without = statistics.median(r[1] for r in runs[False])
        cpu_with = statistics.median(r[1] for r in runs[True])
        row = {
            "shards": shards,
            "producers": producers,
            "fsync": fsync,
            "records": len(plan) * BATCH,
            "topics": args.fleet_topics,
            "without_streams": without,
            "with_streams": with_,
            "ratio": with_ / without,
            "cpu_without_streams": cpu_without,
            "cpu_with_streams": cpu_with,
            "cpu_ratio": cpu_with / cpu_without,
            # each pair ran back to back: the median of their ratios drifts less with the load
            "pair_ratio": statistics.median(
                w[0] / wo[0] for w, wo in zip(runs[True], runs[False], strict=True)
            ),
            "loop_us_without": statistics.median(r[2] for r in runs[False]),
            "loop_us_with": statistics.median(r[2] for r in runs[True]),
            "runs_without": runs[False],
            "runs_with": runs[True],
        }
        _log(f"  {row}")
        out.append(row)
    return out


def _stamp_pass(stamper: StreamStamper, batches: list[tuple[pa.Array, Any, Any]], ends: Any) -> list[float]:
    """One stamp of every batch, offsets numbered on from ``ends``: µs per 1000 rows each."""
    times = []
    for topics, routes, rank in batches:
        if isinstance(routes, int):
            offsets: Any = int(ends[0])
            ends[0] += len(topics)
        else:
            offsets = ends[routes] + rank
            ends[:] += np.bincount(routes, minlength=len(ends))
        t0 = time.perf_counter()
        stamper.stamp(topics, routes, offsets)
        times.append((time.perf_counter() - t0) * 1e6 * BATCH / len(topics))
    return times


def stamp_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """µs per 1000-row :meth:`StreamStamper.stamp` of known fleet topics, outside the append path."""
    plan = fleet_plan(args.fleet_records, args.fleet_topics)
    caches = [True, False] if StreamStamper(1, DEFAULT_LTS_THRESHOLDS).native else [False]
    out = []
    for shards in (1, 16):
        for native in caches:
            stamper = StreamStamper(shards, DEFAULT_LTS_THRESHOLDS, native=native)
            ends = np.zeros(shards, np.int64)
            batches: list[tuple[pa.Array, Any, Any]] = []
            for table in plan:
                topics = table.column("topic").combine_chunks()
                if shards == 1:
                    batches.append((topics, 0, 0))
                    continue
                # Routed by key as the database routes, each shard's rows numbered on.
                routes = route_rows(topics, table.column("key").combine_chunks(), shards)
                counts = np.bincount(routes, minlength=shards)
                order = np.argsort(routes, kind="stable")
                rank = np.empty(len(routes), np.int64)
                rank[order] = np.arange(len(routes)) - np.repeat(np.cumsum(counts) - counts, counts)
                batches.append((topics, routes, rank))

            _stamp_pass(stamper, batches, ends)  # learns every topic
            passes = [statistics.median(_stamp_pass(stamper, batches, ends)) for _ in range(args.repeats)]
            row = {
                "shards": shards,
                "cache": "compiled" if native else "numpy",
                "us_per_1000": statistics.median(passes),
                "passes": passes,
            }
            _log(f"  {row}")
            out.append(row)
    return out


def render_fleet(meta: dict[str, Any], fleet: list[dict[str, Any]]) -> list[str]:
    lines = [
        "",
        f"Fleet append: `append_arrow` of keyed 1000-record batches (routed by key) of {meta['fleet_topics']:,} "
        "device topics, all known (after an untimed learning pass), default thresholds, "
        f"{meta['stamp_cache']} topic cache. "
        f"Median of {meta['repeats']} alternating runs each; records per second of wall time and per "
        "CPU second of the process (all threads; steadier on a shared machine); the median of the "
        "pairs' own ratios (each pair ran back to back); the event loop's CPU µs per 1000-record "
        "append (where stamping runs).",
        "",
        "| shards | producers | fsync | records | records/s without streams | with streams | with ÷ without "
        "| per CPU s without | with | with ÷ without (CPU) | median pair ratio | loop µs/append without "
        "| with |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in fleet:
        lines.append(
            f"| {r['shards']} | {r['producers']} | {r['fsync']} | {r['records']:,} "
            f"| {r['without_streams']:,.0f} | {r['with_streams']:,.0f} "
            f"| **{r['ratio']:.2f}** | {r['cpu_without_streams']:,.0f} | {r['cpu_with_streams']:,.0f} "
            f"| **{r['cpu_ratio']:.2f}** | **{r['pair_ratio']:.2f}** | {r['loop_us_without']:.0f} "
            f"| {r['loop_us_with']:.0f} |"
        )
    lines.append("")
    return lines


def render(
    meta: dict[str, Any],
    reads: list[dict[str, Any]],
    appends: list[dict[str, Any]],
    fleet: list[dict[str, Any]],
    stamps: list[dict[str, Any]],
) -> str:
    lines = [
        f"# seglog streams benchmark, {meta['date']}{' (quick)' if meta['quick'] else ''}",
        "",
        f"Machine: {meta['machine']}; data dir filesystem: {meta['filesystem']}; {meta['load']}.",
    ]
    if reads:
        lines += [
            "",
            f"Topics `siteNNN/devNNNNN/temp` ({meta['topics']:,}: {SITES} sites), {SHARDS} shards routed by topic, "
            f"LTS thresholds {THRESHOLDS}; read `{meta['filter']}` (1 % of the records). Streams: "
            f"`get_streams` + `next_arrow` ({ROWS_PER_CALL:,} rows per call); scan: `read_arrow` of every shard "
            "+ the filter as a regex. Page cache, best of "
            f"{meta['repeats']}.",
            "",
            "| layout | records | frames | streams read | rows | frames read via streams | streams s "
            "| full scan s | speedup |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in reads:
            lines.append(
                f"| {r['layout']} | {r['records']:,} | {r['frames']:,} | {r['streams_read']} of {r['streams_total']} "
                f"| {r['rows']:,} ({r['share']:.1%}) | {r['frames_read']:,} | {r['streams_s']:.4f} "
                f"| {r['scan_s']:.3f} | **{r['speedup']:.1f}x** |"
            )
    if appends:
        lines += [
            "",
            f'Append: 1 producer, fsync="always", 1000-record batches of random topics of the {meta["topics"]:,} '
            "(100 B values; every batch ~1000 distinct topics), one shard; the same records twice into one "
            "database: the first pass meets each topic for the first time, the second knows them all. "
            f"Median of {meta['repeats']} alternating runs each.",
            "",
            "| api | pass | records (distinct topics) | records/s without streams | records/s with streams "
            "| with ÷ without |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for r in appends:
            lines.append(
                f"| {r['api']} | {r['phase']} | {r['records']:,} ({r['distinct_topics']:,}) "
                f"| {r['without_streams']:,.0f} | {r['with_streams']:,.0f} | **{r['ratio']:.2f}** |"
            )
    if fleet:
        lines += render_fleet(meta, fleet)
    if stamps:
        lines += [
            "`StreamStamper.stamp` alone on the same batches (topics known), µs per 1000-row call, "
            f"median of {meta['repeats']} passes (the compiled cache when built, and the NumPy one):",
            "",
            "| shards | cache | µs per 1000 rows |",
            "|---:|---|---:|",
        ]
        lines += [f"| {r['shards']} | {r['cache']} | {r['us_per_1000']:.1f} |" for r in stamps]
    lines.append("")
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    load_start = os.getloadavg()[0]
    base = Path(tempfile.mkdtemp(prefix="seglog-bench-streams-", dir=args.dir))
    try:
        reads = [] if args.fleet_only else await read_rows(base, args)
        appends = [] if args.fleet_only else await append_rows(base, args)
        fleet = await fleet_rows(base, args)
        stamps = stamp_rows(args)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    meta = {
        "date": dt.date.today().isoformat(),
        "quick": args.quick,
        "machine": ", ".join(f"{k} {v}" for k, v in _machine().items()),
        "filesystem": _filesystem(Path(args.dir) if args.dir else Path(tempfile.gettempdir())),
        "load": f"1-min load average {load_start:.1f} at start, {os.getloadavg()[0]:.1f} at end",
        "topics": max(1, args.topics // SITES) * SITES,
        "filter": read_filter(args.records),
        "repeats": args.repeats,
        "fleet_topics": args.fleet_topics,
        "stamp_cache": "compiled" if StreamStamper(1, DEFAULT_LTS_THRESHOLDS).native else "numpy",
        "args": {k: v for k, v in vars(args).items() if k != "out"},
    }
    report = render(meta, reads, appends, fleet, stamps)
    return report, {"meta": meta, "reads": reads, "appends": appends, "fleet": fleet, "stamps": stamps}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes; print only (unless --out)")
    p.add_argument("--records", type=int, default=None, help="records per read layout (1,000,000)")
    p.add_argument("--append-records", type=int, default=None, help="records per append pass (1,000,000)")
    p.add_argument("--topics", type=int, default=None, help="distinct topics (100,000)")
    p.add_argument("--repeats", type=int, default=None, help="runs per figure (3)")
    p.add_argument("--fleet-records", type=int, default=None, help="records per fleet append pass (300,000)")
    p.add_argument(
        "--fleet-topics", type=int, default=10_000, help="device topics of the fleet append (10,000)"
    )
    p.add_argument("--fleet-only", action="store_true", help="only the fleet append A/B")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--dir", default=None, help="where to put temporary data (default: system temp)")
    args = p.parse_args(argv)
    quick = args.quick
    args.records = args.records or (100_000 if quick else 1_000_000)
    args.append_records = args.append_records or (50_000 if quick else 1_000_000)
    args.topics = args.topics or (10_000 if quick else 100_000)
    args.fleet_records = args.fleet_records or (20_000 if quick else 300_000)
    args.repeats = args.repeats or (1 if quick else 3)
    report, data = asyncio.run(run(args))
    print(report)
    out = args.out
    if out is None and not quick:
        out = RESULTS_DIR / f"streams-{data['meta']['date']}.md"
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(report)
        out.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")
        _log(f"wrote {out} and {out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
