"""Reading tiered history through the store: the read cache against no cache, in one run.

    python -m bench.tier_reads [--records N] [--value-bytes S] [--baseline-reads R] [--out FILE.md]

``N`` records (the ``bench.tier`` workload, one shard, 64 MiB segments) are appended, sealed,
tiered and deleted locally (``local_retention_bytes=0``), so every record below the last
segment is only in the tier. Then, for a local directory tier (``file://``) and a MinIO
(``s3://``) the run starts, the same store is read from offset 0 in pages of
``--page`` records (``read_arrow``, as a consumer catching up from the start does):

* **cached**: the default ``tier_cache_bytes`` (one download per object, row groups decoded
  once);
* **no cache**: ``tier_cache_bytes=0``, which fetches the footer and the row group again for
  every call. It is slow, so only the first ``--baseline-reads`` calls are timed.

and a stream iterator (``next_arrow`` over ``sensors/site7/#``, 1 % of the records) reads the
whole tiered history once with the cache. Records/s of each, downloads and row groups decoded
(``Store.tier_cache_stats``).

Seeks: ``--seeks`` cold reads of ``--page`` records at random tiered offsets (a reader that
jumps into history, nothing cached), through the tier read path (``TierReadCache.rows`` with
capacity 0) two ways, alternating: **ranged** (the footer and the one row group, each checked
against its CRC32C) and the baseline **whole** (the same entry without its parts: the object
downloaded whole and checked against its sha256, as every read did before ranged reads).
Latency p50/max and bytes fetched per read. Writes ``bench/results/tier-reads-<date>.md/.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
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
from seglog.tiering import Manifest, open_target
from seglog.tiering.read_cache import TierReadCache

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


def seeks(tier: str, s3: S3Server | None, stop: int, page: int, n: int) -> dict[str, float]:
    """``n`` cold reads at random tiered offsets, ranged and whole (alternating)."""
    target = open_target(
        tier,
        s3_endpoint=None if s3 is None else s3.endpoint,
        access_key=None if s3 is None else s3.access_key,
        secret_key=None if s3 is None else s3.secret_key,
    )
    manifest = Manifest.load(target, DB)
    rng = np.random.default_rng(11)
    times: dict[str, list[float]] = {"ranged": [], "whole": []}
    fetched: dict[str, int] = {"ranged": 0, "whole": 0}
    object_bytes = 0
    try:
        for i, offset in enumerate(rng.integers(0, stop - page, n).tolist()):
            entry = manifest.find_offset(0, offset)
            assert entry is not None and entry.parts, "objects tiered with their parts"
            object_bytes += entry.bytes
            last = min(offset + page - 1, entry.end_offset)
            ways = [("ranged", entry), ("whole", dataclasses.replace(entry, parts=()))]
            for way, e in ways if i % 2 == 0 else ways[::-1]:
                cache = TierReadCache(0)
                t0 = time.perf_counter()
                rows = sum(t.num_rows for t in cache.rows(target, e, offset, last))
                times[way].append(time.perf_counter() - t0)
                assert rows == last - offset + 1
                fetched[way] += cache.stats().downloaded_bytes
    finally:
        target.close()
    out: dict[str, float] = {"seeks": n, "object_mib": object_bytes / n / (1 << 20)}
    for way, ts in times.items():
        out[f"{way}_p50_ms"] = float(np.median(ts)) * 1e3
        out[f"{way}_max_ms"] = max(ts) * 1e3
        out[f"{way}_mib_per_read"] = fetched[way] / n / (1 << 20)
    out["speedup_p50"] = out["whole_p50_ms"] / out["ranged_p50_ms"]
    return out


def run(
    workdir: Path, records: int, value_bytes: int, page: int, baseline_reads: int, n_seeks: int, s3: S3Server
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
            "seeks": seeks(tier, server, stop, page, n_seeks),
        }
    return out


def markdown(r: dict[str, Any]) -> str:
    lines = [
        f"{r['records']:,} records of {r['value_bytes']} B, one shard, 64 MiB segments, tiered and "
        f"deleted locally; `read_arrow` from offset 0 in pages of {r['page']:,}.",
        "",
        "| tier | reader | calls | records read | records/s | fetches | row groups decoded | cached ÷ no cache |",
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
            f"| {label} | no cache (`tier_cache_bytes=0`) | {none['calls']:,.0f} | "
            f"{none['records']:,.0f} | {none['records_per_s']:,.0f} | {none['downloads']:,.0f} | "
            f"{none['row_groups_decoded']:,.0f} | 1 |"
        )
    lines += [
        "",
        f"Stream iterator over the tiered history (`{STREAM_FILTER}`, cache on):",
        "",
        "| tier | records found | seconds | history records/s | fetches | row groups decoded |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, label in (("file", "local dir"), ("s3", "MinIO")):
        s = r["targets"][name]["stream"]
        lines.append(
            f"| {label} | {s['records']:,.0f} | {s['seconds']:.2f} | {s['history_records_per_s']:,.0f} | "
            f"{s['downloads']:,.0f} | {s['row_groups_decoded']:,.0f} |"
        )
    first = r["targets"]["file"]["seeks"]
    lines += [
        "",
        f"Seeks: {first['seeks']:,.0f} cold reads of {r['page']:,} records at random tiered offsets "
        f"(objects of {first['object_mib']:.1f} MiB on average), nothing cached:",
        "",
        "| tier | read | p50 ms | max ms | MiB fetched per read | whole ÷ ranged (p50) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, label in (("file", "local dir"), ("s3", "MinIO")):
        k = r["targets"][name]["seeks"]
        lines.append(
            f"| {label} | ranged (footer + row group) | {k['ranged_p50_ms']:.1f} | {k['ranged_max_ms']:.1f} | "
            f"{k['ranged_mib_per_read']:.2f} | **{k['speedup_p50']:.1f}x** |"
        )
        lines.append(
            f"| {label} | whole object (baseline) | {k['whole_p50_ms']:.1f} | {k['whole_max_ms']:.1f} | "
            f"{k['whole_mib_per_read']:.2f} | 1 |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--page", type=int, default=1000, help="records per read_arrow call")
    ap.add_argument("--baseline-reads", type=int, default=20, help="timed calls without the cache")
    ap.add_argument("--seeks", type=int, default=20, help="cold random reads, each way")
    ap.add_argument("--out", type=Path, default=None, help="default bench/results/tier-reads-<date>.md")
    args = ap.parse_args(argv)
    out = args.out or REPO / "bench" / "results" / f"tier-reads-{dt.date.today().isoformat()}.md"
    with tempfile.TemporaryDirectory(prefix="seglog-tier-reads-") as tmp, run_minio(Path(tmp)) as s3:
        results = run(
            Path(tmp), args.records, args.value_bytes, args.page, args.baseline_reads, args.seeks, s3
        )
    write_report(out, "Reads of tiered history", markdown(results), results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
