"""The tiering/Spark benchmark runs end to end (small), so it cannot rot. No timing asserted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.tier import markdown, run


def test_tier_bench_quick(tmp_path: Path, minio: Any, spark: Any) -> None:
    records = 30_000
    result = run(tmp_path, records, 100, 1, minio, spark)
    assert result["records"] == records
    assert result["tiering"]["objects"] == result["segments"] >= 2
    for target in ("file", "s3"):
        assert result["tiering"][target]["tier_s"] > 0 and result["tiering"][target]["baseline_s"] > 0
        assert set(result["spark"][target]) == {"source full", "source agg", "parquet full", "parquet agg"}
    table = markdown(result)
    assert "| MinIO (s3://) |" in table and "source ÷ parquet" in table
    # The tiered copy really holds every record (the aggregate scans check the count too).
    objects = minio.client().list_objects_v2(Bucket="tier-bench", Prefix="tier/bench/")["Contents"]
    assert len([o for o in objects if o["Key"].endswith(".parquet")]) == result["segments"]


def test_tier_reads_bench_quick(tmp_path: Path, minio: Any) -> None:
    from bench.tier_reads import markdown as reads_markdown
    from bench.tier_reads import run as run_reads

    result = run_reads(tmp_path, 20_000, 100, 1000, 3, 4, minio)
    for target in ("file", "s3"):
        t = result["targets"][target]
        assert t["tiered_records"] == 20_000
        assert t["cached"]["records"] == 20_000 and t["cached"]["calls"] == 20
        assert t["cached"]["downloads"] == 2  # one object of one row group: its footer, its row group
        assert t["no_cache"]["calls"] == 3 and t["no_cache"]["downloads"] == 2 * 3
        assert t["stream"]["records"] == 200  # sensors/site7/#: 1 % of the records
        seeks = t["seeks"]
        assert seeks["seeks"] == 4
        # One row group per object here: a ranged read fetches all of it but the page indexes.
        assert 0 < seeks["ranged_mib_per_read"] < seeks["whole_mib_per_read"] == seeks["object_mib"]
    table = reads_markdown(result)
    assert "cached ÷ no cache" in table and "whole ÷ ranged" in table
