"""The network benchmark runs (tiny sizes, no Kafka) so it cannot rot; no timing is asserted."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench_runner import ROOT, run_bench


def test_net_bench_tiny_run(tmp_path: Path) -> None:
    out = run_bench(
        "bench.net",
        "--quick",
        "--no-kafka",
        "--sizes",
        "100",
        "--records",
        "3000",
        "--batch",
        "500",
        "--e2e-seconds",
        "0.5",
        "--e2e-rate",
        "5000",
        "--out",
        str(tmp_path),
        "--dir",
        str(tmp_path),
        timeout_s=300,
    )
    assert "| produce | 100 B | 4 senders/16 shards | network Arrow (bench sender) |" in out
    assert "network Consumer.getmany_arrow" in out and "e2e p99 ms" in out
    data = json.loads(next(tmp_path.glob("quick-net-*.json")).read_text())
    rows = {(r["section"], r["shape"], r["system"]): r for r in data["rows"]}
    for (section, _, system), row in rows.items():
        if "Kafka" in system:
            assert row["status"].startswith("skipped"), row
        else:
            assert row["status"] == "ok", row
            assert row["records"] == (3000 if section != "e2e" else row["records"])
    e2e = [r for r in data["rows"] if r["section"] == "e2e"]
    assert [(r["shape"].split(",")[0], r["system"].split(" ->")[0]) for r in e2e] == [
        (shape, sender)
        for shape in ("1 shard", "16 shards")
        for sender in ("network Arrow", "Producer.send_arrow")
    ]
    assert all(r["records"] == 2500 for r in e2e)  # 5000 records/s for 0.5 s, all received


def test_net_tick_bench_runs_both_paths_and_a_before_side() -> None:
    tiny = ["--shards", "4", "--ticks", "5", "--runs", "1", "--before", str(ROOT)]
    for mode in ("rows", "producer"):
        out = run_bench("bench.net_tick", "--mode", mode, *tiny, timeout_s=300)
        assert "before: CPU per tick" in out and "after: CPU per tick" in out and "after / before" in out
