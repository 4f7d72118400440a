"""Smoke test of ``python -m bench.machine`` (small files, a few hand-offs)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench_runner import run_bench


def test_machine_bench_measures_page_cache_and_wakes(tmp_path: Path) -> None:
    out = tmp_path / "machine.md"
    run_bench(
        "bench.machine",
        "--dir",
        str(tmp_path),
        "--file-mib",
        "4",
        "--cache-mib",
        "8",
        "--runs",
        "50",
        "--out",
        str(out),
    )
    assert "| fresh ÷ recycled |" in out.read_text()
    data = json.loads(out.with_suffix(".json").read_text())
    assert len(data["page_cache"]["recycled_mb_s"]) == 3 and len(data["page_cache"]["fresh_mb_s"]) == 3
    assert all(rate > 0 for rates in data["page_cache"].values() for rate in rates)
    assert 0 < data["wake"]["loop_wake_us"] <= data["wake"]["round_trip_us"]
    assert not list(tmp_path.glob("seglog-machine-*")), "the bench left its files behind"
