"""The streams benchmark runs (a tiny quick mode) so it cannot rot; no timing is asserted."""

from __future__ import annotations

from pathlib import Path

from tests.bench_runner import run_bench


def test_streams_bench_quick_runs(tmp_path: Path) -> None:
    out = run_bench(
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
    )
    assert "| per-site | 20,000 |" in out and "| interleaved | 20,000 |" in out
    assert "second pass: topics known" in out
    for shape in ("| 1 | 1 | never | 3,000 |", "| 16 | 1 | never | 3,000 |", "| 16 | 4 | always | 3,000 |"):
        assert shape in out  # the fleet append A/B, each shape
    assert "compiled topic cache" in out  # the database stamped with the extension
    assert "| 16 | compiled |" in out and "| 16 | numpy |" in out  # stamp() alone, both caches


def test_net_streams_bench_runs(tmp_path: Path) -> None:
    """Every reader finds the same records (the bench raises otherwise)."""
    from bench.net_streams import markdown, run

    result = run(tmp_path, 20_000, 2_000, 1)
    assert result["matching"] > 0
    assert set(result["rows"]) == {"network, streams", "network, scan", "embedded, streams", "embedded, scan"}
    assert "| network, streams |" in markdown(result)
