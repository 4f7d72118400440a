"""seglog.client.Producer against real ``seglog serve`` processes: round trips, errors, retries,
server and producer crashes, overflow policies."""

from __future__ import annotations

import asyncio
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pyarrow as pa
import pytest

import seglog
from seglog.client import Consumer, Producer
from seglog.client._buffer import DiskBuffer
from seglog.cluster import protocol
from seglog.errors import (
    BufferFull,
    ClosedResourceError,
    ConfigMismatch,
    DatabaseNotFound,
    InvalidArgument,
    InvalidHeaders,
    InvalidKey,
    InvalidRecord,
    InvalidTimestamp,
    InvalidTopic,
    InvalidValue,
    RecordTooLarge,
    RemoteError,
    ServerUnavailable,
)
from seglog.record import Record, RecordMeta, records_to_batch, validate_record
from tests.helpers import FOREIGN_REPLIES, foreign_server
from tests.server_fixtures import ServerFactory, ServerProcess

DB = "p"
SHARDS = 4
TS0 = 1_700_000_000_000_000
WAIT_S = 60.0  # bound on waits for events; never a measured duration
ROOT = Path(__file__).resolve().parents[1]
# Retry fast while a test's server is down.
FAST_RETRY: dict[str, Any] = {"retries": None, "retry_backoff_ms": 20, "retry_backoff_max_ms": 200}


async def _create(url: str, shards: int = SHARDS) -> None:
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{url}/v1/dbs", json={"name": DB, "shards": shards}) as r,
    ):
        assert r.status == 201, await r.text()


async def _admin(url: str, method: str, path: str, body: Any = None) -> None:
    async with aiohttp.ClientSession() as s, s.request(method, url + path, json=body) as r:
        assert r.status < 300, await r.text()


async def _read_all(url: str) -> list[Record]:
    """Every record of every shard, by shard then offset."""
    async with Consumer(url, DB) as c:
        shards = c.assignment()
        ends = await c.end_offsets(shards)
        out: dict[int, list[Record]] = {s: [] for s in shards}
        async with asyncio.timeout(WAIT_S):
            while any(c.position(s) < ends[s] for s in shards):
                for shard, recs in (await c.getmany(timeout_ms=500)).items():
                    out[shard].extend(recs)
    return [r for s in shards for r in out[s]]


async def _until(cond: Callable[[], bool], what: str) -> None:
    """Wait (bounded) until ``cond()`` holds, checking on every loop turn."""
    deadline = time.monotonic() + WAIT_S
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def _in_thread(fn: Callable[[], Any]) -> Any:
    return await asyncio.to_thread(fn)


# --- round trips ---------------------------------------------------------------------------


