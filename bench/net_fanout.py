"""Many network readers tailing one stream: reads shared on the node, against a node without.

    python -m bench.net_fanout [--readers 1,100] [--appends N] [--records-per-append R]
                               [--interval-ms I] [--before REF] [--out FILE.md]

One ``seglog serve --fsync always`` node, a database of one shard with streams; ``--readers``
``StreamReader`` clients (one connection each, in this process) tail the stream of
``plant/line1/temp`` with long polls (``next_arrow(it, 1000, wait_ms=...)``) while a
``Producer`` appends ``--records-per-append`` records of that topic every ``--interval-ms``
(``ts`` = wall clock at send), ``--appends`` times. Every reader must receive every record.
Per row: the node's CPU seconds over the run and per append, delivery latency (receipt -
``ts``, over every reader and record) p50/p99, and the node's stream reads per append
(``seglog_stream_reads_total``: done for a request, or joined to one in flight).

``--before REF`` runs the same rows against a node running the ``seglog`` package of ``REF``
(the client side is this checkout's either way; the compiled extensions are copied from this
tree), alternating sides per reader count. Writes ``bench/results/net-fanout-<date>.md/.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pyarrow as pa
from prometheus_client.parser import text_string_to_metric_families

from bench._refs import export_seglog, head_commit
from bench._report import write_report
from bench.net import Node
from seglog.client import Producer, StreamReader

REPO = Path(__file__).resolve().parent.parent
DB = "fan"
TOPIC = "plant/line1/temp"
START_TIMEOUT_S = 60.0
WAIT_MS = 10_000
DONE_TIMEOUT_S = 120.0
WARM_TS = 946_684_800_000_001  # the warm-up record's ts (2000-01-01): not a measured one


async def _metric(session: aiohttp.ClientSession, url: str, name: str, **labels: str) -> float | None:
    """The sum of the node's samples ``name`` with ``labels`` (``None``: the node has no such
    metric, as a node from before shared reads)."""
    async with session.get(f"{url}/metrics") as r:
        text = await r.text()
    total: float | None = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total = (total or 0.0) + sample.value
    return total


async def _row(root: Path | None, work: Path, readers: int, args: argparse.Namespace) -> dict[str, Any]:
    node = Node(work, root)
    url = node.url
    try:
        await node.start()
        async with contextlib.AsyncExitStack() as stack:
            session = await stack.enter_async_context(aiohttp.ClientSession())
            body = {"name": DB, "shards": 1, "lts_thresholds": [100, 10]}
            async with session.post(f"{url}/v1/dbs", json=body) as r:
                assert r.status == 201, await r.text()
            producer = await stack.enter_async_context(Producer(url, DB, acks=1, linger_ms=0))
            await (await producer.send(TOPIC, b"warm-up", ts=time.time_ns() // 1000))
            clients = [await stack.enter_async_context(StreamReader(url, DB)) for _ in range(readers)]
            (stream,) = await clients[0].get_streams(TOPIC)
            start = await clients[0].make_iterator(stream, TOPIC)
            start, _ = await clients[0].next_arrow(start, 10)  # past the warm-up record
            want = 1 + args.appends * args.records_per_append  # a second warm-up, then the run
            latencies: list[np.ndarray[Any, Any]] = []
            warm = [asyncio.Event() for _ in clients]

            async def tail(client: StreamReader, warmed: asyncio.Event) -> None:
                it, got = start, 0
                while got < want:
                    it, table = await client.next_arrow(it, 1000, wait_ms=WAIT_MS)
                    if table.num_rows:
                        now_us = time.time_ns() // 1000
                        ts = table.column("ts").cast(pa.int64()).to_numpy()
                        latencies.append((now_us - ts[ts != WARM_TS]) / 1000.0)
                        got += table.num_rows
                        warmed.set()

            tails = [asyncio.ensure_future(tail(c, w)) for c, w in zip(clients, warm, strict=True)]
            # Every reader has read once and polls again: the run starts with all of them tailing.
            await (await producer.send(TOPIC, b"warm-up", ts=WARM_TS))
            await asyncio.wait_for(asyncio.gather(*(w.wait() for w in warm)), START_TIMEOUT_S)
            async with asyncio.timeout(START_TIMEOUT_S):
                while (await _metric(session, url, "seglog_stream_waiting") or readers) < readers:
                    await asyncio.sleep(0.01)  # polling a remote gauge under a deadline
            own0 = await _metric(session, url, "seglog_stream_reads_total", kind="own")
            joined0 = await _metric(session, url, "seglog_stream_reads_total", kind="joined")
            cpu0 = node.cpu_s()
            t0 = time.perf_counter()
            n = args.records_per_append
            batch = pa.table(
                {"topic": [TOPIC] * n, "ts": pa.array([0] * n, pa.int64()), "value": [b"x" * 100] * n}
            )
            for i in range(args.appends):
                # A clock schedule: each append at its own time, however long the last took.
                delay = t0 + i * args.interval_ms / 1000 - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                ts = time.time_ns() // 1000
                await (
                    await producer.send_arrow(
                        batch.set_column(1, "ts", pa.array([ts] * len(batch), pa.int64()))
                    )
                )
            await asyncio.wait_for(asyncio.gather(*tails), DONE_TIMEOUT_S)
            seconds = time.perf_counter() - t0
            cpu = node.cpu_s() - cpu0
            own1 = await _metric(session, url, "seglog_stream_reads_total", kind="own")
            joined1 = await _metric(session, url, "seglog_stream_reads_total", kind="joined")
            # A node with shared reads always has the gauge; a counter label not used yet is 0.
            shared = await _metric(session, url, "seglog_stream_waiting") is not None
        lat = np.concatenate(latencies)
        assert len(lat) == readers * (want - 1), (len(lat), readers * (want - 1))
        return {
            "readers": readers,
            "appends": args.appends,
            "records": want,
            "seconds": seconds,
            "node_cpu_s": cpu,
            "node_cpu_ms_per_append": cpu / args.appends * 1000,
            "p50_ms": float(np.percentile(lat, 50)),
            "p99_ms": float(np.percentile(lat, 99)),
            "reads_per_append": ((own1 or 0.0) - (own0 or 0.0)) / args.appends if shared else None,
            "joined_per_append": ((joined1 or 0.0) - (joined0 or 0.0)) / args.appends if shared else None,
        }
    finally:
        node.stop()


def render(rows: list[dict[str, Any]], described: dict[str, str], args: argparse.Namespace) -> str:
    lines = [
        f"One node (`--fsync always`), one shard; a `Producer` (acks=1) appends {args.records_per_append} "
        f"records of `{TOPIC}` every {args.interval_ms:g} ms, {args.appends} times; N `StreamReader`s "
        "(one connection each, in the bench process) tail that stream with long polls. "
        + "; ".join(f"{k}: {v}" for k, v in described.items())
        + ". The node and the readers share the machine's two cores.",
        "",
        "| side | readers | node CPU ms per append | delivery p50 ms | delivery p99 ms "
        "| node reads per append | joined per append |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        reads = "n/a" if r["reads_per_append"] is None else f"{r['reads_per_append']:.2f}"
        joined = "n/a" if r["joined_per_append"] is None else f"{r['joined_per_append']:.2f}"
        lines.append(
            f"| {r['side']} | {r['readers']} | {r['node_cpu_ms_per_append']:.2f} | {r['p50_ms']:.1f} | "
            f"{r['p99_ms']:.1f} | {reads} | {joined} |"
        )
    sides = {r["side"] for r in rows}
    if {"before", "after"} <= sides:
        lines += ["", "after ÷ before, node CPU per append (median over runs):", ""]
        for n in sorted({r["readers"] for r in rows}):

            def med(side: str, n: int = n) -> float:
                return statistics.median(
                    r["node_cpu_ms_per_append"] for r in rows if r["side"] == side and r["readers"] == n
                )

            ratio = f"{med('after') / med('before'):.2f}" if med("before") else "n/a (too short to measure)"
            lines.append(f"* {n} readers: {ratio}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--readers", default="1,100", help="comma-separated reader counts")
    p.add_argument("--appends", type=int, default=200)
    p.add_argument("--records-per-append", type=int, default=20)
    p.add_argument("--interval-ms", type=float, default=50.0)
    p.add_argument("--runs", type=int, default=1, help="rows per side and reader count (alternating)")
    p.add_argument("--before", default=None, help="git ref whose seglog the 'before' node runs")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    counts = [int(x) for x in args.readers.split(",")]
    described = {"after": f"this checkout (HEAD {head_commit()})"}
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="seglog-fanout-") as tmp:
        sides: list[tuple[str, Path | None]] = [("after", None)]
        if args.before:
            before = Path(tmp) / "before"
            before.mkdir()
            described["before"] = (
                f"node running seglog of {args.before} ({export_seglog(args.before, before, with_extensions=True)})"
            )
            sides.insert(0, ("before", before))
        for n in counts:
            for run in range(args.runs):
                for side, root in sides:
                    work = Path(tmp) / f"{side}-{n}-{run}"
                    work.mkdir()
                    row = asyncio.run(_row(root, work, n, args))
                    row["side"] = side
                    rows.append(row)
                    print(
                        f"  {side} {n} readers: {row['node_cpu_ms_per_append']:.2f} ms CPU/append, "
                        f"p99 {row['p99_ms']:.1f} ms",
                        file=sys.stderr,
                    )
    out = args.out or REPO / "bench" / "results" / f"net-fanout-{dt.date.today().isoformat()}.md"
    write_report(
        out,
        "Many network readers of one stream (bench/net_fanout.py)",
        render(rows, described, args),
        {"rows": rows},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
