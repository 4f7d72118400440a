"""The keys benchmark runs (quick mode) so it cannot rot; no timing is asserted."""

from __future__ import annotations

from pathlib import Path

from tests.bench_runner import run_bench


def test_keys_bench_quick_runs(tmp_path: Path) -> None:
    out = run_bench("bench.keys", "--quick", "--dir", str(tmp_path))
    assert "keyed records/s" in out and "read_key common p50 ms" in out
