"""End-to-end tests of the installed ``seglog`` command, run as a subprocess."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import seglog
import seglog.topics
from seglog.topics import topic_matches

SEGLOG = str(Path(sys.executable).parent / "seglog")
T0 = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z


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
    assert b"wildcard read         sensors/site03/+/temp -> 500 records of 20,000 from " in r.stdout
    assert b"3 subscribers x " in r.stdout and b"got 500 live records each" in r.stdout
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


def _write_topic_dbs(data: Path) -> list[seglog.Record]:
    """Two databases with the same records, ``withstreams`` stamping streams and ``plain`` not."""
    records = [
        seglog.Record(f"sensors/site{d % 3}/dev{d:03d}/{m}", b"%d" % i, ts=T0 + i)
        for i, (d, m) in enumerate((d, m) for _ in range(3) for d in range(60) for m in ("temp", "rpm"))
    ]
    records += [seglog.Record(f"$SYS/broker/{k}", b"s", ts=T0 + 2_000_000 + k) for k in range(5)]
    records += [seglog.Record("other", b"o", ts=T0 + 3_000_000)]

    async def write() -> None:
        async with seglog.open(data) as store:
            with_streams = await store.create_db(
                "withstreams", shards=2, lts_thresholds=seglog.topics.DEFAULT_LTS_THRESHOLDS
            )
            plain = await store.create_db("plain", shards=2)
            for db in (with_streams, plain):
                for k in range(0, len(records), 50):
                    await db.append(records[k : k + 50])

    asyncio.run(write())
    return records


def _docs(r: subprocess.CompletedProcess[bytes]) -> list[dict[str, object]]:
    assert r.returncode == 0, r.stderr
    return [json.loads(x) for x in r.stdout.splitlines()]


def test_consume_topic_filter_through_streams_and_by_scan(tmp_path: Path) -> None:
    data = str(tmp_path / "d")
    _write_topic_dbs(tmp_path / "d")
    everything = _docs(sh("consume", data, "withstreams"))
    assert _docs(sh("consume", data, "plain")) == everything  # same records, same places
    for topic_filter in (
        "sensors/+/+/temp",
        "sensors/site1/#",
        "sensors/site2/dev005/rpm",
        "#",
        "$SYS/#",
        "+",
    ):
        expected = [d for d in everything if topic_matches(topic_filter, str(d["topic"]))]
        assert expected, topic_filter
        streamed = sh("consume", data, "withstreams", "--topic", topic_filter)
        assert _docs(streamed) == expected, topic_filter
        scanned = sh("consume", data, "plain", "--topic", topic_filter)
        assert _docs(scanned) == expected, topic_filter
        assert b"wildcard read of" in streamed.stderr and b"filtered scan" in scanned.stderr
    # A selective filter reads a few of the streams, not all of them.
    streamed = sh("consume", data, "withstreams", "--topic", "sensors/+/+/temp")
    n_streams = int(streamed.stderr.split(b"wildcard read of ")[1].split()[0])
    n_all = int(
        sh("consume", data, "withstreams", "--topic", "#").stderr.split(b"wildcard read of ")[1].split()[0]
    )
    assert 0 < n_streams < n_all
    # With --shard, --from and --max, like a read without a filter.
    expected = [
        d for d in everything if d["shard"] == 1 and topic_matches("sensors/+/+/rpm", str(d["topic"]))
    ]
    for db in ("withstreams", "plain"):
        r = sh("consume", data, db, "--topic", "sensors/+/+/rpm", "--shard", "1", "--max", "7")
        assert _docs(r) == expected[:7]
        cut = int(str(expected[3]["offset"]))
        r = sh("consume", data, db, "--topic", "sensors/+/+/rpm", "--shard", "1", "--from", str(cut))
        assert _docs(r) == expected[3:]


def test_consume_topic_filter_group_and_errors(tmp_path: Path) -> None:
    data = str(tmp_path / "d")
    _write_topic_dbs(tmp_path / "d")
    expected = [
        d for d in _docs(sh("consume", data, "withstreams")) if topic_matches("$SYS/#", str(d["topic"]))
    ]
    first = _docs(sh("consume", data, "withstreams", "--topic", "$SYS/#", "--group", "g", "--max", "2"))
    rest = _docs(sh("consume", data, "withstreams", "--topic", "$SYS/#", "--group", "g"))
    assert len(expected) == 5 and sorted(first + rest, key=str) == sorted(expected, key=str)
    for bad in ("sensors/te+mp", "a/#/b", ""):
        r = sh("consume", data, "withstreams", "--topic", bad)
        assert r.returncode == 1 and r.stdout == b"", bad
        line = r.stderr.decode()
        assert line.startswith("seglog: error: ") and line.strip().count("\n") == 0, line


def test_network_consume_of_a_topic_filter_without_a_node_is_one_line() -> None:
    """``consume --url --topic`` reads streams over the network (tests/test_cli_net.py); with
    nothing listening it says so in one line."""
    r = sh("consume", "--url", "http://127.0.0.1:9", "db", "--topic", "sensors/+/temp")
    assert r.returncode == 1 and r.stderr.decode().count("\n") == 1
    assert b"ServerUnavailable" in r.stderr and b"connection refused" in r.stderr


def test_consume_topic_filter_while_another_process_owns_the_store(tmp_path: Path) -> None:
    """A locked store is read without the lock (seglog.follow): the filter is applied by a scan."""
    data = tmp_path / "d"
    _write_topic_dbs(data)
    expected = [d for d in _docs(sh("consume", str(data), "withstreams")) if str(d["topic"]).endswith("/rpm")]

    async def consume_while_locked() -> tuple[int, bytes, bytes]:
        async with seglog.open(data):
            proc = await asyncio.create_subprocess_exec(
                SEGLOG,
                "consume",
                str(data),
                "withstreams",
                "--topic",
                "sensors/+/+/rpm",
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await proc.communicate()
            return proc.returncode or 0, out, err

    code, out, err = asyncio.run(consume_while_locked())
    assert code == 0, err
    assert [json.loads(x) for x in out.splitlines()] == expected
    assert b"filtered scan (read-only: another process owns the store)" in err
