"""End-to-end check of the peer benchmark runner (``python -m bench.compare``) on small data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
IN_PROCESS = {"raw", "seglog", "seglog-arrow", "seglog-arrow-keyed", "lmdb", "lmdb-keyed", "sqlite"}
VALUE_SIZES = {100, 1024}
RUN_TIMEOUT_S = 600
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _run_compare(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> dict:
    out = tmp_path / "report.md"
    data_dir = tmp_path / "data"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.compare",
            "--quick",
            "--out",
            str(out),
            "--data-dir",
            str(data_dir),
            *args,
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert out.is_file()
    report = json.loads(out.with_suffix(".json").read_text())
    report["markdown"] = out.read_text()
    report["png"] = out.with_suffix(".png").read_bytes()
    report["stdout"] = proc.stdout
    assert list(data_dir.iterdir()) == [], "temp data dirs must be removed"
    return report


def test_quick_run_in_process_systems(tmp_path):
    report = _run_compare(tmp_path, "--systems", "in-process")
    rows = report["results"]
    assert {(r["system"], r["value_bytes"]) for r in rows} == {
        (s, size) for s in IN_PROCESS for size in VALUE_SIZES
    }
    for r in rows:
        label = f"{r['system']} S={r['value_bytes']}"
        assert r["status"] == "ok", f"{label}: {r['status']} {r['notes']}"
        assert r["verified"] is True, label
        assert r["records"] > 0, label
        for key in (
            "write_records_per_s",
            "write_mb_per_s",
            "ack_p50_ms",
            "ack_p99_ms",
            "read_records_per_s",
            "read_mb_per_s",
            "write_s",
            "read_s",
        ):
            assert r[key] > 0, f"{label}: {key}={r[key]}"
        assert r["ack_p99_ms"] >= r["ack_p50_ms"], label
        assert r["client_cpu_s"] >= 0, label
        assert r["server_cpu_s"] is None, label  # embedded: no server process
        assert r["durability"] and r["version"], label

    markdown = report["markdown"]
    assert "| system | S (B) | N | status | verified |" in markdown
    table_rows = [line for line in markdown.splitlines() if line.startswith("| ") and " ok |" in line]
    assert len(table_rows) == len(rows)
    assert all("| yes |" in line for line in table_rows)
    assert report["stdout"].strip() == markdown.strip()

    png = report["png"]
    assert png.startswith(PNG_MAGIC) and len(png) > 5_000


def test_unavailable_systems_are_rows_not_gaps(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path / "empty-bin")}  # no redis-server, java, nats-server
    report = _run_compare(
        tmp_path,
        "--systems",
        "raw,redis,nats,kafka",
        "--records",
        "2000",
        "--cache",
        str(tmp_path / "empty-cache"),
        env=env,
    )
    rows = {(r["system"], r["value_bytes"]): r for r in report["results"]}
    assert len(rows) == 4 * len(VALUE_SIZES)
    for size in VALUE_SIZES:
        assert rows[("raw", size)]["status"] == "ok"
        assert rows[("raw", size)]["records"] == 2000
        for system in ("redis", "nats", "kafka"):
            row = rows[(system, size)]
            assert row["status"].startswith("unavailable:"), row["status"]
            assert row["verified"] is False
            assert f"| {system} | {size} |" in report["markdown"]
    assert report["png"].startswith(PNG_MAGIC)
