"""The keys benchmark runs (quick mode) so it cannot rot; no timing is asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_keys_bench_quick_runs(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.keys", "--quick", "--dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout
    assert "keyed records/s" in out and "read_key common p50 ms" in out
