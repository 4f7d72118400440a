"""Smoke test of ``python -m bench.journal_growth`` (both sides from this checkout, short runs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_journal_growth_bench_runs_and_reports(tmp_path: Path) -> None:
    out = tmp_path / "report.md"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
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
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text()
    for figure in ("p50_ms", "p99_ms", "max_ms", "growth_max_ms"):
        assert f"| {figure} |" in text
    assert "| 1 | after |" in text and "| 1 | before |" in text
