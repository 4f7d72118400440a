"""Reading tiered history through the store: the read cache against no cache, in one run.

    python -m bench.tier_reads [--records N] [--value-bytes S] [--baseline-reads R] [--out FILE.md]

``N`` records (the ``bench.tier`` workload, one shard, 64 MiB segments) are appended, sealed,
tiered and deleted locally (``local_retention_bytes=0``), so every record below the last
segment is only in the tier. Then, for a local directory tier (``file://``) and a MinIO
(``s3://``) the run starts, the same store is read from offset 0 in pages of
``--page`` records (``read_arrow``, as a consumer catching up from the start does):

* **cached**: the default ``tier_cache_bytes`` (one download per object, row groups decoded
  once);
* **no cache**: ``tier_cache_bytes=0``, which downloads and verifies the whole object for
  every call: how every tier read worked before the cache. It is slow, so only the first
  ``--baseline-reads`` calls are timed.

and a stream iterator (``next_arrow`` over ``sensors/site7/#``, 1 % of the records) reads the
whole tiered history once with the cache. Records/s of each, downloads and row groups decoded
(``Store.tier_cache_stats``). Writes ``bench/results/tier-reads-<date>.md/.json``.
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

import numpy as np

import seglog
from bench._report import write_report
from bench.tier import S3Server, _columns, run_minio

REPO = Path(__file__).resolve().parent.parent
DB = "history"
SEGMENT_BYTES = 64 << 20
BATCH_RECORDS = 10_000
BUCKET = "tier-reads"
STREAM_FILTER = "sensors/site7/#"
LTS_THRESHOLDS = [100, 100, 0, 100]  # one stream per site: sensors/siteN/+/temp


async def build(data: Path, tier: str, s3: S3Server | None, records: int, value_bytes: int) -> int:
    """Write, seal and tier the history; return the offset where the local log now starts."""
    rng = np.random.default_rng(7)
    async with seglog.open(
        data, fsync="never", retention_interval_ms=None, tier=tier, **s3_kwargs(s3)
    ) as store:
        db = await store.create_db(
            DB, 1, segment_bytes=SEGMENT_BYTES, local_retention_bytes=0, lts_thresholds=LTS_THRESHOLDS
        )
        for start in range(0, records, BATCH_RECORDS):
            await db.append_arrow(
                _columns(start, min(BATCH_RECORDS, records - start), value_bytes, rng), shard=0
            )
        await db.seal()
        await db.tier_now()
        return db.local_start_offset(0)


def s3_kwargs(s3: S3Server | None) -> dict[str, Any]:
    if s3 is None:
        return {}
    return {"s3_endpoint": s3.endpoint, "s3_access_key": s3.access_key, "s3_secret_key": s3.secret_key}


def cache_figures(store: seglog.Store) -> dict[str, float]:
    """The tier read cache's downloads and row groups decoded so far."""
    stats = store.tier_cache_stats()
    assert stats is not None
    return {"downloads": stats.downloads, "row_groups_decoded": stats.row_groups_decoded}


async def sequential(
    data: Path,
    tier: str,
    s3: S3Server | None,
    stop: int,
    page: int,
    calls: int | None,
    cache_bytes: int | None,
) -> dict[str, float]:
    """Read ``[0, stop)`` in pages (at most ``calls`` of them); records/s and the cache's counters."""
    kwargs = s3_kwargs(s3) if cache_bytes is None else {**s3_kwargs(s3), "tier_cache_bytes": cache_bytes}
    async with seglog.open(data, retention_interval_ms=None, tier=tier, **kwargs) as store:
        db = await store.open_db(DB)
        offset, n = 0, 0
        t0 = time.perf_counter()
        while offset < stop and (calls is None or n < calls):
            table = await db.read_arrow(0, offset, min(page, stop - offset))
            offset += table.num_rows
            n += 1
        elapsed = time.perf_counter() - t0
        cache = cache_figures(store)
    return {"records": offset, "calls": n, "seconds": elapsed, "records_per_s": offset / elapsed, **cache}


