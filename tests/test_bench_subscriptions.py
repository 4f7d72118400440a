"""The subscriptions benchmark runs (a tiny quick mode) so it cannot rot; no timing is asserted."""

from __future__ import annotations

from pathlib import Path

from tests.bench_runner import run_bench


def test_subscriptions_bench_quick_runs(tmp_path: Path) -> None:
    out = run_bench("bench.subscriptions", "--quick", "--seconds", "0.5", "--dir", str(tmp_path))
    rows = [line for line in out.splitlines() if line.startswith("| 200 |")]
    assert [r.split("|")[2].strip() for r in rows] == ["1", "100"]  # a task each, then selectors
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        # Every subscriber got its stream's records: 5 appends of 500 records, 20 subscribers a stream.
        assert cells[5] == "50,000"
        # One read per subscribed stream and append at most, never one per subscriber.
        assert float(cells[6]) <= 10 + 1