@pytest.mark.parametrize("buffered", ["memory", "always", "interval", "never"])
def test_send_send_and_wait_send_arrow_agree_with_what_is_stored(
    server: ServerProcess, tmp_path: Path, buffered: str
) -> None:
    specs = [
        (
            f"dev/{i % 7}/temp",
            b"v%d" % i,
            None if i % 3 == 0 else b"k%d" % (i % 11),
            None if i % 2 else TS0 + i,
            {"seq": b"%d" % i} if i % 5 == 0 else None,
        )
        for i in range(300)
    ]
    table = pa.table(
        {
            "topic": [f"arrow/{i % 3}" for i in range(100)],
            "value": [b"a%d" % i for i in range(100)],
            "key": [None if i % 4 == 0 else b"ak%d" % i for i in range(100)],
            "ts": [TS0 + 10_000 + i for i in range(100)],
        }
    )

    async def main() -> None:
        await _create(server.url)
        disk: dict[str, Any] = (
            {} if buffered == "memory" else {"buffer_dir": tmp_path / "buf", "buffer_fsync": buffered}
        )
        async with Producer(server.url, DB, acks=1, **disk) as p:
            assert p.shards == SHARDS
            futures = [await p.send(t, v, key=k, ts=ts, headers=h) for t, v, k, ts, h in specs]
            single = await p.send_and_wait("dev/x", b"single", key=b"kx")
            arrow = await (await p.send_arrow(table))
            metas = [await f for f in futures]
            assert p.buffered_bytes == 0
        stored = await _read_all(server.url)
        by_value = {r.value: r for r in stored}
        assert len(by_value) == len(stored) == len(specs) + 1 + table.num_rows  # each once

        # Routing: the embedded Database of the same shard count routes every record alike.
        async with seglog.open(tmp_path / "embedded") as store:
            edb = await store.create_db("e", shards=SHARDS)
            embedded = await edb.append([Record(t, v, key=k, ts=ts, headers=h) for t, v, k, ts, h in specs])
            assert [m.shard for m in metas] == [m.shard for m in embedded]
            arrow_routes = (await edb.append_arrow(table)).column("shard").to_pylist()
            assert arrow.column("shard").to_pylist() == arrow_routes

        for (topic, value, key, ts, headers), meta in zip(specs, metas, strict=True):
            rec = by_value[value]
            assert isinstance(meta, RecordMeta)
            assert (rec.shard, rec.offset, rec.ts) == (meta.shard, meta.offset, meta.ts)
            assert (rec.topic, rec.key, rec.headers or None) == (topic, key, headers)
            if ts is not None:
                assert meta.ts == ts
        rec = by_value[b"single"]
        assert (rec.shard, rec.offset, rec.ts) == tuple(single)
        assert arrow.column_names == ["shard", "offset"] and arrow.num_rows == table.num_rows
        for i, (shard, offset) in enumerate(
            zip(arrow["shard"].to_pylist(), arrow["offset"].to_pylist(), strict=True)
        ):
            rec = by_value[b"a%d" % i]
            assert (rec.shard, rec.offset, rec.ts) == (shard, offset, TS0 + 10_000 + i)
        # Within a shard, records keep their send order.
        for shard in range(SHARDS):
            mine = [m.offset for m in metas if m.shard == shard]
            assert mine == sorted(mine)

    asyncio.run(main())


def test_acks_values_client_and_server(server: ServerProcess) -> None:
    async def main() -> None:
        await _create(server.url, shards=1)
        for acks in (1, "all", "quorum"):
            async with Producer(server.url, DB, acks=acks) as p:  # type: ignore[arg-type]
                assert (await p.send_and_wait("t", b"x")).shard == 0
        with pytest.raises(InvalidArgument):
            Producer(server.url, DB, acks="2")  # type: ignore[arg-type]
        async with aiohttp.ClientSession() as s:
            for acks, status in (("1", 200), ("all", 200), ("quorum", 200), ("2", 400), ("", 400)):
                async with s.post(
                    f"{server.url}/v1/dbs/{DB}/records?acks={acks}",
                    data=b'{"topic": "t", "value": "y"}\n',
                    headers={"Content-Type": protocol.NDJSON},
                ) as r:
                    assert r.status == status, await r.text()
                    if status == 400:
                        assert (await r.json())["error"] == "InvalidRequest"
        assert len(await _read_all(server.url)) == 3 + 3  # the refused ones wrote nothing

    asyncio.run(main())


# --- validation and errors -----------------------------------------------------------------

BAD_RECORDS: list[tuple[dict[str, Any], type[InvalidRecord]]] = [
    ({"topic": "a/+"}, InvalidTopic),
    ({"topic": "a/#"}, InvalidTopic),
    ({"topic": ""}, InvalidTopic),
    ({"topic": "a\0b"}, InvalidTopic),
    ({"topic": "x" * 65536}, InvalidTopic),
    ({"topic": 5}, InvalidTopic),
    ({"value": "text"}, InvalidValue),
    ({"value": None}, InvalidValue),
    ({"value": b"x" * ((1 << 20) + 1)}, RecordTooLarge),
    ({"key": "k"}, InvalidKey),
    ({"ts": 1.5}, InvalidRecord),
    ({"ts": 1_700_000_000}, InvalidTimestamp),  # seconds
    ({"ts": 2**70}, InvalidRecord),
    ({"headers": {"h": "text"}}, InvalidHeaders),
    ({"headers": {1: b"v"}}, InvalidHeaders),
    ({"headers": [("h", b"v")]}, InvalidHeaders),
]


