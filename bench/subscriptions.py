"""Subscriptions: many subscribers on a few streams, one read per stream and append.

    python -m bench.subscriptions [--quick] [--subscribers N] [--streams S] [--rate R]
        [--seconds D] [--batch B] [--sites-per-batch K] [--per-task T ...] [--out FILE.md] [--dir DIR]

One shard, LTS thresholds ``[100, 0, 100]``: topics ``siteNNN/devNNNN/temp`` make one stream
per site (``siteNNN/+/temp``). ``S`` sites (100), ``N`` subscribers (10,000) spread evenly
over them, each at the head of its stream (``max_unacked=1000``, a suback per batch). Each
``--per-task`` value is one run: ``1`` is a task per subscriber (``async for batch in sub``),
``T > 1`` gives each consumer task a ``SubscriptionSelector`` of ``T`` subscribers (one
``poll()`` returns every batch queued for them; default runs: 1 and 1000). A producer
appends ``R`` records/s (50,000) in batches of ``B`` (500) for ``D`` seconds (10), each batch
holding the records of ``K`` random sites (5): every append touches ``K`` streams. The
batches are built as Arrow tables before the clock starts and appended with
``append_arrow`` (stamped and written as any append); ``fsync="never"``: the figure is the
subscriptions' cost, not the disk's nor the producer's record building.

Reported: shared and catch-up reads per append against the streams the append touched (a
subscribed stream the append missed skips its read), and the delivery latency of every
record to every subscriber, from the call of the ``append`` that carried it (p50, p99, max;
each record of a batch counts with the latency of the batch's oldest). Every subscriber must
get exactly its stream's records; the run fails otherwise.

The report goes to ``bench/results/subscriptions-<date>.md`` (and ``.json``); ``--quick``
only prints unless ``--out`` is given.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import seglog
from bench.compare import _filesystem, _machine
from seglog.record import records_to_batch


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


async def head(db: seglog.Database, site: int) -> seglog.Iterator:
    topic_filter = f"site{site:03d}/+/temp"
    (stream,) = db.get_streams(topic_filter)
    it = db.make_iterator(stream, topic_filter)
    while True:
        it, table = await db.next_arrow(it, 100_000)
        if not table.num_rows:
            return it


async def run(args: argparse.Namespace, base: Path, per_task: int) -> dict[str, Any]:
    rng = random.Random(42)
    async with seglog.open(base / "data", fsync="never") as store:
        db = await store.create_db("subs", lts_thresholds=[100, 0, 100])
        await db.append([seglog.Record(f"site{s:03d}/dev0000/temp", b"-") for s in range(args.streams)])
        heads = [await head(db, s) for s in range(args.streams)]
        issued: list[float] = []  # append index -> when it was called
        # Per batch: the latency of its oldest record (an upper bound for the others) and
        # how many records it had, so percentiles are over records.
        latencies: list[float] = []
        weights: list[int] = []
        got = [0] * args.subscribers

        last: list[Any] = [None, 0.0]  # the last table seen and its append's time

        def issued_at(table: Any) -> float:
            # Members of a stream's shared read get the same table: decode its first key
            # (the append's index) once, not once per subscriber.
            if table is not last[0]:
                last[0], last[1] = table, issued[int(table.column("key")[0].as_py())]
            return float(last[1])

        async def consume(i: int, sub: seglog.Subscription) -> None:
            async for batch in sub:
                now = time.perf_counter()
                latencies.append(now - issued_at(batch.table))
                weights.append(len(batch))
                got[i] += len(batch)
                sub.suback(batch.seqno)

        async def consume_many(first: int, selector: seglog.SubscriptionSelector) -> None:
            index = {sub: first + k for k, sub in enumerate(subs[first : first + per_task])}
            while batches := await selector.poll():
                for sub, batch in batches:
                    if batch is None:
                        continue
                    now = time.perf_counter()
                    latencies.append(now - issued_at(batch.table))
                    weights.append(len(batch))
                    got[index[sub]] += len(batch)
                    sub.suback(batch.seqno)

        subs = [db.subscribe(heads[i % args.streams], max_unacked=1000) for i in range(args.subscribers)]
        selectors = []
        if per_task == 1:
            tasks = [asyncio.create_task(consume(i, s)) for i, s in enumerate(subs)]
        else:
            selectors = [
                seglog.SubscriptionSelector(subs[k : k + per_task]) for k in range(0, len(subs), per_task)
            ]
            tasks = [asyncio.create_task(consume_many(k * per_task, sel)) for k, sel in enumerate(selectors)]
        per_site = [0] * args.streams
        touched = 0
        appends = int(args.rate * args.seconds / args.batch)
        interval = args.batch / args.rate
        # The producer's batches are built before the clock starts (a producer elsewhere
        # would build them in its own process): the loop's time goes to the subscriptions.
        tables = []
        for a in range(appends):
            sites = rng.sample(range(args.streams), args.sites_per_batch)
            touched += len(sites)
            key = b"%d" % a
            recs = [
                seglog.Record(f"site{sites[j % len(sites)]:03d}/dev{j:04d}/temp", b"x" * 64, key=key)
                for j in range(args.batch)
            ]
            for j in range(args.batch):
                per_site[sites[j % len(sites)]] += 1
            tables.append(records_to_batch(recs))
        before = db.subscription_stats()
        start = time.perf_counter()
        cpu0 = time.thread_time()  # the event loop's thread: subscriptions, appends, consumers
        late = 0
        for a in range(appends):
            due = start + a * interval
            wait = due - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)  # pacing the producer, not synchronising anything
            else:
                late += 1
            issued.append(time.perf_counter())
            await db.append_arrow(tables[a])
        produced = time.perf_counter() - start
        want = [per_site[i % args.streams] for i in range(args.subscribers)]
        deadline = time.perf_counter() + 120
        while got != want and time.perf_counter() < deadline:
            await asyncio.sleep(0.05)  # the bench waits for the stragglers; tests use events
        drained = time.perf_counter() - start
        loop_cpu = time.thread_time() - cpu0
        after = db.subscription_stats()
        for sub in subs:
            await sub.close()
        for sel in selectors:
            sel.close()
        await asyncio.gather(*tasks)
        if got != want:
            missing = sum(w - g for g, w in zip(got, want, strict=True))
            raise SystemExit(f"subscribers did not get every record: {missing} missing")
        lat_s = np.array(latencies)
        order = np.argsort(lat_s)
        cum = np.cumsum(np.array(weights)[order])

        def pct(q: float) -> float:
            return float(lat_s[order][np.searchsorted(cum, q / 100 * cum[-1])]) * 1e3

        shared = after.shared_reads - before.shared_reads
        catchup = after.catchup_reads - before.catchup_reads
        return {
            "subscribers": args.subscribers,
            "per_task": per_task,
            "streams": args.streams,
            "rate": args.rate,
            "batch": args.batch,
            "appends": appends,
            "late_appends": late,
            "records": appends * args.batch,
            "produce_s": round(produced, 2),
            "drain_s": round(drained, 2),
            "loop_cpu_s": round(loop_cpu, 2),
            "deliveries": int(sum(got)),
            "shared_reads": shared,
            "catchup_reads": catchup,
            "reads_per_append": round((shared + catchup) / appends, 2),
            "streams_touched_per_append": round(touched / appends, 2),
            "p50_ms": round(pct(50), 1),
            "p99_ms": round(pct(99), 1),
            "max_ms": round(float(lat_s.max()) * 1e3, 1),
        }


def report(rows: list[dict[str, Any]]) -> str:
    cols = [
        ("subscribers", "subscribers"),
        ("subscribers per consumer task", "per_task"),
        ("streams", "streams"),
        ("records/s asked", "rate"),
        ("appends (late)", None),
        ("deliveries", "deliveries"),
        ("reads/append", "reads_per_append"),
        ("streams touched/append", "streams_touched_per_append"),
        ("shared / catch-up reads", None),
        ("p50 ms", "p50_ms"),
        ("p99 ms", "p99_ms"),
        ("max ms", "max_ms"),
        ("produce / drain s", None),
        ("event-loop CPU s", "loop_cpu_s"),
    ]
    lines = ["| " + " | ".join(t for t, _ in cols) + " |", "|" + "---|" * len(cols)]
    for row in rows:
        cells = []
        for _title, key in cols:
            if key is not None:
                cells.append(f"{row[key]:,}" if isinstance(row[key], int) else str(row[key]))
        cells.insert(4, f"{row['appends']:,} ({row['late_appends']:,})")
        cells.insert(8, f"{row['shared_reads']:,} / {row['catchup_reads']:,}")
        cells.insert(len(cells) - 1, f"{row['produce_s']} / {row['drain_s']}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes; print only (unless --out)")
    p.add_argument("--subscribers", type=int, default=None, help="subscribers (10,000)")
    p.add_argument("--streams", type=int, default=None, help="streams (sites) subscribed (100)")
    p.add_argument("--rate", type=int, default=None, help="records appended per second (50,000)")
    p.add_argument("--seconds", type=float, default=None, help="how long the producer runs (10)")
    p.add_argument("--batch", type=int, default=500, help="records per append (500)")
    p.add_argument("--sites-per-batch", type=int, default=5, help="streams each append touches (5)")
    p.add_argument(
        "--per-task",
        type=int,
        nargs="+",
        default=None,
        help="subscribers per consumer task, one run each (1: a task per subscriber; default 1 1000)",
    )
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--dir", default=None, help="where to put temporary data (default: system temp)")
    args = p.parse_args(argv)
    quick = {"subscribers": 200, "streams": 10, "rate": 5000, "seconds": 1.0}
    full = {"subscribers": 10_000, "streams": 100, "rate": 50_000, "seconds": 10.0}
    for name, value in (quick if args.quick else full).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.sites_per_batch = min(args.sites_per_batch, args.streams)
    per_task = args.per_task or ([1, 100] if args.quick else [1, 1000])
    rows = []
    for t in per_task:
        base = Path(tempfile.mkdtemp(prefix="bench-subs-", dir=args.dir))
        try:
            log(
                f"{args.subscribers} subscribers on {args.streams} streams, {args.rate} records/s "
                f"for {args.seconds} s, {t} subscriber(s) per consumer task"
            )
            rows.append(asyncio.run(run(args, base, t)))
        finally:
            shutil.rmtree(base, ignore_errors=True)
    machine = ", ".join(f"{k} {v}" for k, v in _machine().items())
    text = "\n".join(
        [
            f"# Subscriptions ({dt.date.today().isoformat()})",
            "",
            f"Machine: {machine}; filesystem: {_filesystem(Path(args.dir or tempfile.gettempdir()))}.",
            "",
            report(rows),
            "",
        ]
    )
    print(text)
    out = args.out
    if out is None and not args.quick:
        out = Path(__file__).resolve().parent / "results" / f"subscriptions-{dt.date.today().isoformat()}.md"
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        out.with_suffix(".json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
