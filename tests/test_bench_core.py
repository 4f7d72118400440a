"""The core benchmark runs (quick mode) so it cannot rot; no timing is asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_core_bench_quick_runs(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.core", "--quick", "--dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout
    assert "raw write+fdatasync" in out and "seglog read_arrow" in out and "offset_for_time p50" in out
    assert "seglog read (Record) |" in out and "seglog read (Record), 1,000 per call" in out