def _fields(change: dict[str, Any]) -> dict[str, Any]:
    return {"topic": "a/b", "value": b"v", "key": None, "ts": None, "headers": None, **change}


@pytest.mark.parametrize(("change", "error"), BAD_RECORDS)
def test_validate_record_agrees_with_the_embedded_rules(
    change: dict[str, Any], error: type[InvalidRecord]
) -> None:
    f = _fields(change)
    limits = {"min_ts_us": seglog.DbConfig().min_ts_us, "max_ts_us": seglog.DbConfig().max_ts_us}
    with pytest.raises(InvalidRecord) as one:
        validate_record(f["topic"], f["value"], f["key"], f["ts"], f["headers"], **limits)
    with pytest.raises(InvalidRecord) as embedded:
        records_to_batch([Record(**f)], **limits)
    assert type(one.value) is type(embedded.value) is error
    assert str(embedded.value).endswith(str(one.value))
    assert validate_record("a/b", b"v", b"k", TS0, {"h": b"1"}, **limits) == (TS0, 3 + 1 + 1 + 1 + 1)


def test_invalid_records_are_rejected_at_send_with_nothing_sent(server: ServerProcess) -> None:
    async def main() -> None:
        await _create(server.url)
        async with Producer(server.url, DB) as p:
            for change, error in BAD_RECORDS:
                f = _fields(change)
                with pytest.raises(error):
                    await p.send(f["topic"], f["value"], key=f["key"], ts=f["ts"], headers=f["headers"])
            with pytest.raises(InvalidRecord):
                await p.send_arrow(pa.table({"topic": ["ok", "no/+"], "value": [b"1", b"2"]}))
            assert p.buffered_bytes == 0
            await p.flush()
            assert p.sent_requests == 0
        assert await _read_all(server.url) == []

    asyncio.run(main())


@pytest.mark.parametrize("kind", ["html", "json"])
def test_a_url_that_is_not_a_node_is_a_remote_error(kind: str) -> None:
    """A Producer, a Consumer and a group member given another service's URL fail at start with
    RemoteError naming what answered (they used to raise its JSONDecodeError or KeyError)."""
    assert FOREIGN_REPLIES[kind][0] == 200

    async def main() -> None:
        async with foreign_server(kind) as url:
            openers = [
                lambda: Producer(url, "db"),
                lambda: Consumer(url, "db"),
                lambda: Consumer(url, "db", group="g"),
            ]
            for opener in openers:
                with pytest.raises(RemoteError, match="not a seglog node") as err:
                    async with opener():
                        pass
                assert FOREIGN_REPLIES[kind][2][:20] in str(err.value)

    asyncio.run(main())


def test_non_retriable_server_errors_fail_the_futures_with_the_same_class(server: ServerProcess) -> None:
    async def main() -> None:
        await _create(server.url, shards=1)
        async with Producer(server.url, DB, **FAST_RETRY) as p:
            # The node's limit shrinks after the producer learned it: the node rejects.
            await _admin(server.url, "PATCH", f"/v1/dbs/{DB}", {"max_record_bytes": 100})
            big = await p.send("t", b"x" * 200)
            with pytest.raises(RecordTooLarge):
                await big
            ok = await p.send_and_wait("t", b"y" * 50)
            await _admin(server.url, "DELETE", f"/v1/dbs/{DB}")
            gone = await p.send("t", b"z")
            with pytest.raises(DatabaseNotFound):
                await gone
            assert p.retried_requests == 0 and p.failed_batches == 2 and p.buffered_bytes == 0
        assert ok.offset == 0

    asyncio.run(main())


