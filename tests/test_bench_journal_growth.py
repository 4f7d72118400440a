"""Smoke test of ``python -m bench.journal_growth`` (both sides from this checkout, short runs)."""

from __future__ import annotations

from pathlib import Path

from tests.bench_runner import ROOT, run_bench


def test_journal_growth_bench_runs_and_reports(tmp_path: Path) -> None:
    out = tmp_path / "report.md"
    run_bench(
        "bench.journal_growth",
        "--before-tree",
        str(ROOT),
        "--runs",
        "1",
        "--seconds",
        "0.5",
        "--dir",
        str(tmp_path),
        "--out",
        str(out),
        timeout_s=300,
    )
    text = out.read_text()
    for figure in ("p50_ms", "p99_ms", "max_ms", "growth_max_ms", "checkpoint_max_ms"):
        assert f"| {figure} |" in text
    assert "| 1 | after |" in text and "| 1 | before |" in text
