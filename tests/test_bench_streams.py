"""The streams benchmark runs (a tiny quick mode) so it cannot rot; no timing is asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_streams_bench_quick_runs(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.streams",
            "--quick",
            "--records",
            "20000",
            "--append-records",
            "4000",
            "--topics",
            "2000",
            "--fleet-records",
            "3000",
            "--fleet-topics",
            "500",
            "--dir",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout
    assert "| per-site | 20,000 |" in out and "| interleaved | 20,000 |" in out
    assert "second pass: topics known" in out
    assert "| 1 | 3,000 |" in out and "| 16 | 3,000 |" in out  # the fleet append A/B
    assert "compiled topic cache" in out  # the database stamped with the extension
    assert "| 16 | compiled |" in out and "| 16 | numpy |" in out  # stamp() alone, both caches