def test_overloaded_503_is_retried_after_retry_after(server_factory: ServerFactory) -> None:
    server = server_factory("--max-inflight-appends", "1")
    host, port = server.url.removeprefix("http://").rsplit(":", 1)

    async def main() -> None:
        await _create(server.url, shards=1)
        body = b'{"topic": "held", "value": "h"}\n'
        head = (
            f"POST /v1/dbs/{DB}/records HTTP/1.1\r\nHost: x\r\nContent-Type: {protocol.NDJSON}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode()
        sock = socket.create_connection((host, int(port)), timeout=WAIT_S)
        try:
            sock.sendall(head + body[:5])  # holds the only in-flight slot while its body is due
            async with Producer(server.url, DB, retries=3) as p:
                futures = []
                # Until the node has taken the held request in, a send may pass: send until one
                # is refused (503 Overloaded, Retry-After: 1) and so retried.
                while not p.retried_requests:
                    fut = await p.send("t", b"%d" % len(futures))
                    futures.append(fut)
                    await _until(lambda f=fut: f.done() or p.retried_requests > 0, "a reply or a retry")
                assert not futures[-1].done()  # waiting out Retry-After
                sock.sendall(body[5:])  # the slot frees
                metas = [await f for f in futures]
                assert p.failed_batches == 0
        finally:
            sock.close()
        stored = await _read_all(server.url)
        assert sorted(r.value for r in stored) == sorted([b"h", *(b"%d" % i for i in range(len(metas)))])

    asyncio.run(main())


def test_server_down_then_up_is_retried(server: ServerProcess) -> None:
    async def main() -> None:
        await _create(server.url)
        async with Producer(server.url, DB, **FAST_RETRY) as p:
            await p.send_and_wait("t", b"before")
            await _in_thread(server.stop)
            futures = [await p.send(f"t/{i}", b"down%d" % i) for i in range(50)]
            await _until(lambda: p.retried_requests > 0, "a retry")
            assert not any(f.done() for f in futures)
            await _in_thread(server.restart)
            metas = [await f for f in futures]
        stored = {(r.shard, r.offset): r.value for r in await _read_all(server.url)}
        assert [stored[(m.shard, m.offset)] for m in metas] == [b"down%d" % i for i in range(50)]

    asyncio.run(main())


def test_retries_run_out(server: ServerProcess) -> None:
    async def main() -> None:
        await _create(server.url)
        async with Producer(server.url, DB, retries=2, retry_backoff_ms=10) as p:
            await _in_thread(server.stop)
            fut = await p.send("t", b"lost")
            with pytest.raises(ServerUnavailable):
                await fut
            assert p.retried_requests == 2 and p.failed_batches == 1 and p.buffered_bytes == 0

    asyncio.run(main())


# --- crashes -------------------------------------------------------------------------------


def test_sigkill_of_the_server_loses_no_accepted_record(server: ServerProcess, tmp_path: Path) -> None:
    """At least once: every record whose send() returned is stored; only records not yet
    acknowledged when the node died (batches in flight then) may be stored twice."""

    async def main() -> None:
        await _create(server.url)
        accepted: list[tuple[bytes, asyncio.Future[RecordMeta]]] = []
        stop = asyncio.Event()
        async with Producer(server.url, DB, buffer_dir=tmp_path / "buf", linger_ms=2, **FAST_RETRY) as p:

            async def pump() -> None:
                i = 0
                while not stop.is_set():
                    values = [b"u%d" % (i + j) for j in range(25)]
                    futures = await asyncio.gather(
                        *(p.send(f"t/{j % 3}", v, key=None if j % 2 else v) for j, v in enumerate(values))
                    )
                    accepted.extend(zip(values, futures, strict=True))
                    i += len(values)

            task = asyncio.create_task(pump())
            await _until(lambda: sum(f.done() for _, f in accepted) >= 500, "500 acknowledgements")
            server.kill()  # in the loop's thread: nothing is acknowledged in between
            acked_before = {v for v, f in accepted if f.done()}
            unacked_at_kill = {v for v, f in accepted if not f.done()}
            n = len(accepted)
            await _until(lambda: len(accepted) >= n + 300, "sends while the node is down")
            await _in_thread(server.restart)
            n = len(accepted)
            await _until(lambda: len(accepted) >= n + 300, "sends after the restart")
            stop.set()
            await task
            await p.flush()
            metas = {v: f.result() for v, f in accepted}  # every future succeeded
            assert p.retried_requests > 0
        stored = await _read_all(server.url)
        counts = Counter(r.value for r in stored)
        at = {(r.shard, r.offset): r.value for r in stored}
        for value, meta in metas.items():
            assert counts[value] >= 1 and at[(meta.shard, meta.offset)] == value
        for value in acked_before:
            assert counts[value] == 1
        duplicated = {v for v, c in counts.items() if c > 1}
        assert duplicated <= unacked_at_kill
        assert set(counts) == set(metas)

    asyncio.run(main())


@pytest.mark.parametrize("one_by_one", [False, True], ids=["one-batch", "2000-items"])
def test_records_in_the_disk_buffer_are_resent_by_the_next_producer(
    server: ServerProcess, tmp_path: Path, one_by_one: bool
) -> None:
    """The next producer on the buffer sends every record once. ``2000-items``: each record is
    its own buffered item, a backlog whose shard and sequence lists must not overrun the
    node's request line (8190 bytes) in one request."""
    buffer_dir = tmp_path / "buf"
    n = 2000

    async def prepare() -> None:
        await _create(server.url)
        async with Producer(server.url, DB, buffer_dir=buffer_dir):  # caches the description
            pass

    asyncio.run(prepare())
    server.stop()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.producer_child",
            server.url,
            DB,
            str(buffer_dir),
            str(n),
            *(["one-by-one"] if one_by_one else []),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
        env=env,
    )
    try:
        assert child.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + WAIT_S
        with selectors.DefaultSelector() as sel:
            sel.register(child.stdout, selectors.EVENT_READ)
            while not lines or not lines[-1].startswith("SENT"):  # (its log lines come first)
                assert sel.select(deadline - time.monotonic()), f"the child did not report: {lines}"
                line = child.stdout.readline().decode()
                assert line, f"the child exited: {lines}"
                lines.append(line)
        assert lines[-1] == f"SENT {n}\n"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(WAIT_S)
    assert list(buffer_dir.glob("*.seg"))
    server.restart()

    async def resend() -> None:
        async with Producer(server.url, DB, buffer_dir=buffer_dir) as p:
            assert p.buffered_bytes > 0  # the child's batches, queued before anything new
            await p.send_and_wait("after", b"new")
        stored = await _read_all(server.url)
        counts = Counter(r.value for r in stored)
        assert counts == Counter([b"new", *(b"r%d" % i for i in range(n))])  # all, once each
        async with seglog.open(tmp_path / "embedded") as store:
            edb = await store.create_db("e", shards=SHARDS)
            for r in stored:
                assert r.shard == edb.shard_for(r.key if r.key is not None else r.topic)

    asyncio.run(resend())
    buf = DiskBuffer(buffer_dir, max_bytes=1 << 20)
    assert buf.pending() == []  # everything acknowledged and committed
    buf.close()


