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
