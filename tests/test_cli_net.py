"""The network commands (``seglog admin|produce|consume --url``) against real ``seglog serve``
processes, each command run as the installed ``seglog`` script in a subprocess."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Final

import pytest
import trustme

from seglog.topics import topic_matches
from tests.etcd_fixtures import EtcdProcess
from tests.helpers import ChildLines, foreign_server
from tests.server_fixtures import ServerFactory, ServerProcess

SEGLOG: Final = str(Path(sys.executable).parent / "seglog")
WAIT_S: Final = 60.0  # bound on waits for an event (a line, an exit), never a measured duration
TS0: Final = 1_700_000_000_000_000
ADMIN: Final = "admin-token-0123456789abcdef"
READER: Final = "reader-token-0123456789abcd"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SEGLOG_TOKEN"}
    env.update(extra)
    return env


def sh(
    *args: str, stdin: bytes | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [SEGLOG, *args], input=stdin, capture_output=True, timeout=WAIT_S, env=env or _env()
    )


def ok(r: subprocess.CompletedProcess[bytes]) -> str:
    assert r.returncode == 0, r.stderr.decode()
    assert b"Traceback" not in r.stderr
    return r.stdout.decode()


def one_error_line(r: subprocess.CompletedProcess[bytes], error_class: str) -> str:
    """The command failed with exactly one stderr line ``seglog: <error_class>: ...``."""
    err = r.stderr.decode()
    assert r.returncode == 1, (r.returncode, err)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"seglog: {error_class}: "), err
    return err


def docs(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


def lines_file(tmp_path: Path, recs: list[dict[str, Any]], name: str = "in.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def make(n: int, start: int = 0) -> list[dict[str, Any]]:
    """JSON records as `seglog consume` prints them: text, base64 bytes, headers, no key."""
    out: list[dict[str, Any]] = []
    for i in range(start, start + n):
        rec: dict[str, Any] = {"topic": f"sensors/s{i % 3}/temp", "value": f"v{i}", "ts": TS0 + i}
        if i % 4 == 0:
            rec["key"] = f"k{i % 5}"
        if i % 7 == 0:
            rec["value"] = {"base64": "AP8="}  # not UTF-8: bytes 00 ff
            rec["headers"] = {"unit": "C"}
        out.append(rec)
    return out


def shape(d: dict[str, Any]) -> tuple[Any, ...]:
    """What a record is, whatever its shard and offset."""
    return (d["topic"], json.dumps(d.get("value")), d.get("ts"), d.get("key"), json.dumps(d.get("headers")))


def create(server: ServerProcess, db: str, shards: int, *extra: str) -> None:
    ok(sh("admin", "--url", server.url, "create", db, "--shards", str(shards), *extra))


def test_admin_create_list_describe_configure_drop(server: ServerProcess) -> None:
    url = server.url
    out = ok(sh("admin", "--url", url, "create", "orders", "--shards", "3", "--compression", "zstd"))
    assert out == "created orders: 3 shards, engine segment\n"
    # The connection options may also follow the action; --set takes any setting.
    ok(
        sh(
            "admin",
            "create",
            "logs",
            "--url",
            url,
            "--set",
            "retention_ms=3600000",
            "--set",
            "segment_bytes=65536",
        )
    )
    assert ok(sh("admin", "--url", url, "list")).split() == ["logs", "orders"]
    assert json.loads(ok(sh("admin", "--url", url, "list", "--json"))) == ["logs", "orders"]
    desc = json.loads(ok(sh("admin", "--url", url, "describe", "orders")))
    assert desc["shards"] == 3 and desc["config"]["compression"] == "zstd"
    assert [o["end"] for o in desc["offsets"]] == [0, 0, 0]
    logs = json.loads(ok(sh("admin", "--url", url, "describe", "logs")))["config"]
    assert (logs["retention_ms"], logs["segment_bytes"]) == (3_600_000, 65536)
    assert json.loads(ok(sh("admin", "--url", url, "configure", "logs", "--set", "retention_ms=null"))) == {
        "retention_ms": None
    }
    one_error_line(sh("admin", "--url", url, "create", "orders", "--shards", "3"), "DatabaseExists")
    ok(sh("admin", "--url", url, "create", "orders", "--shards", "3", "--exist-ok"))
    one_error_line(
        sh("admin", "--url", url, "create", "orders", "--shards", "2", "--exist-ok"), "ConfigMismatch"
    )
    assert ok(sh("admin", "--url", url, "drop", "logs")) == "dropped logs\n"
    assert ok(sh("admin", "--url", url, "list")) == "orders\n"
    stats = json.loads(ok(sh("admin", "--url", url, "stats", "--json")))
    assert [s["shard"] for s in stats["orders"]] == [0, 1, 2]
    one_error_line(sh("admin", "--url", url, "describe", "../x"), "InvalidName")
    one_error_line(sh("admin", "list"), "InvalidArgument")  # no --url
    # A URL that cannot name a node is refused before any request (a non-numeric port used to
    # reach aiohttp and come back as a ServerUnavailable that repeated the URL).
    for bad in ("ftp://x", "http://127.0.0.1:notaport", "http://127.0.0.1:70000", "http://:7070"):
        err = one_error_line(sh("admin", "--url", bad, "list"), "InvalidArgument")
        assert "url must be http://HOST:PORT" in err, err


def test_produce_file_then_consume_returns_the_same_records(server: ServerProcess, tmp_path: Path) -> None:
    create(server, "t", 3)
    recs = make(250)
    src = lines_file(tmp_path, recs)
    # Small batches: many requests, some cut by bytes rather than lines.
    r = sh("produce", "--url", server.url, "t", "--file", str(src), "--batch", "40", "--batch-bytes", "2000")
    ok(r)
    summary = r.stderr.decode()
    assert summary.startswith("produced 250 records to t (shard 0: ") and summary.count("\n") == 1
    got = docs(ok(sh("consume", "--url", server.url, "t")))
    assert len(got) == 250
    assert all(list(d) == ["shard", "offset", "ts", "topic", "key", "value", "headers"] for d in got)
    assert sorted(map(shape, got)) == sorted(map(shape, recs))
    # Each shard in offset order, offsets dense from 0; the shards merged by timestamp, as the
    # local command prints them (the records' ts rise with their order in the file).
    for shard in range(3):
        offsets = [d["offset"] for d in got if d["shard"] == shard]
        assert offsets == list(range(len(offsets)))
    assert [d["ts"] for d in got] == sorted(d["ts"] for d in got)
    assert len({d["shard"] for d in got[:10]}) > 1  # interleaved, not one shard after another
    # What consume prints, produce takes back (a copy through another database).
    create(server, "copy", 3)
    ok(
        sh(
            "produce",
            "--url",
            server.url,
            "copy",
            stdin="".join(
                json.dumps({k: d[k] for k in ("topic", "value", "ts", "key", "headers")}) + "\n" for d in got
            ).encode(),
        )
    )
    copied = docs(ok(sh("consume", "--url", server.url, "copy")))
    assert sorted(map(shape, copied)) == sorted(map(shape, got))
    # --max, one shard, raw values.
    assert len(docs(ok(sh("consume", "--url", server.url, "t", "--max", "7")))) == 7
    only = docs(ok(sh("consume", "--url", server.url, "t", "--shard", "1", "--shard", "2")))
    assert {d["shard"] for d in only} == {1, 2} and len(only) == 250 - sum(d["shard"] == 0 for d in got)
    assert [d["ts"] for d in only] == sorted(d["ts"] for d in only)
    raw = ok(sh("consume", "--url", server.url, "t", "--shard", "0", "--format", "raw", "--max", "1"))
    assert raw.count("\n") == 1
    # --latest: nothing before the start; --shard past the end: one line.
    assert ok(sh("consume", "--url", server.url, "t", "--latest")) == ""
    one_error_line(sh("consume", "--url", server.url, "t", "--shard", "3"), "InvalidArgument")


def test_consume_a_topic_filter_through_streams(server: ServerProcess, tmp_path: Path) -> None:
    """``consume --url URL DB --topic FILTER`` prints exactly the matching records (through the
    node's streams API); the options that make no sense with it get one line."""
    create(server, "s", 3, "--set", "lts_thresholds=[100, 10]")
    recs = make(300)
    ok(sh("produce", "--url", server.url, "s", "--file", str(lines_file(tmp_path, recs))))
    every = docs(ok(sh("consume", "--url", server.url, "s")))
    for topic_filter in ("sensors/s1/temp", "sensors/+/temp", "#", "other/#"):
        got = docs(ok(sh("consume", "--url", server.url, "s", "--topic", topic_filter)))
        want = [d for d in every if topic_matches(topic_filter, d["topic"])]
        assert sorted(map(shape, got)) == sorted(map(shape, want)), topic_filter
        assert len({(d["shard"], d["offset"]) for d in got}) == len(got)
    assert len(docs(ok(sh("consume", "--url", server.url, "s", "--topic", "#", "--max", "9")))) == 9
    only = docs(ok(sh("consume", "--url", server.url, "s", "--topic", "#", "--shard", "2")))
    assert {d["shard"] for d in only} == {2} and len(only) == sum(d["shard"] == 2 for d in every)
    one_error_line(sh("consume", "--url", server.url, "s", "--topic", "#", "--group", "g"), "InvalidArgument")
    one_error_line(sh("consume", "--url", server.url, "s", "--topic", "#", "--latest"), "InvalidArgument")
    one_error_line(sh("consume", "--url", server.url, "s", "--topic", "a/#/b"), "InvalidTopicFilter")
    create(server, "plain", 1)
    one_error_line(sh("consume", "--url", server.url, "plain", "--topic", "#"), "InvalidArgument")


def test_produce_to_one_shard_and_a_bad_line(server: ServerProcess, tmp_path: Path) -> None:
    create(server, "b", 2)
    good = [json.dumps(r) for r in make(4)]
    text = "\n".join([*good[:2], "", *good[2:], '{"topic": "x"}', good[0]]) + "\n"
    r = sh("produce", "--url", server.url, "b", "--shard", "1", "--batch", "3", stdin=text.encode())
    err = one_error_line(r, "InvalidRecord")
    # Line 6 (blank lines count): the 4 lines before it are stored, nothing after it.
    assert (
        "line 6: value is missing; the 4 records before line 6 were produced to b (shard 1: 4 at 0..3)" in err
    )
    assert "nothing from line 6 on" in err
    got = docs(ok(sh("consume", "--url", server.url, "b")))
    assert [(d["shard"], d["offset"]) for d in got] == [(1, i) for i in range(4)]
    one_error_line(sh("produce", "--url", server.url, "b", "--shard", "2", stdin=b""), "InvalidArgument")
    one_error_line(sh("produce", "--url", server.url, "b", stdin=b"not json\n"), "InvalidRecord")


def test_consume_group_commits_and_a_second_run_continues(server: ServerProcess, tmp_path: Path) -> None:
    create(server, "g", 2)
    recs = make(30)
    ok(sh("produce", "--url", server.url, "g", "--file", str(lines_file(tmp_path, recs))))
    first = docs(ok(sh("consume", "--url", server.url, "g", "--group", "readers", "--max", "12")))
    assert len(first) == 12
    rest = docs(ok(sh("consume", "--url", server.url, "g", "--group", "readers")))
    assert len(rest) == 18
    seen = {(d["shard"], d["offset"]) for d in first + rest}
    assert len(seen) == 30 and sorted(map(shape, first + rest)) == sorted(map(shape, recs))
    # Each shard continued right after the first run's last printed offset.
    for shard in (0, 1):
        printed = [d["offset"] for d in first if d["shard"] == shard]
        continued = [d["offset"] for d in rest if d["shard"] == shard]
        if printed and continued:
            assert continued[0] == printed[-1] + 1
    assert ok(sh("consume", "--url", server.url, "g", "--group", "readers")) == ""
    # Another group starts from the beginning.
    assert len(docs(ok(sh("consume", "--url", server.url, "g", "--group", "others")))) == 30


def stop_following(child: subprocess.Popen[bytes], out: ChildLines, sig: signal.Signals) -> None:
    """Signal a following ``consume``: it exits 0, printing nothing more, nothing on stderr."""
    assert child.stderr is not None
    child.send_signal(sig)
    assert child.wait(WAIT_S) == 0
    assert out.next() == b""
    err = child.stderr.read().decode()
    assert "Traceback" not in err and err == "", err


@pytest.mark.parametrize(("sig", "group"), [(signal.SIGINT, None), (signal.SIGTERM, "tail")])
def test_follow_prints_later_records_and_stops_cleanly(
    server: ServerProcess, tmp_path: Path, sig: signal.Signals, group: str | None
) -> None:
    create(server, "f", 2)
    ok(sh("produce", "--url", server.url, "f", stdin=json.dumps(make(1)[0]).encode()))
    cmd = [SEGLOG, "consume", "--url", server.url, "f", "--follow"]
    if group is not None:
        cmd += ["--group", group]
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
    try:
        assert child.stdout is not None and child.stderr is not None
        out = ChildLines(child.stdout, timeout_s=WAIT_S)
        assert shape(json.loads(out.next())) == shape(make(1)[0])  # it reads: it is tailing now
        later = make(5, start=1)
        ok(sh("produce", "--url", server.url, "f", "--file", str(lines_file(tmp_path, later))))
        got = [json.loads(out.next()) for _ in later]
        assert sorted(map(shape, got)) == sorted(map(shape, later))
        with pytest.raises(queue.Empty):
            out.next(timeout_s=0.2)  # nothing more, and still running
        assert child.poll() is None
        stop_following(child, out, sig)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(WAIT_S)
    if group is not None:  # it committed what it printed
        assert ok(sh("consume", "--url", server.url, "f", "--group", group)) == ""


def test_admin_generations(server: ServerProcess, tmp_path: Path) -> None:
    create(server, "g", 2, "--set", "lts_thresholds=[100, 10]")
    ok(sh("produce", "--url", server.url, "g", "--file", str(lines_file(tmp_path, make(10)))))
    one = ok(sh("admin", "--url", server.url, "generations", "g"))
    assert one == "generation 1 (current): shard 0 from 0, shard 1 from 0\n"
    added = ok(sh("admin", "--url", server.url, "add-generation", "g"))
    assert added.startswith("added generation 2 (current): shard 0 from ")
    lines = ok(sh("admin", "--url", server.url, "generations", "g")).splitlines()
    assert lines[0].startswith("generation 1 (closed): shard 0 0..") and lines[1].startswith(
        "generation 2 (current)"
    )
    one_error_line(sh("admin", "--url", server.url, "drop-generation", "g", "2"), "CurrentGeneration")
    one_error_line(sh("admin", "--url", server.url, "drop-generation", "g", "9"), "UnknownGeneration")
    dropped = ok(sh("admin", "--url", server.url, "drop-generation", "g", "1"))
    assert dropped.startswith("dropped generation 1 of g; freed ")
    assert ok(sh("admin", "--url", server.url, "generations", "g")).startswith("generation 1 (dropped)")


def test_follow_a_topic_filter_prints_matching_later_records(server: ServerProcess, tmp_path: Path) -> None:
    """``consume --url --topic F --follow`` long-polls each stream, picks up streams learned
    after it started, prints only what matches, and stops with exit 0 on SIGTERM."""
    create(server, "ft", 2, "--set", "lts_thresholds=[100, 10]")
    first = {"topic": "sensors/s1/temp", "value": "v0", "ts": TS0}
    ok(sh("produce", "--url", server.url, "ft", stdin=json.dumps(first).encode()))
    cmd = [SEGLOG, "consume", "--url", server.url, "ft", "--follow", "--topic", "sensors/#"]
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
    try:
        assert child.stdout is not None and child.stderr is not None
        out = ChildLines(child.stdout, timeout_s=WAIT_S)
        assert shape(json.loads(out.next())) == shape(first)  # it reads: it is following now
        # A topic of a stream learned after the start, one of a known stream, one not matching.
        later = [
            {"topic": "sensors/s9/new", "value": "v1", "ts": TS0 + 1},
            {"topic": "elsewhere/x", "value": "v2", "ts": TS0 + 2},
            {"topic": "sensors/s1/temp", "value": "v3", "ts": TS0 + 3},
        ]
        ok(sh("produce", "--url", server.url, "ft", "--file", str(lines_file(tmp_path, later))))
        got = [json.loads(out.next()) for _ in range(2)]
        assert sorted(map(shape, got)) == sorted(map(shape, [later[0], later[2]]))
        stop_following(child, out, signal.SIGTERM)  # the non-matching record was never printed
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(WAIT_S)


def test_auth_tokens(server_factory: ServerFactory, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{ADMIN} ops admin\n{READER} reader read\n")
    server = server_factory("--tokens", str(tokens))
    url = server.url
    err = one_error_line(sh("admin", "--url", url, "list"), "AuthenticationFailed")
    assert ADMIN not in err
    one_error_line(
        sh("admin", "--url", url, "--token", "wrong-token-0123456789abc", "list"), "AuthenticationFailed"
    )
    one_error_line(
        sh("admin", "--url", url, "list", env=_env(SEGLOG_TOKEN="wrong-token-0123456789abc")),
        "AuthenticationFailed",
    )
    # SEGLOG_TOKEN works; --token wins over it.
    ok(sh("admin", "--url", url, "create", "s", "--shards", "2", env=_env(SEGLOG_TOKEN=ADMIN)))
    one_error_line(
        sh("admin", "--url", url, "--token", READER, "drop", "s", env=_env(SEGLOG_TOKEN=ADMIN)),
        "PermissionDenied",
    )
    one_error_line(
        sh("produce", "--url", url, "s", "--token", READER, stdin=json.dumps(make(1)[0]).encode()),
        "PermissionDenied",
    )
    one_error_line(sh("produce", "--url", url, "s", stdin=b""), "AuthenticationFailed")
    one_error_line(sh("consume", "--url", url, "s"), "AuthenticationFailed")
    ok(sh("produce", "--url", url, "s", stdin=json.dumps(make(1)[0]).encode(), env=_env(SEGLOG_TOKEN=ADMIN)))
    assert len(docs(ok(sh("consume", "--url", url, "s", env=_env(SEGLOG_TOKEN=READER))))) == 1
    assert ok(sh("admin", "--url", url, "--token", READER, "list")) == "s\n"


def test_unknown_database_and_connection_refused(server: ServerProcess) -> None:
    for cmd in (
        ("consume", "--url", server.url, "nope"),
        ("produce", "--url", server.url, "nope"),
        ("admin", "--url", server.url, "describe", "nope"),
        ("admin", "--url", server.url, "drop", "nope"),
    ):
        err = one_error_line(sh(*cmd, stdin=b""), "DatabaseNotFound")
        assert "nope" in err
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = f"http://127.0.0.1:{port}"
    for cmd in (
        ("admin", "--url", dead, "list"),
        ("consume", "--url", dead, "x"),
        ("produce", "--url", dead, "x"),
    ):
        err = one_error_line(sh(*cmd, stdin=b""), "ServerUnavailable")
        assert f"cannot connect to 127.0.0.1:{port}: connection refused" in err
    one_error_line(sh("admin", "--url", "localhost:7070", "list"), "InvalidArgument")
    # --debug shows the traceback instead.
    assert b"Traceback" in sh("--debug", "admin", "--url", dead, "list").stderr


def test_tls_with_cacert(server_factory: ServerFactory, tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_file, key_file, ca_file = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    cert.private_key_pem.write_to_path(str(key_file))
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    ca.cert_pem.write_to_path(str(ca_file))
    server = server_factory("--tls-cert", str(cert_file), "--tls-key", str(key_file))
    assert server.url.startswith("https://")
    create_cmd = ("admin", "--url", server.url, "--cacert", str(ca_file), "create", "t")
    ok(sh(*create_cmd))
    ok(
        sh(
            "produce",
            "--url",
            server.url,
            "--cacert",
            str(ca_file),
            "t",
            stdin=json.dumps(make(1)[0]).encode(),
        )
    )
    got = docs(ok(sh("consume", "--url", server.url, "--cacert", str(ca_file), "t")))
    assert [shape(d) for d in got] == [shape(make(1)[0])]
    err = one_error_line(sh("admin", "--url", server.url, "list"), "ServerUnavailable")  # CA not trusted
    assert "TLS" in err or "certificate" in err


def test_embedded_commands_are_unchanged_beside_the_network_ones(tmp_path: Path) -> None:
    data = str(tmp_path / "d")
    ok(sh("produce", data, "e", "--topic", "t", stdin=b"a\nb\n"))
    assert ok(sh("consume", data, "e", "--format", "raw")) == "a\nb\n"
    r = sh("consume", str(tmp_path / "missing"), "e")
    assert r.returncode == 1 and r.stderr.decode().startswith("seglog: error: ")
    assert b"--url URL" in sh("produce", "--help").stdout
    assert b"usage: seglog consume" in sh("consume", "--url", "http://x", "--help").stdout


def test_demo_network_step(tmp_path: Path) -> None:
    data = tmp_path / "demo"
    for _ in range(2):  # a rerun reuses the node directory it made
        out = ok(sh("demo", str(data), "--records", "3000", "--net-records", "2000", "--no-spark"))
        assert "produced (Producer)            2,000 records" in out
        assert "consumed (HTTP arrow)          2,000 records" in out
        assert "sent = acknowledged = consumed = 2,000" in out and "stopped with SIGTERM" in out
        # The wildcard read through the node's streams found every matching record sent.
        assert re.search(
            r"wildcard \(HTTP\) +sensors/site03/\+/temp -> [1-9][\d,]* records from \d+ streams", out
        )
        assert re.search(r"wildcard = [1-9][\d,]* matching", out)
    assert (tmp_path / "demo-node" / ".seglog-demo").is_file()
    assert (tmp_path / "demo-node" / "data" / "seglog.json").is_file()
    # A node directory the demo did not make is refused, and nothing is touched.
    (tmp_path / "x-node").mkdir()
    (tmp_path / "x-node" / "keep").write_text("keep\n")
    r = sh("demo", str(tmp_path / "x"), "--records", "1000", "--no-spark")
    assert r.returncode == 1 and b"x-node" in r.stderr and not (tmp_path / "x").exists()
    assert sorted(os.listdir(tmp_path / "x-node")) == ["keep"]


def test_serve_with_an_etcd_url_that_is_not_etcd_says_what_answered(tmp_path: Path) -> None:
    """``--etcd`` pointing at some web page: one line naming the page's reply, exit 1."""

    async def main() -> tuple[int, bytes]:
        async with foreign_server("html") as page:
            proc = await asyncio.create_subprocess_exec(
                SEGLOG,
                "serve",
                str(tmp_path / "n"),
                "--listen",
                "127.0.0.1:0",
                "--etcd",
                page,
                "--node-id",
                "1",
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=_env(),
            )
            _, err = await asyncio.wait_for(proc.communicate(), WAIT_S)
            assert proc.returncode is not None
            return proc.returncode, err

    code, err = asyncio.run(main())
    text = err.decode()
    assert code == 1, text
    assert text.count("\n") == 1 and "Traceback" not in text, text
    assert (
        text.startswith("seglog: error: etcd ")
        and "not etcd's" in text
        and "a web page of another service" in text
    ), text


def test_a_url_that_is_not_a_node_is_one_remote_error_line() -> None:
    """``--url`` of some other web service: its 200 page is not misread as a reply."""

    async def main() -> list[subprocess.CompletedProcess[bytes]]:
        async with foreign_server("json") as page:
            return [
                await asyncio.to_thread(sh, "admin", "--url", page, "list"),
                await asyncio.to_thread(
                    sh, "produce", "--url", page, "t", stdin=b'{"topic": "a", "value": "v"}\n'
                ),
            ]

    for r in asyncio.run(main()):
        err = one_error_line(r, "RemoteError")
        assert "not a seglog node" in err and "something else" in err, err


def test_replicated_database_on_a_cluster_node(server_factory: ServerFactory, etcd: EtcdProcess) -> None:
    node = server_factory("--etcd", etcd.url, "--node-id", "1", "--node-ttl-s", "2")
    url = node.url
    out = ok(
        sh(
            "admin",
            "--url",
            url,
            "create",
            "r",
            "--shards",
            "2",
            "--replication-factor",
            "1",
            "--min-insync",
            "1",
        )
    )
    assert out == "created r: 2 shards, replication factor 1, min_insync 1\n"
    assert (
        ok(
            sh(
                "admin",
                "--url",
                url,
                "create",
                "r",
                "--shards",
                "2",
                "--replication-factor",
                "1",
                "--min-insync",
                "1",
                "--exist-ok",
            )
        )
        == "exists: r: 2 shards\n"
    )
    line = json.dumps(make(2)[1]).encode()
    # The node creates its copy and is elected leader asynchronously: retry until it leads.
    deadline = time.monotonic() + WAIT_S
    while True:
        r = sh("produce", "--url", url, "r", "--shard", "1", "--acks", "all", stdin=line)
        if r.returncode == 0 or time.monotonic() > deadline:
            break
        assert r.stderr.decode().split(":")[1].strip() in ("NotLeader", "DatabaseNotFound"), r.stderr
    ok(r)
    assert r.stderr.decode() == "produced 1 records to r (shard 1: 1 at 0)\n"
    # A replicated database takes one shard per request.
    err = one_error_line(sh("produce", "--url", url, "r", stdin=line), "InvalidRequest")
    assert "?shard=N" in err and "nothing was produced" in err
    got = docs(ok(sh("consume", "--url", url, "r")))
    assert [(d["shard"], d["offset"], d["value"]) for d in got] == [(1, 0, "v1")]
    # Generations are not replicated: a replicated database refuses to add one.
    err = one_error_line(sh("admin", "--url", url, "add-generation", "r"), "InvalidArgument")
    assert "not replicated" in err
