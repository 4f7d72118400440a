"""Wildcard reads over the network: ``StreamReader`` against a network scan and the embedded reads.

    python -m bench.net_streams [--records N] [--topics T] [--repeats R] [--out FILE.md]

The ``bench.streams`` read workload (``--records`` records over ``--topics`` topics
``siteNNN/devNNNNN/temp``, 100 sites, 4 shards routed by topic, LTS thresholds
``[100, 0, 100]``, per-site 1000-record appends) is written into a store, read embedded, then
served by one ``seglog serve`` on the same directory and read over loopback HTTP. The filter
``site042/#`` selects 1 % of the records. Rows, best of ``--repeats``:

* **network, streams**: ``StreamReader.get_streams`` / ``make_iterator`` / ``next_arrow``
  (100,000 rows per call): only the frames of the matching streams are read and sent;
* **network, scan**: ``Consumer.getmany_arrow`` of every shard from offset 0 to its end,
  filtered with the MQTT filter as a regex in the client: what a network reader of a topic
  filter had to do before the streams endpoints (the baseline of the ratio);
* **embedded, streams** and **embedded, scan**: the same two reads in-process
  (``Database.next_arrow`` and ``read_arrow`` + the regex), for scale.

Every row must find the same records. Writes ``bench/results/net-streams-<date>.md/.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow.compute as pc

import seglog
from bench import streams as workload
from bench._report import write_report
from bench.net import Node
from seglog.client import Consumer, StreamReader
from seglog.topics import filter_to_regex

REPO = Path(__file__).resolve().parent.parent
DB = "r"
ROWS_PER_CALL = 100_000


async def build(directory: Path, records: int, topics: int) -> None:
    plan = workload.batches("per-site", records, max(1, topics // workload.SITES))
    async with seglog.open(directory, fsync="never") as store:
        db = await store.create_db(DB, shards=workload.SHARDS, lts_thresholds=workload.THRESHOLDS)
        await workload.fill(db, plan)


async def embedded(directory: Path, topic_filter: str) -> tuple[tuple[int, float], tuple[int, float]]:
    async with seglog.open(directory, fsync="never") as store:
        db = await store.open_db(DB)
        rows, streams_s, _frames = await workload.read_streams(db, topic_filter)
        scanned = await workload.full_scan(db, topic_filter)
    return (rows, streams_s), scanned


async def network_streams(url: str, topic_filter: str) -> tuple[int, float]:
    async with StreamReader(url, DB) as reader:
        t0 = time.perf_counter()
        rows = 0
        for stream in await reader.get_streams(topic_filter):
            it = await reader.make_iterator(stream, topic_filter)
            while True:
                it, table = await reader.next_arrow(it, ROWS_PER_CALL)
                if not table.num_rows:
                    break
                rows += table.num_rows
        return rows, time.perf_counter() - t0


async def network_scan(url: str, topic_filter: str) -> tuple[int, float]:
    regex = filter_to_regex(topic_filter)
    async with Consumer(url, DB, auto_offset_reset="earliest", fetch_max_bytes=16 << 20) as consumer:
        t0 = time.perf_counter()
        ends = await consumer.end_offsets(range(workload.SHARDS))
        rows = 0
        while any(consumer.position(s) < e for s, e in ends.items()):
            for table in (await consumer.getmany_arrow(timeout_ms=1000)).values():
                rows += table.filter(pc.match_substring_regex(table.column("topic"), regex)).num_rows
        return rows, time.perf_counter() - t0


def run(work: Path, records: int, topics: int, repeats: int) -> dict[str, Any]:
    topic_filter = workload.read_filter(records)
    node = Node(work)
    asyncio.run(build(work / "node", records, topics))
    best: dict[str, tuple[int, float]] = {}

    def keep(name: str, got: tuple[int, float]) -> None:
        if name not in best or got[1] < best[name][1]:
            best[name] = got

    for _ in range(repeats):
        streams_row, scan_row = asyncio.run(embedded(work / "node", topic_filter))
        keep("embedded, streams", streams_row)
        keep("embedded, scan", scan_row)
    asyncio.run(node.start())
    try:
        for _ in range(repeats):
            keep("network, streams", asyncio.run(network_streams(node.url, topic_filter)))
            keep("network, scan", asyncio.run(network_scan(node.url, topic_filter)))
    finally:
        node.stop()
    found = {name: rows for name, (rows, _s) in best.items()}
    if len(set(found.values())) != 1:
        raise AssertionError(f"the rows disagree on what {topic_filter} matches: {found}")
    baseline = best["network, scan"][1]
    return {
        "records": records,
        "topics": topics,
        "filter": topic_filter,
        "matching": next(iter(found.values())),
        "repeats": repeats,
        "rows": {
            name: {"seconds": s, "history_records_per_s": records / s, "vs_network_scan": baseline / s}
            for name, (_rows, s) in best.items()
        },
    }


def markdown(r: dict[str, Any]) -> str:
    lines = [
        f"{r['records']:,} records over {r['topics']:,} topics, 4 shards, per-site appends; "
        f"`{r['filter']}` matches {r['matching']:,} ({r['matching'] / r['records']:.1%}). "
        f"Best of {r['repeats']}; one `seglog serve` on loopback for the network rows.",
        "",
        "| reader | seconds | records of history per s | vs network scan |",
        "|---|---:|---:|---:|",
    ]
    for name in ("network, streams", "network, scan", "embedded, streams", "embedded, scan"):
        row = r["rows"][name]
        ratio = (
            f"**{row['vs_network_scan']:.1f}x**"
            if name == "network, streams"
            else f"{row['vs_network_scan']:.2f}"
        )
        lines.append(f"| {name} | {row['seconds']:.3f} | {row['history_records_per_s']:,.0f} | {ratio} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--topics", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help="default bench/results/net-streams-<date>.md")
    args = ap.parse_args(argv)
    out = args.out or REPO / "bench" / "results" / f"net-streams-{dt.date.today().isoformat()}.md"
    with tempfile.TemporaryDirectory(prefix="seglog-net-streams-") as tmp:
        result = run(Path(tmp), args.records, args.topics, args.repeats)
    write_report(out, "Wildcard reads over the network", markdown(result), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
