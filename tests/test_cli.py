"""End-to-end tests of the installed ``seglog`` command, run as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SEGLOG = str(Path(sys.executable).parent / "seglog")


def sh(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([SEGLOG, *args], input=stdin, capture_output=True, timeout=300)


def test_help_on_every_command() -> None:
    for cmd in ([], ["demo"], ["produce"], ["consume"], ["inspect"], ["stats"]):
        r = sh(*cmd, "--help")
        assert r.returncode == 0 and b"usage: seglog" in r.stdout


def test_produce_consume_stats_inspect(tmp_path: Path) -> None:
    data = str(tmp_path / "d")
    lines = b"".join(f"line {i}\n".encode() for i in range(2500))
    r = sh("produce", data, "db1", "--topic", "cli/test", "--shard", "0", "--shards", "2", stdin=lines)
    assert r.returncode == 0, r.stderr
    r = sh("consume", data, "db1", "--shard", "0", "--from", "10", "--max", "3")
    docs = [json.loads(x) for x in r.stdout.splitlines()]
    assert [(d["offset"], d["value"], d["topic"]) for d in docs] == [
        (10 + i, f"line {10 + i}", "cli/test") for i in range(3)
    ]
    r = sh("consume", data, "db1", "--shard", "0", "--format", "raw")
    assert r.stdout == lines
    r = sh("consume", data, "db1", "--shard", "0", "--from-time", "2000-01-01T00:00:00", "--max", "1")
    assert json.loads(r.stdout)["offset"] == 0
    r = sh("stats", data, "--json")
    rows = json.loads(r.stdout)
    assert {(x["db"], x["shard"], x["end"]) for x in rows} == {("db1", 0, 2500), ("db1", 1, 0)}
    seg = next((tmp_path / "d" / "dbs" / "db1" / "shard-0000").glob("*.log"))
    r = sh("inspect", str(seg), "-q")
    assert r.returncode == 0 and b"2500 records" in r.stdout
    with seg.open("r+b") as f:  # flip a byte inside the last frame's body
        f.seek(os.path.getsize(seg) - 20)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 1]))
    r = sh("inspect", str(seg), "-q")
    assert r.returncode == 1 and b"corrupt" in r.stderr


def test_consume_group_resumes_where_it_committed(tmp_path: Path) -> None:
    data = str(tmp_path / "d")
    sh("produce", data, "g", "--topic", "t", stdin=b"".join(b"r%d\n" % i for i in range(10)))
    first = sh("consume", data, "g", "--group", "readers", "--max", "4", "--format", "raw")
    assert first.stdout == b"r0\nr1\nr2\nr3\n"
    rest = sh("consume", data, "g", "--group", "readers", "--format", "raw")
    assert rest.stdout == b"".join(b"r%d\n" % i for i in range(4, 10))


def test_errors_are_one_line(tmp_path: Path) -> None:
    r = sh("consume", str(tmp_path / "d"), "no-such-db")
    assert r.returncode == 1
    assert r.stderr.decode().strip().count("\n") == 0 and "does not exist" in r.stderr.decode()
    r = sh("consume", str(tmp_path / "d"), "../evil")
    assert r.returncode == 1 and b"invalid database name" in r.stderr and b"Traceback" not in r.stderr
    r = sh("--debug", "consume", str(tmp_path / "d"), "no-such-db")
    assert b"Traceback" in r.stderr


def test_demo_small_with_spark_pipeline(tmp_path: Path) -> None:
    r = sh("demo", str(tmp_path / "demo"), "--records", "20000")
    assert r.returncode == 0, r.stderr
    assert b"read_key" in r.stdout and b"records/s" in r.stdout and b"Parquet objects" in r.stdout
    assert b"Spark job" in r.stdout
    chart = tmp_path / "demo-sites.png"
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tier_command_and_stats(tmp_path: Path) -> None:
    data = str(tmp_path / "d")
    tier = f"file://{tmp_path / 'tier'}"
    sh(
        "produce",
        data,
        "db1",
        "--topic",
        "t/x",
        "--shard",
        "0",
        stdin=b"".join(b"%d\n" % i for i in range(500)),
    )
    r = sh("tier", data, "db1", "--tier", tier, "--seal")
    assert r.returncode == 0, r.stderr
    assert b"committed db1/shard=0/" in r.stdout and b"500 rows" in r.stdout
    rows = json.loads(sh("stats", data, "--json", "--tier", tier).stdout)
    assert rows[0]["cold"] > 0 and rows[0]["end"] == 500
    r = sh("tier", data, "db1")
    assert r.returncode == 1 and b"--tier is required" in r.stderr
