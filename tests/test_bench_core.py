"""The core benchmark runs (quick mode) so it cannot rot; no timing is asserted."""

from __future__ import annotations

from pathlib import Path

from tests.bench_runner import run_bench


def test_core_bench_quick_runs(tmp_path: Path) -> None:
    out = run_bench("bench.core", "--quick", "--dir", str(tmp_path))
    assert "raw write+fdatasync" in out and "seglog read_arrow" in out and "offset_for_time p50" in out
    assert "seglog read (Record) |" in out and "seglog read (Record), 1,000 per call" in out