async def stream_read(data: Path, tier: str, s3: S3Server | None, stop: int, page: int) -> dict[str, float]:
    """Read one stream's records of the tiered history with an iterator (cache on)."""
    async with seglog.open(data, retention_interval_ms=None, tier=tier, **s3_kwargs(s3)) as store:
        db = await store.open_db(DB)
        got = 0
        t0 = time.perf_counter()
        for stream in db.get_streams(STREAM_FILTER):
            it = db.make_iterator(stream, STREAM_FILTER)
            while it.position < stop:
                it, table = await db.next_arrow(it, page)
                got += table.num_rows
                if not table.num_rows:
                    break
        elapsed = time.perf_counter() - t0
        cache = cache_figures(store)
    return {"records": got, "seconds": elapsed, "history_records_per_s": stop / elapsed, **cache}


def run(
    workdir: Path, records: int, value_bytes: int, page: int, baseline_reads: int, s3: S3Server
) -> dict[str, Any]:
    """Every row for both targets; the figures as a dict."""
    s3.client().create_bucket(Bucket=BUCKET)
    out: dict[str, Any] = {"records": records, "value_bytes": value_bytes, "page": page, "targets": {}}
    for name, tier, server in (
        ("file", (workdir / "tier").as_uri(), None),
        ("s3", f"s3://{BUCKET}/t", s3),
    ):
        data = workdir / f"data-{name}"
        stop = asyncio.run(build(data, tier, server, records, value_bytes))
        out["targets"][name] = {
            "tiered_records": stop,
            "cached": asyncio.run(sequential(data, tier, server, stop, page, None, None)),
            "no_cache": asyncio.run(sequential(data, tier, server, stop, page, baseline_reads, 0)),
            "stream": asyncio.run(stream_read(data, tier, server, stop, page)),
        }
    return out


def markdown(r: dict[str, Any]) -> str:
    lines = [
        f"{r['records']:,} records of {r['value_bytes']} B, one shard, 64 MiB segments, tiered and "
        f"deleted locally; `read_arrow` from offset 0 in pages of {r['page']:,}.",
        "",
        "| tier | reader | calls | records read | records/s | downloads | row groups decoded | cached ÷ no cache |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, label in (("file", "local dir (file://)"), ("s3", "MinIO (s3://)")):
        t = r["targets"][name]
        cached, none = t["cached"], t["no_cache"]
        ratio = cached["records_per_s"] / none["records_per_s"]
        lines.append(
            f"| {label} | cache (default) | {cached['calls']:,.0f} | {cached['records']:,.0f} | "
            f"{cached['records_per_s']:,.0f} | {cached['downloads']:,.0f} | {cached['row_groups_decoded']:,.0f} | "
            f"**{ratio:,.0f}x** |"
        )
        lines.append(
            f"| {label} | no cache (`tier_cache_bytes=0`, the behaviour before) | {none['calls']:,.0f} | "
            f"{none['records']:,.0f} | {none['records_per_s']:,.0f} | {none['downloads']:,.0f} | "
            f"{none['row_groups_decoded']:,.0f} | 1 |"
        )
    lines += [
        "",
        f"Stream iterator over the tiered history (`{STREAM_FILTER}`, cache on):",
        "",
        "| tier | records found | seconds | history records/s | downloads | row groups decoded |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, label in (("file", "local dir"), ("s3", "MinIO")):
        s = r["targets"][name]["stream"]
        lines.append(
            f"| {label} | {s['records']:,.0f} | {s['seconds']:.2f} | {s['history_records_per_s']:,.0f} | "
            f"{s['downloads']:,.0f} | {s['row_groups_decoded']:,.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--page", type=int, default=1000, help="records per read_arrow call")
    ap.add_argument("--baseline-reads", type=int, default=20, help="timed calls without the cache")
    ap.add_argument("--out", type=Path, default=None, help="default bench/results/tier-reads-<date>.md")
    args = ap.parse_args(argv)
    out = args.out or REPO / "bench" / "results" / f"tier-reads-{dt.date.today().isoformat()}.md"
    with tempfile.TemporaryDirectory(prefix="seglog-tier-reads-") as tmp, run_minio(Path(tmp)) as s3:
        results = run(Path(tmp), args.records, args.value_bytes, args.page, args.baseline_reads, s3)
    write_report(out, "Reads of tiered history", markdown(results), results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
