"""The cluster benchmark runs (tiny sizes, one kill) so it cannot rot; no timing is asserted."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench_runner import run_bench


def test_cluster_bench_tiny_run(tmp_path: Path) -> None:
    out = run_bench(
        "bench.cluster",
        "--quick",
        "--no-kafka",
        "--sizes",
        "100",
        "--records",
        "2000",
        "--batch",
        "500",
        "--steady-shards",
        "4",
        "--steady-seconds",
        "0.5",
        "--steady-rate",
        "1000",
        "--kills",
        "1",
        "--out",
        str(tmp_path),
        "--dir",
        str(tmp_path),
        timeout_s=300,
    )
    for system in (
        "embedded append_arrow",
        "single node Producer",
        *(f"3-node cluster Producer acks={a}" for a in ("all", "quorum", "1")),
    ):
        assert f"| 100 B | {system} |" in out, system
    assert "e2e p99 ms" in out and "failover p50" in out
    data = json.loads(next(tmp_path.glob("quick-cluster-*.json")).read_text())
    produce = [r for r in data["rows"] if r["section"] == "produce"]
    assert len(produce) == 5
    assert all(r["status"] == "ok" and r["records"] == 2000 for r in produce), produce
    steady = [r for r in data["rows"] if r["section"] == "steady"]
    assert [r["status"] for r in steady] == ["ok", "ok"]
    assert all(r["records"] == 500 for r in steady)  # 1000 records/s for 0.5 s, all received
    failover = data["failover"]
    assert failover["status"] == "ok" and len(failover["kills"]) == 1
    kill = failover["kills"][0]
    assert kill["failover_ms"] is not None and kill["lost"] == 0 and kill["checked"] > 0
    assert failover["final_lost"] == 0 and failover["final_checked"] >= kill["checked"]