def test_start_while_the_node_is_down(server: ServerProcess, tmp_path: Path) -> None:
    async def main() -> None:
        await _create(server.url)
        async with Producer(server.url, DB, buffer_dir=tmp_path / "cached"):
            pass
        with pytest.raises(ConfigMismatch):
            await Producer(server.url, "other", buffer_dir=tmp_path / "cached").start()
        await _in_thread(server.stop)
        with pytest.raises(ServerUnavailable):  # nothing cached: the shard count is unknown
            await Producer(server.url, DB, buffer_dir=tmp_path / "fresh").start()
        with pytest.raises(ServerUnavailable):
            await Producer(server.url, DB).start()
        p = Producer(server.url, DB, buffer_dir=tmp_path / "cached", **FAST_RETRY)
        await p.start()  # from the cached description
        assert p.shards == SHARDS
        await p.send("t", b"while down")
        await _in_thread(server.restart)
        await p.stop()
        assert [r.value for r in await _read_all(server.url)] == [b"while down"]
        with pytest.raises(ClosedResourceError):
            await p.send("t", b"after stop")

    asyncio.run(main())


# --- overflow ------------------------------------------------------------------------------


async def _fill(p: Producer, send: Callable[[int], Awaitable[Any]]) -> list[Any]:
    """Send until one send() does not return promptly (blocked) or raises; return the accepted."""
    accepted = []
    for i in range(10_000):
        task = asyncio.ensure_future(send(i))
        done, _ = await asyncio.wait([task], timeout=0.5)
        if not done:
            task.cancel()
            return accepted
        accepted.append(task.result())
    raise AssertionError("the buffer never filled")


