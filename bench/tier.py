"""Tiering and Spark-scan benchmark, each against a baseline measured in the same run.

    python -m bench.tier [--records N] [--value-bytes S] [--out FILE.md]

Tiering: ``N`` records (MQTT-style topics, ``S`` random bytes each, fixed seed) are appended
to a 2-shard database and sealed; then ``db.tier_now()`` converts every sealed segment to
Parquet (zstd) and uploads it, verified, with manifest commits. Timed once to a local directory
(``file://``) and once to a MinIO server the run starts (``s3://``). MB/s counts segment bytes
(the log as stored). The baseline copies the same segment files unchanged to the same target
(``shutil.copyfile`` + fsync; boto3 ``upload_file`` with the tier's multipart settings).

Spark scan (local[2], the project's venv Python for workers), over both tiers: the ``seglog``
data source vs plain ``spark.read.parquet`` of the same objects (``s3a://`` on MinIO), each
(a) materialising every column (``write.format("noop")``) and (b) an aggregate
(``count``, ``sum(length(value))``, ``max(ts)``). Best of ``--repeats`` runs after a warm-up.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

import seglog
from bench._report import write_report
from bench.peers._server import ServerProcess, free_port

REPO = Path(__file__).resolve().parent.parent
MINIO_BIN = Path(os.environ.get("SEGLOG_MINIO_BIN", REPO / ".cache" / "bin" / "minio"))
MINIO_START_TIMEOUT_S = 60.0
SHARDS = 2
BATCH_RECORDS = 10_000
SEGMENT_BYTES = 64 << 20
DB = "bench"
BUCKET = "tier-bench"


@dataclass(frozen=True)
class S3Server:
    """Where a MinIO listens and its root credentials."""

    endpoint: str
    access_key: str
    secret_key: str

    def client(self) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}),
        )


def _healthy(endpoint: str) -> bool:
    # /cluster answers 503 until the object layer, bucket metadata and IAM are up;
    # /live answers 200 before that, and a first request then fails "not initialized".
    try:
        with urllib.request.urlopen(f"{endpoint}/minio/health/cluster", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextmanager
def run_minio(workdir: Path) -> Iterator[S3Server]:
    """A MinIO server on a free loopback port, stopped by its PID when the block exits."""
    if not MINIO_BIN.is_file():
        raise SystemExit(f"MinIO binary {MINIO_BIN} is missing: run `make minio`")
    port, console = free_port(), free_port()
    server = S3Server(f"http://127.0.0.1:{port}", "bench-" + os.urandom(4).hex(), os.urandom(16).hex())
    data = workdir / "minio-data"
    data.mkdir()
    env = {
        **os.environ,
        "MINIO_ROOT_USER": server.access_key,
        "MINIO_ROOT_PASSWORD": server.secret_key,
        "MINIO_BROWSER": "off",
        "MINIO_UPDATE": "off",
    }
    argv = [str(MINIO_BIN), "server", str(data), "--address", f"127.0.0.1:{port}"]
    proc = ServerProcess(
        "minio",
        [*argv, "--console-address", f"127.0.0.1:{console}", "--quiet"],
        workdir / "minio.log",
        env=env,
    )
    proc.start()
    try:
        asyncio.run(proc.wait_until(lambda: _healthy(server.endpoint), "MinIO health", MINIO_START_TIMEOUT_S))
        yield server
    finally:
        proc.stop()


# --- data ----------------------------------------------------------------------------


def _columns(start: int, n: int, value_bytes: int, rng: np.random.Generator) -> pa.Table:
    i = np.arange(start, start + n)
    topics = [f"sensors/site{s}/dev{d}/temp" for s, d in zip(i % 100, i % 1000, strict=True)]
    payload = rng.bytes(value_bytes * n)
    values = pa.Array.from_buffers(
        pa.binary(),
        n,
        [
            None,
            pa.py_buffer(np.arange(0, (n + 1) * value_bytes, value_bytes, dtype=np.int32)),
            pa.py_buffer(payload),
        ],
    )
    return pa.table(
        {
            "ts": pa.array(1_700_000_000_000_000 + i * 1000, pa.int64()),
            "topic": pa.array(topics, pa.string()),
            "value": values,
        }
    )


async def build_store(data: Path, records: int, value_bytes: int) -> int:
    """Write the data set, seal it; return the bytes of the sealed segments."""
    rng = np.random.default_rng(7)
    async with seglog.open(data, fsync="never", retention_interval_ms=None) as store:
        db = await store.create_db(DB, SHARDS, segment_bytes=SEGMENT_BYTES)
        for start in range(0, records, BATCH_RECORDS):
            table = _columns(start, min(BATCH_RECORDS, records - start), value_bytes, rng)
            await db.append_arrow(table)
        await db.seal()
    return sum(p.stat().st_size for p in segment_paths(data))


def segment_paths(data: Path) -> list[Path]:
    return sorted(p for p in (data / "dbs" / DB).rglob("*.log") if p.stat().st_size)


# --- tiering -------------------------------------------------------------------------


async def time_tiering(data: Path, tier: str, s3: S3Server | None) -> tuple[float, int, int]:
    """Seconds of ``tier_now`` over every shard; objects and Parquet bytes written."""
    kwargs: dict[str, Any] = {}
    if s3 is not None:
        kwargs = {"s3_endpoint": s3.endpoint, "s3_access_key": s3.access_key, "s3_secret_key": s3.secret_key}
    async with seglog.open(data, tier=tier, retention_interval_ms=None, **kwargs) as store:
        db = await store.open_db(DB)
        t0 = time.perf_counter()
        entries = await db.tier_now()
        elapsed = time.perf_counter() - t0
    return elapsed, len(entries), sum(e.bytes for e in entries)


def copy_files(paths: list[Path], dest: Path) -> float:
    """Baseline for the file tier: copy each segment unchanged and fsync it."""
    dest.mkdir(parents=True)
    t0 = time.perf_counter()
    for p in paths:
        target = dest / f"{p.parent.name}-{p.name}"
        shutil.copyfile(p, target)
        fd = os.open(target, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    return time.perf_counter() - t0


def upload_files(paths: list[Path], s3: S3Server) -> float:
    """Baseline for the S3 tier: upload each segment unchanged (same multipart settings)."""
    from boto3.s3.transfer import TransferConfig

    from seglog.tiering.targets import S3Tuning

    tuning = S3Tuning()
    config = TransferConfig(
        multipart_threshold=tuning.multipart_threshold_bytes,
        multipart_chunksize=tuning.multipart_chunk_bytes,
        max_concurrency=tuning.max_concurrency,
    )
    client = s3.client()
    t0 = time.perf_counter()
    for p in paths:
        client.upload_file(str(p), BUCKET, f"raw/{p.parent.name}/{p.name}", Config=config)
    return time.perf_counter() - t0


# --- Spark ---------------------------------------------------------------------------


def best_of(repeats: int, job: Callable[[], Any]) -> float:
    job()  # warm-up: JIT, Python workers, file listings
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        job()
        times.append(time.perf_counter() - t0)
    return min(times)


def spark_scans(
    spark: Any, root: str, parquet_path: str, s3: S3Server | None, repeats: int, records: int
) -> dict[str, float]:
    """Seconds per scan kind for the data source and plain Parquet over one tier.

    Raises:
        AssertionError: An aggregate did not count exactly ``records`` rows.
    """
    from pyspark.sql import functions as F

    def source() -> Any:
        reader = spark.read.format("seglog").option("root", root).option("db", DB)
        if s3 is not None:
            reader = (
                reader.option("endpoint", s3.endpoint)
                .option("access_key", s3.access_key)
                .option("secret_key", s3.secret_key)
            )
        return reader.load()

    # A fresh DataFrame per run: re-collecting one would reuse its finished shuffle stages.
    frames: dict[str, Callable[[], Any]] = {
        "source": source,
        "parquet": lambda: spark.read.parquet(parquet_path),
    }
    out: dict[str, float] = {}
    for name, make in frames.items():
        out[f"{name} full"] = best_of(
            repeats, lambda make=make: make().write.format("noop").mode("overwrite").save()
        )

        def aggregate(make: Callable[[], Any] = make, name: str = name) -> None:
            agg = make().agg(F.count("*").alias("n"), F.sum(F.length("value")), F.max("ts"))
            n = agg.collect()[0]["n"]
            if n != records:
                raise AssertionError(f"{name} scan of {root} counted {n} rows, expected {records}")

        out[f"{name} agg"] = best_of(repeats, aggregate)
    return out


# --- the run -------------------------------------------------------------------------


def run(
    workdir: Path, records: int, value_bytes: int, repeats: int, s3: S3Server, spark: Any
) -> dict[str, Any]:
    """Measure everything with a running MinIO and Spark session; return the figures."""
    data_file, data_s3 = workdir / "data-file", workdir / "data-s3"
    seg_bytes = asyncio.run(build_store(data_file, records, value_bytes))
    shutil.copytree(data_file, data_s3)
    paths = segment_paths(data_file)
    s3.client().create_bucket(Bucket=BUCKET)
    tier_dir = workdir / "tier"
    results: dict[str, Any] = {
        "records": records,
        "value_bytes": value_bytes,
        "segment_bytes": seg_bytes,
        "segments": len(paths),
    }
    t_file, objects, pq_bytes = asyncio.run(time_tiering(data_file, tier_dir.as_uri(), None))
    t_copy = copy_files(paths, workdir / "copy")
    t_s3, _, _ = asyncio.run(time_tiering(data_s3, f"s3://{BUCKET}/tier", s3))
    t_upload = upload_files(paths, s3)
    results["tiering"] = {
        "file": {"tier_s": t_file, "baseline_s": t_copy},
        "s3": {"tier_s": t_s3, "baseline_s": t_upload},
        "objects": objects,
        "parquet_bytes": pq_bytes,
    }
    results["spark"] = {
        "file": spark_scans(spark, tier_dir.as_uri(), str(tier_dir / DB), None, repeats, records),
        "s3": spark_scans(spark, f"s3://{BUCKET}/tier", f"s3a://{BUCKET}/tier/{DB}", s3, repeats, records),
    }
    return results


def markdown(r: dict[str, Any]) -> str:
    mb = r["segment_bytes"] / 1e6
    n = r["records"]
    lines = [
        f"Tiering: {n:,} records of {r['value_bytes']} B in {r['segments']} sealed segments "
        f"({mb:.1f} MB) -> {r['tiering']['objects']} Parquet objects "
        f"({r['tiering']['parquet_bytes'] / 1e6:.1f} MB, zstd).",
        "",
        "| target | seglog tier_now MB/s | records/s | baseline: copy segments unchanged MB/s | tier ÷ baseline |",
        "|---|---:|---:|---:|---:|",
    ]
    for target, label in (("file", "local dir (file://)"), ("s3", "MinIO (s3://)")):
        t = r["tiering"][target]
        lines.append(
            f"| {label} | {mb / t['tier_s']:.1f} | {n / t['tier_s']:,.0f} | {mb / t['baseline_s']:.1f} "
            f"| {t['baseline_s'] / t['tier_s']:.2f} |"
        )
    lines += [
        "",
        "Spark scan (local[2]), records/s, best of the timed runs:",
        "",
        "| tier | scan | seglog data source | plain spark.read.parquet | source ÷ parquet |",
        "|---|---|---:|---:|---:|",
    ]
    for target, label in (("file", "local dir"), ("s3", "MinIO (s3a for parquet)")):
        s = r["spark"][target]
        for kind, desc in (
            ("full", "all columns (noop sink)"),
            ("agg", "count, sum(length(value)), max(ts)"),
        ):
            src, pq = s[f"source {kind}"], s[f"parquet {kind}"]
            lines.append(f"| {label} | {desc} | {n / src:,.0f} | {n / pq:,.0f} | {pq / src:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument(
        "--out", type=Path, default=None, help="Markdown file (default bench/results/tier-<date>.md)"
    )
    args = ap.parse_args(argv)
    from seglog.spark.session import build_spark_session

    out = args.out or REPO / "bench" / "results" / f"tier-{dt.date.today().isoformat()}.md"
    with tempfile.TemporaryDirectory(prefix="seglog-tier-bench-") as tmp, run_minio(Path(tmp)) as s3:
        spark = build_spark_session(
            app_name="seglog-tier-bench",
            s3_endpoint=s3.endpoint,
            access_key=s3.access_key,
            secret_key=s3.secret_key,
        )
        try:
            results = run(Path(tmp), args.records, args.value_bytes, args.repeats, s3, spark)
        finally:
            spark.stop()
    write_report(out, "Tiering and Spark scan", markdown(results), results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
