"""Smoke test of ``python -m bench.thp`` (one short pair of child processes)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench_runner import run_bench


def test_thp_bench_runs_both_settings_and_reports(tmp_path: Path) -> None:
    out = tmp_path / "report.md"
    run_bench(
        "bench.thp",
        "--runs",
        "1",
        "--records",
        "5000",
        "--passes",
        "1",
        "--dir",
        str(tmp_path),
        "--out",
        str(out),
    )
    text = out.read_text()
    for shape in ("users", "1p/1s", "read_arrow"):
        assert f"| {shape} |" in text
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert [len(r["runs_keep"]) for r in rows] == [1, 1, 1]
    assert all(r["rate_keep"] > 0 and r["rate_disable"] > 0 for r in rows)