def test_overflow_error_raises_buffer_full_with_nothing_enqueued(server: ServerProcess) -> None:
    async def main() -> None:
        await _create(server.url, shards=1)
        async with Producer(server.url, DB, buffer_max_bytes=4000, overflow="error", **FAST_RETRY) as p:
            await _in_thread(server.stop)
            accepted = []
            with pytest.raises(BufferFull):
                for i in range(1000):
                    accepted.append(await p.send("t", b"%04d" % i + b"x" * 96))
            before = p.buffered_bytes
            assert 0 < before <= 4000 + 1000 and accepted
            with pytest.raises(BufferFull):
                await p.send("t", b"y" * 100)
            assert p.buffered_bytes == before
            with pytest.raises(BufferFull):  # never fits
                await p.send_arrow(pa.table({"topic": ["t"] * 100, "value": [b"z" * 100] * 100}))
            await _in_thread(server.restart)
            metas = [await f for f in accepted]
        assert [r.value[:4] for r in await _read_all(server.url)] == [b"%04d" % i for i in range(len(metas))]

    asyncio.run(main())


def test_overflow_block_waits_for_acknowledgements(server: ServerProcess) -> None:
    async def main() -> None:
        await _create(server.url, shards=1)
        async with Producer(server.url, DB, buffer_max_bytes=4000, overflow="block", **FAST_RETRY) as p:
            await _in_thread(server.stop)
            accepted = await _fill(p, lambda i: p.send("t", b"%04d" % i + b"x" * 96))
            blocked = asyncio.ensure_future(p.send("t", b"blocked"))
            await asyncio.sleep(0)
            assert not blocked.done()
            await _in_thread(server.restart)  # acknowledgements free room
            fut = await asyncio.wait_for(blocked, WAIT_S)
            assert (await fut).offset == len(accepted)
            for f in accepted:
                await f
        # With no acknowledgements at all, block gives up after the request timeout.
        async with Producer(
            server.url, DB, buffer_max_bytes=4000, overflow="block", request_timeout_ms=300, **FAST_RETRY
        ) as p:
            await _in_thread(server.stop)
            with pytest.raises(BufferFull, match="request_timeout_ms"):
                for _ in range(1000):
                    await p.send("t", b"x" * 100)
            await p.stop(timeout_s=0.1)

    asyncio.run(main())


def test_overflow_drop_oldest_drops_and_counts(server: ServerProcess) -> None:
    async def main() -> None:
        await _create(server.url, shards=1)
        async with Producer(
            server.url,
            DB,
            buffer_max_bytes=8000,
            overflow="drop_oldest",
            linger_ms=1,
            max_in_flight=1,
            **FAST_RETRY,
        ) as p:
            await _in_thread(server.stop)
            futures = []
            for i in range(300):
                futures.append(await p.send("t", b"%04d" % i + b"x" * 96))
                if i % 5 == 4:
                    await asyncio.sleep(0.003)  # let linger seal batches
            assert p.dropped_batches > 0 and p.dropped_records > 0
            dropped = [f for f in futures if f.done() and isinstance(f.exception(), BufferFull)]
            assert len(dropped) == p.dropped_records
            assert p.buffered_bytes <= 8000 + 1000
            await _in_thread(server.restart)
            await p.flush()
            kept = [i for i, f in enumerate(futures) if not (f.done() and f.exception())]
            assert len(kept) == len(futures) - p.dropped_records
            assert all(f.done() and f.exception() is None for f in futures if f not in dropped)
            # The oldest go first: the records kept are those of the request in flight when
            # the node went down (a prefix) and the newest (a suffix); the dropped lie between.
            gone = [i for i, f in enumerate(futures) if f in dropped]
            assert gone == list(range(gone[0], gone[-1] + 1))
            assert kept == [*range(gone[0]), *range(gone[-1] + 1, len(futures))] and gone[0] > 0
        stored = [r.value[:4] for r in await _read_all(server.url)]
        assert stored == [b"%04d" % i for i in kept]

    asyncio.run(main())


