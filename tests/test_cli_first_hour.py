"""The first hour of a CLI user, through the installed ``seglog`` command with real pipes and signals.

Each test names the issue item it covers: (1) demo never destroys data, (2) produce streams
piped input, (3) consume reads every shard, (4) read-only commands create nothing, (5) pipes
and terminals, (9) Kafka-tool parity.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from seglog._routing import shard_for
from tests.helpers import ChildLines, wait_pipe_drained

SEGLOG = str(Path(sys.executable).parent / "seglog")
WAIT_S = 60


def sh(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([SEGLOG, *args], input=stdin, capture_output=True, timeout=300)


def one_error_line(r: subprocess.CompletedProcess[bytes]) -> str:
    err = r.stderr.decode()
    assert r.returncode == 1, (r.returncode, err)
    assert err.count("\n") == 1 and err.startswith("seglog: error: ") and "Traceback" not in err, err
    return err


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``root`` with its size and mtime (ns).

    An LMDB ``lock.mdb`` is listed with its size only: a read-only reader registers in its
    reader table (that is how LMDB keeps reads safe beside a writer in another process).
    """
    return {
        str(p.relative_to(root)): (p.stat().st_size, 0 if p.name == "lock.mdb" else p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
    }


def topic_on_shard(shard: int, shards: int, prefix: str = "t") -> str:
    return next(
        f"{prefix}/{i}" for i in range(10_000) if shard_for(f"{prefix}/{i}".encode(), shards) == shard
    )


# --- 1. demo -----------------------------------------------------------------------------


def test_demo_refuses_directories_it_did_not_make(tmp_path: Path) -> None:
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("notes\n")
    err = one_error_line(sh("demo", str(precious), "--records", "1000", "--no-spark"))
    assert "refusing" in err and "not made by `seglog demo`" in err
    assert (precious / "notes.txt").read_text() == "notes\n" and sorted(os.listdir(precious)) == ["notes.txt"]
    # The sibling tier directory is protected the same way, and nothing else is created.
    fresh = tmp_path / "fresh"
    (tmp_path / "fresh-tier").mkdir()
    (tmp_path / "fresh-tier" / "keep.parquet").write_bytes(b"PAR1")
    err = one_error_line(sh("demo", str(fresh), "--records", "1000", "--no-spark"))
    assert "fresh-tier" in err
    assert not fresh.exists() and (tmp_path / "fresh-tier" / "keep.parquet").read_bytes() == b"PAR1"


def test_demo_reruns_over_its_own_directory(tmp_path: Path) -> None:
    data = tmp_path / "demo"
    for _ in range(2):
        r = sh("demo", str(data), "--records", "2000", "--no-spark")
        assert r.returncode == 0, r.stderr
        assert b"read_key" in r.stdout and b"Parquet objects" in r.stdout
    assert (data / ".seglog-demo").is_file() and (tmp_path / "demo-tier" / ".seglog-demo").is_file()


def test_demo_of_one_record_leaves_shards_empty_and_still_reports(tmp_path: Path) -> None:
    """Most shards get nothing: the demo samples offset_for_time on a shard that has records."""
    r = sh("demo", str(tmp_path / "one"), "--records", "1", "--no-spark")
    assert r.returncode == 0, r.stderr
    assert b"offset_for_time" in r.stdout and b"-> offset 0" in r.stdout


# --- 2. produce from a pipe ----------------------------------------------------------------


def test_produce_from_a_pipe_appends_within_the_linger_time(tmp_path: Path) -> None:
    data = str(tmp_path / "d")
    assert sh("produce", data, "live", "--topic", "t", stdin=b"first\n").returncode == 0
    producer = subprocess.Popen(
        [SEGLOG, "produce", data, "live", "--topic", "t", "--linger-ms", "50"],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    follower = subprocess.Popen(
        [SEGLOG, "consume", data, "live", "--follow", "--format", "raw"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert producer.stdin is not None and follower.stdout is not None
        out = ChildLines(follower.stdout, timeout_s=WAIT_S)
        assert out.next() == b"first\n"
        producer.stdin.write(b"second\nthird\n")
        producer.stdin.flush()
        # Seen while the producer's stdin is still open: 2 lines, far from a batch of 1000.
        assert out.take(2) == [b"second\n", b"third\n"]
        producer.stdin.close()
        assert producer.wait(timeout=WAIT_S) == 0
        assert (
            producer.stderr is not None
            and b"appended 2 records to live (shard 0: 2)" in producer.stderr.read()
        )
    finally:
        for p in (producer, follower):
            p.kill()
            p.wait(timeout=WAIT_S)


def test_produce_sigint_appends_what_was_read_and_exits_130(tmp_path: Path) -> None:
    data = str(tmp_path / "d")
    # A linger of 10 minutes: the lines are read but not yet appended when the signal comes.
    producer = subprocess.Popen(
        [SEGLOG, "produce", data, "sig", "--topic", "t", "--linger-ms", "600000"],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert producer.stdin is not None
        producer.stdin.write(b"".join(b"line %d\n" % i for i in range(7)))
        producer.stdin.flush()
        wait_pipe_drained(producer.stdin.fileno(), WAIT_S)  # the child has read them
        producer.send_signal(signal.SIGINT)  # one Ctrl-C, stdin still open
        _, err = producer.communicate(timeout=WAIT_S)
    finally:
        producer.kill()
        producer.wait(timeout=WAIT_S)
    assert producer.returncode == 130
    assert err.decode().strip() == "interrupted: appended 7 records to sig (shard 0: 7)"
    assert sh("consume", data, "sig", "--format", "raw").stdout == b"".join(
        b"line %d\n" % i for i in range(7)
    )


def test_produce_bad_line_names_the_file_line_and_what_was_stored(tmp_path: Path) -> None:
    data = str(tmp_path / "d")
    lines = tmp_path / "lines.txt"
    with lines.open("wb") as f:
        for i in range(1, 3001):
            f.write(b"x" * ((1 << 20) + 1) + b"\n" if i == 2501 else b"line %d\n" % i)
    r = sh("produce", data, "bad", "--topic", "t", "--file", str(lines))
    err = one_error_line(r)
    assert "line 2501: value is larger than max_record_bytes=1048576" in err
    assert "the 2500 records before it were appended to bad (shard 0: 2500), nothing after it" in err
    out = sh("consume", data, "bad", "--format", "raw").stdout.splitlines()
    assert out == [b"line %d" % i for i in range(1, 2501)]
    # --atomic validates the whole input first: nothing is stored, not even the database.
    r = sh("produce", data, "atomic", "--topic", "t", "--file", str(lines), "--atomic")
    err = one_error_line(r)
    assert "line 2501: value is larger" in err and "nothing was stored (--atomic)" in err
    assert not (tmp_path / "d" / "dbs" / "atomic").exists()
    r = sh("produce", data, "atomic", "--topic", "t", "--atomic", stdin=b"a\nb\n")
    assert r.returncode == 0 and b"appended 2 records to atomic" in r.stderr


# --- 3. consume every shard ---------------------------------------------------------------


def test_consume_reads_every_shard_merged_by_time_and_produce_reports_shards(tmp_path: Path) -> None:
    data = str(tmp_path / "d")
    on3, on1 = topic_on_shard(3, 4), topic_on_shard(1, 4)
    r = sh("produce", data, "t", "--topic", on3, "--shards", "4", stdin=b"a1\na2\n")
    assert r.returncode == 0 and r.stderr.decode().strip() == "appended 2 records to t (shard 3: 2)"
    assert sh("produce", data, "t", "--topic", on1, stdin=b"b3\nb4\n").returncode == 0
    assert sh("produce", data, "t", "--topic", on3, stdin=b"a5\n").returncode == 0
    r = sh("consume", data, "t", "--max", "3")
    docs = [json.loads(x) for x in r.stdout.splitlines()]
    assert [(d["shard"], d["value"]) for d in docs] == [(3, "a1"), (3, "a2"), (1, "b3")]
    r = sh("consume", data, "t", "--format", "raw")
    assert r.stdout == b"a1\na2\nb3\nb4\na5\n"  # every shard, in timestamp order
    assert sh("consume", data, "t", "--shard", "1", "--format", "raw").stdout == b"b3\nb4\n"
    assert sh("consume", data, "t", "--shard", "0").stdout == b""
    err = one_error_line(sh("consume", data, "t", "--from", "1"))
    assert "--from OFFSET needs --shard" in err
    assert sh("consume", data, "t", "--shard", "3", "--from", "1", "--format", "raw").stdout == b"a2\na5\n"
    r = sh("consume", data, "t", "--from-time", "2000-01-01T00:00:00", "--format", "raw")
    assert r.stdout == b"a1\na2\nb3\nb4\na5\n"


# --- 4. read-only commands create nothing ------------------------------------------------


def test_read_only_commands_and_failed_produces_create_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # restored after: later tests run `python -m tests.…` from the root
    one_error_line(sh("consume", "nonexist.db", "t"))
    one_error_line(sh("stats", "nonexist2.db"))
    one_error_line(sh("groups", "nonexist3.db", "t"))
    one_error_line(sh("consume", "nonexist4.db", "t", "--follow"))
    one_error_line(sh("produce", "nonexistent/dir/x.db", "db", "--topic", "t", stdin=b"x\n"))
    err = one_error_line(sh("produce", "fresh.db", "db", "--topic", "bad/#", stdin=b"x\n"))
    assert "--topic 'bad/#'" in err
    assert os.listdir(tmp_path) == []
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "mine.txt").write_text("mine")
    err = one_error_line(sh("produce", str(foreign), "db", "--topic", "t", stdin=b"x\n"))
    assert "not a seglog data directory" in err and os.listdir(foreign) == ["mine.txt"]
    # On a store: stats and groups change nothing at all.
    assert sh("produce", "d", "db", "--topic", "t", "--shards", "2", stdin=b"1\n2\n").returncode == 0
    assert sh("consume", "d", "db", "--group", "g", "--max", "1").returncode == 0
    before = tree(tmp_path / "d")
    assert sh("stats", "d").returncode == 0 and sh("groups", "d", "db").returncode == 0
    one_error_line(sh("consume", "d", "nodb"))
    assert tree(tmp_path / "d") == before


def test_stats_groups_and_consume_beside_a_running_producer(tmp_path: Path) -> None:
    data = str(tmp_path / "d")
    assert sh("produce", data, "busy", "--topic", "t", "--shards", "2", stdin=b"zero\n").returncode == 0
    producer = subprocess.Popen(
        [SEGLOG, "produce", data, "busy", "--topic", "t"], stdin=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert producer.stdin is not None
        producer.stdin.write(b"one\ntwo\n")
        producer.stdin.flush()
        follower = sh_wait(
            [SEGLOG, "consume", data, "busy", "--follow", "--max", "3", "--format", "raw", "--group", "g"]
        )
        assert follower == b"zero\none\ntwo\n"
        r = sh("stats", data, "--json")  # the producer holds the lock
        assert r.returncode == 0, r.stderr
        assert sum(row["end"] for row in json.loads(r.stdout)) == 3
        r = sh("consume", data, "busy", "--format", "raw")
        assert r.returncode == 0 and r.stdout == b"zero\none\ntwo\n"
        r = sh("groups", data, "busy", "--json")
        assert r.returncode == 0, r.stderr
        assert sum(g["lag"] for g in json.loads(r.stdout)) == 0
        producer.stdin.close()
        assert producer.wait(timeout=WAIT_S) == 0
    finally:
        producer.kill()
        producer.wait(timeout=WAIT_S)


def sh_wait(cmd: list[str]) -> bytes:
    r = subprocess.run(cmd, capture_output=True, timeout=WAIT_S)
    assert r.returncode == 0, r.stderr
    return r.stdout


# --- 5. pipes and terminals ---------------------------------------------------------------


def test_a_closed_stdout_ends_quietly(tmp_path: Path) -> None:
    data = str(tmp_path / "d")
    assert (
        sh(
            "produce", data, "db", "--topic", "t", stdin=b"".join(b"%d\n" % i for i in range(20_000))
        ).returncode
        == 0
    )
    seg = next((tmp_path / "d" / "dbs" / "db" / "shard-0000").glob("*.log"))
    for cmd in (["consume", data, "db"], ["inspect", "--records", str(seg)]):
        p = subprocess.Popen([SEGLOG, *cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert p.stdout is not None and p.stderr is not None
        assert p.stdout.readline()  # like `| head -1`
        p.stdout.close()
        err = p.stderr.read()
        assert p.wait(timeout=WAIT_S) == 0 and err == b"", (cmd, err)


def test_progress_bar_ends_its_line_before_an_error(tmp_path: Path) -> None:
    lines = tmp_path / "lines.txt"
    lines.write_bytes(b"".join(b"%d\n" % i for i in range(1500)) + b"x" * ((1 << 20) + 1) + b"\n")
    r = sh("produce", str(tmp_path / "d"), "db", "--topic", "t", "--file", str(lines), "--progress")
    assert r.returncode == 1
    err = r.stderr.decode()
    assert "produce" in err  # the bar was drawn
    assert any(line.startswith("seglog: error: line 1501: ") for line in err.split("\n")), err


def test_flags_debug_version_and_bounds(tmp_path: Path) -> None:
    r = sh("consume", str(tmp_path / "d"), "nodb", "--debug")  # after the command
    assert r.returncode != 0 and b"Traceback" in r.stderr
    r = sh("--version")
    assert r.returncode == 0 and r.stdout.decode().startswith("seglog 0.")
    for bad in (
        ["consume", "d", "db", "--max", "-1"],
        ["consume", "d", "db", "--max", "0"],
        ["consume", "d", "db", "--shard", "-1"],
        ["produce", "d", "db", "--topic", "t", "--batch", "0"],
    ):
        r = sh(*bad)
        assert r.returncode == 2 and b"must be >=" in r.stderr, bad


def test_json_output_tells_text_from_bytes(tmp_path: Path) -> None:
    data = str(tmp_path / "d")
    # The text "\xff" (4 characters) and the byte 0xff used to print the same.
    assert sh("produce", data, "db", "--topic", "t", stdin=b"\\xff\n\xff\nhello\n").returncode == 0
    values = [json.loads(x)["value"] for x in sh("consume", data, "db").stdout.splitlines()]
    assert values == ["\\xff", {"base64": base64.b64encode(b"\xff").decode()}, "hello"]
    values = [
        json.loads(x)["value"]
        for x in sh("consume", data, "db", "--value-format", "base64").stdout.splitlines()
    ]
    assert [base64.b64decode(v) for v in values] == [b"\\xff", b"\xff", b"hello"]


# --- 9. Kafka-tool parity -----------------------------------------------------------------


def test_produce_key_separator_and_headers(tmp_path: Path) -> None:
    data = str(tmp_path / "d")
    r = sh(
        "produce",
        data,
        "db",
        "--topic",
        "t",
        "--shards",
        "4",
        "--key-separator",
        ":",
        "--header",
        "ct=text/plain",
        "--header",
        "src=cli",
        stdin=b"dev1:21.5\ndev2:a:b\n",
    )
    assert r.returncode == 0, r.stderr
    docs = sorted(
        (json.loads(x) for x in sh("consume", data, "db").stdout.splitlines()), key=lambda d: d["key"]
    )
    assert [(d["key"], d["value"], d["shard"]) for d in docs] == [
        ("dev1", "21.5", shard_for(b"dev1", 4)),
        ("dev2", "a:b", shard_for(b"dev2", 4)),
    ]
    assert all(d["headers"] == {"ct": "text/plain", "src": "cli"} for d in docs)
    err = one_error_line(
        sh("produce", data, "db", "--topic", "t", "--key-separator", ":", stdin=b"k:v\nnokey\n")
    )
    assert "line 2: no key separator ':'" in err and "the 1 records before it were appended" in err
    assert sh("produce", data, "db", "--topic", "t", "--header", "novalue", stdin=b"x\n").returncode == 1


def test_inspect_records_prints_every_record(tmp_path: Path) -> None:
    data = str(tmp_path / "d")
    assert sh("produce", data, "db", "--topic", "s/1", "--key", "k", stdin=b"a\nb\nc\n").returncode == 0
    seg = next((tmp_path / "d" / "dbs" / "db" / "shard-0000").glob("*.log"))
    lines = [json.loads(x) for x in sh("inspect", "--records", str(seg)).stdout.splitlines()[:-1]]
    assert lines[0]["base_offset"] == 0 and lines[0]["records"] == 3
    assert [(d["offset"], d["topic"], d["key"], d["value"]) for d in lines[1:]] == [
        (0, "s/1", "k", "a"),
        (1, "s/1", "k", "b"),
        (2, "s/1", "k", "c"),
    ]


def test_groups_lists_lag_per_shard(tmp_path: Path) -> None:
    data = str(tmp_path / "d")
    on0, on1 = topic_on_shard(0, 2), topic_on_shard(1, 2)
    sh("produce", data, "db", "--topic", on0, "--shards", "2", stdin=b"".join(b"%d\n" % i for i in range(10)))
    sh("produce", data, "db", "--topic", on1, stdin=b"".join(b"%d\n" % i for i in range(4)))
    assert sh("consume", data, "db", "--group", "readers", "--shard", "0", "--max", "6").returncode == 0
    assert sh("consume", data, "db", "--group", "all").returncode == 0
    rows = json.loads(sh("groups", data, "db", "--json").stdout)
    assert rows == [
        {"group": "all", "shard": 0, "committed": 10, "end": 10, "lag": 0},
        {"group": "all", "shard": 1, "committed": 4, "end": 4, "lag": 0},
        {"group": "readers", "shard": 0, "committed": 6, "end": 10, "lag": 4},
        {"group": "readers", "shard": 1, "committed": None, "end": 4, "lag": 4},
    ]
    text = sh("groups", data, "db").stdout.decode()
    assert "readers" in text and "lag" in text