def test_send_arrow_larger_than_the_buffer_goes_in_slices(server: ServerProcess) -> None:
    n = 5000
    table = pa.table(
        {"topic": [f"big/{i % 9}" for i in range(n)], "value": [b"%05d" % i + b"x" * 200 for i in range(n)]}
    )

    async def main() -> None:
        await _create(server.url)
        async with Producer(server.url, DB, buffer_max_bytes=64 << 10, overflow="error") as p:
            with pytest.raises(BufferFull):  # "error" takes a table whole or not at all
                await p.send_arrow(table)
            assert p.buffered_bytes == 0
        async with Producer(server.url, DB, buffer_max_bytes=64 << 10) as p:
            result = await (await p.send_arrow(table))
            assert p.sent_requests > 16  # ~1 MB through a 64 KiB buffer
        stored = {r.value[:5]: r for r in await _read_all(server.url)}
        assert len(stored) == n
        for i, (shard, offset) in enumerate(
            zip(result["shard"].to_pylist(), result["offset"].to_pylist(), strict=True)
        ):
            rec = stored[b"%05d" % i]
            assert (rec.shard, rec.offset) == (shard, offset)

    asyncio.run(main())


def test_a_sealed_batch_is_one_ipc_stream_whose_message_is_the_buffer_item() -> None:
    # A request of one item sends the stream the item was sealed in, as is; the buffer item
    # and requests of several items use the message inside it: both must be what the
    # schema message, the batch's own serialisation and the end-of-stream marker make.
    from seglog.client import producer as producer_module

    batch = records_to_batch(
        [Record(f"t/{i % 3}", b"v" * i, key=None if i % 2 else b"k", headers={"h": b"x"} if i == 4 else None)
         for i in range(9)]
    ).select(producer_module.PRODUCE_SCHEMA.names)  # fmt: skip
    tagged = batch.replace_schema_metadata({"from": "caller"})
    for part in (batch, batch.slice(2, 5), tagged):
        body = producer_module._stream(part)
        message = producer_module._message(body)
        expected = part.replace_schema_metadata(None).serialize().to_pybytes()
        assert bytes(message) == expected
        assert bytes(body) == producer_module._SCHEMA_MESSAGE + expected + producer_module._EOS
        assert (
            pa.ipc.open_stream(bytes(body))
            .read_all()
            .to_batches()[0]
            .equals(part.replace_schema_metadata(None))
        )


def test_send_arrow_to_one_shard_in_slices_and_chunks_gets_every_row_its_offset(
    server: ServerProcess,
) -> None:
    # One shard: each item's rows are a range of the caller's table (slices of the table
    # through a small buffer, chunks of a slice by max_batch_bytes); every row must get the
    # offset it was stored at.
    n = 3000
    table = pa.table({"topic": ["one/shard"] * n, "value": [b"%05d" % i + b"y" * 100 for i in range(n)]})

    async def main() -> None:
        await _create(server.url, shards=1)
        async with Producer(server.url, DB, buffer_max_bytes=64 << 10, max_batch_bytes=4 << 10) as p:
            result = await (await p.send_arrow(table))
            assert p.sent_requests > 8
        stored = {r.value[:5]: r for r in await _read_all(server.url)}
        assert len(stored) == n
        assert result["shard"].to_pylist() == [0] * n
        assert result["offset"].to_pylist() == [stored[b"%05d" % i].offset for i in range(n)]

    asyncio.run(main())
