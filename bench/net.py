"""Network benchmark (issue 12): a ``seglog serve`` node against embedded seglog and Kafka.

    python -m bench.net [--quick] [--sizes 100,1024] [--records N] [--batch N] [--senders N]
                        [--shards N] [--e2e-seconds S] [--no-kafka] [--out DIR]

One ``seglog serve --fsync always`` subprocess on a temp directory; every row runs in the same
run, so each is shown as a ratio to its baseline of the same shape and value size:

* produce: embedded ``Database.append_arrow`` (the baseline, in this process, fsync always),
  a bench-local sender posting Arrow IPC streams to ``/v1/dbs/{db}/records``, the same with
  JSON lines, and Kafka through aiokafka (acks=all, the broker fsyncs every append: the
  peers harness's broker, ``bench/peers/kafka_kraft.py``). Every record has a key (one of
  10,000 devices) and its device's topic. Batches of ``--batch`` records; ``--senders`` tasks
  each keep one batch in flight (so that many requests are in flight), into ``--shards``
  shards (Kafka: partitions). ack p50/p99 = time from handing a batch over to its
  acknowledgement. A second shape, one sender into one shard, runs the baseline and the
  Arrow row only.
* consume: drain everything the produce rows wrote: embedded ``read_arrow`` (the baseline),
  ``Consumer.getmany_arrow`` (records/s into Arrow tables), ``Consumer.getmany`` (into
  ``Record`` objects) and aiokafka ``getmany`` (into its ``ConsumerRecord`` objects).
* end to end: a sender paced by a clock schedule at ``--e2e-rate`` records/s posts a batch
  every ``--e2e-tick-ms`` (``ts`` = wall clock at send) while a ``Consumer`` tails the
  database with long polls; latency = receive time - ``ts``.

Inputs are pre-built untimed in each system's native form (Arrow tables; NDJSON bytes; Kafka
(key, value, ts) tuples grouped by partition, partitions computed with aiokafka's murmur2):
what is timed is the client library, the network and the server. MB/s counts record content
(topic + key + 8-byte ts + value).

Rows are pluggable: a produce row is an async context manager ``open(env) -> send`` where
``await send(table)`` returns once ``table`` is durable (see ``PRODUCE_ROWS``).

Writes ``bench/results/net-<date>.md`` and ``.json`` (``--quick``: ``quick-net-<date>``,
not committed), and prints the Markdown.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Before/after runs: BENCH_NET_SEGLOG=DIR imports the seglog package from DIR (e.g. a git
# worktree of an earlier commit), here and in the server process.
SEGLOG_ROOT = os.environ.get("BENCH_NET_SEGLOG")
if SEGLOG_ROOT:
    sys.path.insert(0, SEGLOG_ROOT)

import seglog  # noqa: E402
from bench.core import _git_state, run_meta  # noqa: E402
from bench.peers import PeerContext, PeerUnavailable  # noqa: E402
from bench.peers._server import LOOPBACK_HOST, ServerProcess, free_port, port_open  # noqa: E402
from seglog.client import Consumer  # noqa: E402
from seglog.client._http import NodeSession  # noqa: E402
from seglog.cluster import protocol  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "bench" / "results"
CACHE_DIR = REPO / ".cache"
DEVICES = 10_000
BASE_TS_US = 1_700_000_000_000_000
SERVER_START_TIMEOUT_S = 60.0
# A drain gives up when no record came for this long (the row then shows how many it read).
DRAIN_STALL_S = 30.0
KAFKA_FETCH_MAX_BYTES = 64 << 20
KAFKA_ENQUEUE_TRIES = 20

Send = Callable[[pa.Table], Awaitable[None]]
"""``await send(table)``: returns once every row of ``table`` is durable (acknowledged)."""


# --- workload --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """The records every produce row writes at one value size, as Arrow batches.

    Columns ``ts, topic, key, value``: record ``i`` belongs to device ``i * 7919 % 10,000``
    (its key ``dev-NNNNN`` and its topic ``sensors/site-NN/dev-NNNNN/temp``), ``value`` is
    ``value_bytes`` of printable text (so that JSON lines carry it as a string).
    """

    value_bytes: int
    batches: list[pa.Table]
    n: int
    logical_bytes: int


def device_columns() -> tuple[pa.Array, pa.Array]:
    """Key and topic of each device (index = device)."""
    keys = pa.array([f"dev-{d:05d}".encode() for d in range(DEVICES)], pa.binary())
    topics = pa.array([f"sensors/site-{d % 100:02d}/dev-{d:05d}/temp" for d in range(DEVICES)], pa.string())
    return keys, topics


def text_values(n: int, value_bytes: int, seed: int) -> pa.Array:
    """``n`` values of ``value_bytes`` random lowercase letters, without a Python object each."""
    rng = np.random.default_rng(seed)
    data = rng.integers(ord("a"), ord("z") + 1, size=n * value_bytes, dtype=np.uint8)
    offsets = np.arange(0, (n + 1) * value_bytes, value_bytes, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def make_workload(n: int, value_bytes: int, batch_records: int, seed: int = 1) -> Workload:
    """``n`` keyed records in batches of ``batch_records`` (each batch its own buffers)."""
    keys, topics = device_columns()
    devices = pa.array((np.arange(n, dtype=np.int64) * 7919) % DEVICES)
    table = pa.table(
        {
            "ts": pa.array(BASE_TS_US + np.arange(n, dtype=np.int64)),
            "topic": topics.take(devices),
            "key": keys.take(devices),
            "value": text_values(n, value_bytes, seed),
        }
    )
    batches = [
        pa.Table.from_batches([table.slice(i, batch_records).combine_chunks().to_batches()[0]])
        for i in range(0, n, batch_records)
    ]
    return Workload(value_bytes, batches, n, logical_bytes(table))


def logical_bytes(table: pa.Table) -> int:
    """Record content: topic + key + 8-byte ts + value bytes."""
    lengths = (pc.sum(pc.binary_length(table.column(c))).as_py() or 0 for c in ("topic", "key", "value"))
    return int(sum(lengths)) + 8 * table.num_rows


def ipc_stream(table: pa.Table) -> pa.Buffer:
    """``table`` as one Arrow IPC stream (the produce body)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def ndjson(table: pa.Table) -> bytes:
    """``table`` as JSON lines ``{"topic", "key", "ts", "value"}`` (text keys and values)."""
    cols = [table.column(c).to_pylist() for c in ("topic", "key", "ts", "value")]
    dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
    lines = [
        dumps({"topic": t, "key": k.decode(), "ts": ts, "value": v.decode()})
        for t, k, ts, v in zip(*cols, strict=True)
    ]
    return ("\n".join(lines) + "\n").encode()


# --- environment -----------------------------------------------------------------------------


@dataclass
class Env:
    """What rows use: the node, the embedded store, the Kafka broker, the workload of this size.

    ``db`` is the database (Kafka: topic) created for the current row, empty, with ``shards``
    shards (partitions), on the row's target.
    """

    url: str
    session: NodeSession
    store: Any
    kafka: Any | None
    workload: Workload
    db: str = ""
    shards: int = 1
    senders: int = 1


class CpuSource(Protocol):
    """What a row charges server CPU to: one node, or the sum over a cluster's nodes."""

    def cpu_s(self) -> float: ...


class Node:
    """The ``seglog serve --fsync always`` subprocess (``bench/peers/_server.py`` runs it)."""

    def __init__(self, work: Path, root: Path | None = None) -> None:
        """``root``: a directory holding the ``seglog`` package the node runs (default: the
        ``BENCH_NET_SEGLOG`` one, else this checkout's)."""
        home = str(root) if root is not None else SEGLOG_ROOT
        self.port = free_port()
        self.url = f"http://{LOOPBACK_HOST}:{self.port}"
        argv = [
            sys.executable,
            "-m",
            "seglog.cli",
            "serve",
            str(work / "node"),
            "--listen",
            f"{LOOPBACK_HOST}:{self.port}",
            "--fsync",
            "always",
        ]
        env = None
        if home:  # -m puts the working directory first on the path
            env = {**os.environ, "PYTHONPATH": home}
        self.process = ServerProcess(
            "seglog serve", argv, work / "node.log", cwd=Path(home) if home else None, env=env
        )

    async def start(self) -> None:
        self.process.start()
        await self.process.wait_until(lambda: port_open(self.port), "seglog serve", SERVER_START_TIMEOUT_S)

    def cpu_s(self) -> float:
        return self.process.cpu_s()

    def stop(self) -> None:
        self.process.stop()


# --- rows ------------------------------------------------------------------------------------

Opener = Callable[[Env], AbstractAsyncContextManager[Send]]


@dataclass(frozen=True)
class ProduceRow:
    """One produce row: ``open(env)`` yields ``send`` (see :data:`Send`).

    Attributes:
        name: Row label.
        open: The row's client, opened on ``env`` (untimed), closed after the row.
        target: Where ``env.db`` is created: ``"embedded"``, ``"node"`` or ``"kafka"``.
        single: Also run in the one-sender, one-shard shape.
        baseline: The row the others are divided by.
    """

    name: str
    open: Opener
    target: str
    single: bool = False
    baseline: bool = False


@asynccontextmanager
async def embedded_arrow(env: Env) -> AsyncIterator[Send]:
    """``Database.append_arrow`` in this process (the store is ``fsync="always"``)."""
    db = await env.store.open_db(env.db)

    async def send(table: pa.Table) -> None:
        await db.append_arrow(table)

    yield send


@asynccontextmanager
async def node_arrow(env: Env) -> AsyncIterator[Send]:
    """POST each batch as an Arrow IPC stream (serialised in the timed region)."""
    path = f"{protocol.API_PREFIX}/dbs/{env.db}/records"

    async def send(table: pa.Table) -> None:
        body = memoryview(ipc_stream(table))
        await env.session.request("POST", path, data=body, content_type=protocol.ARROW_STREAM)

    yield send


@asynccontextmanager
async def node_ndjson(env: Env) -> AsyncIterator[Send]:
    """POST each batch as JSON lines, encoded before timing."""
    path = f"{protocol.API_PREFIX}/dbs/{env.db}/records"
    bodies = {id(t): ndjson(t) for t in env.workload.batches}

    async def send(table: pa.Table) -> None:
        await env.session.request("POST", path, data=bodies[id(table)], content_type=protocol.NDJSON)

    yield send


def kafka_partitions(keys: list[bytes], partitions: int) -> list[int]:
    """aiokafka's ``DefaultPartitioner`` choice per key (murmur2, once per distinct key)."""
    from aiokafka.partitioner import murmur2

    memo: dict[bytes, int] = {}
    out = []
    for k in keys:
        p = memo.get(k)
        if p is None:
            p = memo[k] = (murmur2(k) & 0x7FFFFFFF) % partitions
        out.append(p)
    return out


@asynccontextmanager
async def kafka_produce(env: Env) -> AsyncIterator[Send]:
    """aiokafka, acks=all: per batch one record batch per partition, awaited together.

    The fastest aiokafka path (``create_batch``/``send_batch``; ``send()`` per record is
    slower); the MQTT topic travels as a record header, ``ts`` as the Kafka timestamp (ms).
    """
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaTimeoutError

    from bench.peers.kafka_kraft import MAX_BATCH_BYTES, MAX_MESSAGE_BYTES, REQUEST_TIMEOUT_MS

    encoded: dict[int, dict[int, list[tuple[bytes, bytes, int, list[tuple[str, bytes]]]]]] = {}
    for t in env.workload.batches:
        keys = t.column("key").to_pylist()
        groups: dict[int, list[Any]] = {}
        for p, k, v, ts, topic in zip(
            kafka_partitions(keys, env.shards),
            keys,
            t.column("value").to_pylist(),
            t.column("ts").to_pylist(),
            t.column("topic").to_pylist(),
            strict=True,
        ):
            groups.setdefault(p, []).append((k, v, ts // 1000, [("topic", topic.encode())]))
        encoded[id(t)] = groups
    producer = AIOKafkaProducer(
        bootstrap_servers=env.kafka.bootstrap,
        acks="all",
        linger_ms=0,
        max_batch_size=MAX_BATCH_BYTES,
        max_request_size=MAX_MESSAGE_BYTES,
        request_timeout_ms=REQUEST_TIMEOUT_MS,
        enable_idempotence=False,
    )
    await producer.start()
    try:
        await producer.partitions_for(env.db)

        async def enqueue(builder: Any, partition: int) -> Any:
            # aiokafka takes one queued batch per partition and gives up waiting for room
            # after a few waits (KafkaTimeoutError, nothing enqueued) when several senders
            # share the partitions: wait again, that is the backpressure.
            for _ in range(KAFKA_ENQUEUE_TRIES - 1):
                with contextlib.suppress(KafkaTimeoutError):
                    return await producer.send_batch(builder, env.db, partition=partition)
            return await producer.send_batch(builder, env.db, partition=partition)

        async def send(table: pa.Table) -> None:
            futures = []
            for partition, records in encoded[id(table)].items():
                builder = producer.create_batch()
                for key, value, ts_ms, headers in records:
                    if builder.append(key=key, value=value, timestamp=ts_ms, headers=headers) is None:
                        futures.append(await enqueue(builder, partition))
                        builder = producer.create_batch()
                        builder.append(key=key, value=value, timestamp=ts_ms, headers=headers)
                futures.append(await enqueue(builder, partition))
            await asyncio.gather(*futures)

        yield send
    finally:
        await producer.stop()


@asynccontextmanager
async def producer_arrow(env: Env, *, idempotent: bool = True) -> AsyncIterator[Send]:
    """``seglog.client.Producer.send_arrow``, each call awaited until acknowledged (acks=all);
    idempotent (producer id and sequences checked by the node) unless told otherwise."""
    from seglog.client import Producer

    async with Producer(
        env.url, env.db, acks="all", max_batch_bytes=4 << 20, idempotent=idempotent
    ) as producer:

        async def send(table: pa.Table) -> None:
            await (await producer.send_arrow(table))

        yield send


def producer_arrow_plain(env: Env) -> AbstractAsyncContextManager[Send]:
    """:func:`producer_arrow` with ``idempotent=False``: what the producer ids cost."""
    return producer_arrow(env, idempotent=False)


PRODUCE_ROWS: list[ProduceRow] = [
    ProduceRow("embedded append_arrow", embedded_arrow, "embedded", single=True, baseline=True),
    ProduceRow("network Producer (Arrow)", producer_arrow, "node", single=True),
    ProduceRow("network Producer (Arrow, idempotent=False)", producer_arrow_plain, "node", single=True),
    ProduceRow("network Arrow (bench sender)", node_arrow, "node", single=True),
    ProduceRow("network JSON lines", node_ndjson, "node"),
    ProduceRow("Kafka aiokafka (acks=all)", kafka_produce, "kafka"),
]
"""Produce rows in table order (``single``: also run at one sender and one shard)."""


# --- measurement -----------------------------------------------------------------------------


@dataclass
class Row:
    """One table row."""

    section: str
    value_bytes: int
    shape: str
    system: str
    records: int = 0
    seconds: float = 0.0
    bytes: int = 0
    p50_ms: float | None = None
    p99_ms: float | None = None
    server_cpu_s: float | None = None
    client_cpu_s: float | None = None
    ratio: float | None = None
    status: str = "ok"
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def records_s(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0

    @property
    def mb_s(self) -> float:
        return self.bytes / self.seconds / 1e6 if self.seconds else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "records_s": self.records_s, "mb_s": self.mb_s}


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _self_cpu_s() -> float:
    """CPU seconds of this process (the bench client; the embedded store runs here too)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _pct(values: list[float] | np.ndarray[Any, Any], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if len(values) else float("nan")


class Targets:
    """Creates each row's empty database (topic) and counts what it holds afterwards."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self.serial = 0

    async def create(self, target: str, shards: int, value_bytes: int) -> str:
        self.serial += 1
        name = f"b{value_bytes}-{target}-{shards}s-{self.serial}"
        env = self.env
        if target == "embedded":
            await env.store.create_db(name, shards=shards)
        elif target == "node":
            await env.session.request(
                "POST", f"{protocol.API_PREFIX}/dbs", json_body={"name": name, "shards": shards}
            )
        elif target == "kafka":
            if env.kafka is None:
                raise PeerUnavailable("Kafka not started")
            await env.kafka.create_topic(name, shards)
        else:
            raise ValueError(target)
        return name

    async def count(self, target: str, name: str) -> int:
        env = self.env
        if target == "embedded":
            db = await env.store.open_db(name)
            return sum(db.end_offset(s) for s in range(db.shards))
        if target == "node":
            described = (await env.session.request("GET", f"{protocol.API_PREFIX}/dbs/{name}")).json()
            return sum(int(o["end"]) for o in described["offsets"])
        from aiokafka import AIOKafkaConsumer, TopicPartition

        consumer = AIOKafkaConsumer(bootstrap_servers=env.kafka.bootstrap, group_id=None)
        await consumer.start()
        try:
            ends = await consumer.end_offsets([TopicPartition(name, p) for p in range(env.shards)])
            return sum(ends.values())
        finally:
            await stop_kafka_consumer(consumer)


async def stop_kafka_consumer(consumer: Any) -> None:
    """``consumer.stop()``; aiokafka lets a CancelledError of its own internal task escape it."""
    try:
        await consumer.stop()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # this task really is being cancelled


async def run_produce(row: ProduceRow, env: Env, node: CpuSource) -> Row:
    """Drive ``row`` with ``env.senders`` concurrent senders over the workload's batches."""
    w = env.workload
    batches = w.batches
    latencies: list[float] = []
    async with row.open(env) as send:

        async def sender(k: int) -> None:
            clock = time.perf_counter
            for table in batches[k :: env.senders]:
                t0 = clock()
                await send(table)
                latencies.append(clock() - t0)

        cpu0, ccpu0 = node.cpu_s(), _self_cpu_s()
        t0 = time.perf_counter()
        await asyncio.gather(*(sender(k) for k in range(env.senders)))
        elapsed = time.perf_counter() - t0
        cpu, ccpu = node.cpu_s() - cpu0, _self_cpu_s() - ccpu0
    return Row(
        "produce",
        w.value_bytes,
        f"{env.senders} sender{'s' if env.senders > 1 else ''}/{env.shards} shard{'s' if env.shards > 1 else ''}",
        row.name,
        w.n,
        elapsed,
        w.logical_bytes,
        _pct(latencies, 50) * 1000,
        _pct(latencies, 99) * 1000,
        cpu if row.target in ("node", "cluster") else None,
        ccpu,
    )


async def settle(env: Env, db: str) -> None:
    """Untimed: one tiny fetch per shard, so rows still buffered from many-shard appends are
    frames before the drain (what the node does on its own within ``buffer_ms``)."""
    shards = len((await env.session.request("GET", f"{protocol.API_PREFIX}/dbs/{db}")).json()["offsets"])
    for shard in range(shards):
        await env.session.request(
            "GET",
            f"{protocol.API_PREFIX}/dbs/{db}/shards/{shard}/frames",
            params={"offset": 0, "max_bytes": 1},
        )


async def drain_embedded(env: Env, db_name: str, n: int) -> tuple[int, float]:
    db = await env.store.open_db(db_name)
    t0 = time.perf_counter()
    total = 0
    for shard in range(db.shards):
        offset = 0
        while True:
            got = (await db.read_arrow(shard, offset, 100_000)).num_rows
            if not got:
                break
            total += got
            offset += got
    return total, time.perf_counter() - t0


class _Stall:
    """Whether a drain has gone ``DRAIN_STALL_S`` without a record."""

    def __init__(self) -> None:
        self.last = time.monotonic()

    def note(self, got: int) -> None:
        if got:
            self.last = time.monotonic()

    def over(self) -> bool:
        return time.monotonic() - self.last > DRAIN_STALL_S


async def drain_consumer(env: Env, db_name: str, n: int, *, arrow: bool) -> tuple[int, float]:
    async with Consumer(env.url, db_name) as consumer:
        t0 = time.perf_counter()
        total = 0
        stall = _Stall()
        while total < n and not stall.over():
            if arrow:
                tables = await consumer.getmany_arrow(timeout_ms=1000)
                got = sum(t.num_rows for t in tables.values())
            else:
                records = await consumer.getmany(timeout_ms=1000)
                got = sum(map(len, records.values()))
            total += got
            stall.note(got)
        return total, time.perf_counter() - t0


async def drain_kafka(env: Env, topic: str, n: int) -> tuple[int, float]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from bench.peers.kafka_kraft import MAX_MESSAGE_BYTES, REQUEST_TIMEOUT_MS

    consumer = AIOKafkaConsumer(
        bootstrap_servers=env.kafka.bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=MAX_MESSAGE_BYTES,
        fetch_max_bytes=KAFKA_FETCH_MAX_BYTES,
        request_timeout_ms=REQUEST_TIMEOUT_MS,
    )
    await consumer.start()
    try:
        parts = [TopicPartition(topic, p) for p in range(env.shards)]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        t0 = time.perf_counter()
        total = 0
        stall = _Stall()
        while total < n and not stall.over():
            batches = await consumer.getmany(timeout_ms=1000, max_records=100_000)
            got = sum(map(len, batches.values()))
            total += got
            stall.note(got)
        return total, time.perf_counter() - t0
    finally:
        await stop_kafka_consumer(consumer)


ConsumeFn = Callable[[Env, str, int], Awaitable[tuple[int, float]]]
CONSUME_ROWS: list[tuple[str, str, ConsumeFn, bool]] = [
    # (name, target whose main-shape database it reads, drain, is baseline)
    ("embedded read_arrow", "embedded", drain_embedded, True),
    (
        "network Consumer.getmany_arrow",
        "node",
        lambda env, db, n: drain_consumer(env, db, n, arrow=True),
        False,
    ),
    (
        "network Consumer.getmany (Record)",
        "node",
        lambda env, db, n: drain_consumer(env, db, n, arrow=False),
        False,
    ),
    ("Kafka aiokafka getmany", "kafka", drain_kafka, False),
]


@dataclass
class Paced:
    """What a paced sender and a tailing consumer measured (:func:`paced_tail`)."""

    total: int
    received: int
    sent_s: float
    # Receipt - ts of every record received, ms.
    lat_ms: np.ndarray[Any, Any]
    # Seconds from a tick's table handed over to its acknowledgement.
    acks: list[float]
    late_ticks: int
    server_cpu_s: float
    client_cpu_s: float
    failures: list[BaseException]

    def row(self, section: str, shape: str, system: str, rate: int) -> Row:
        """The result as a bench row (latencies as p50/p99, the rest in ``extra``)."""
        row = Row(
            section,
            100,
            shape,
            system,
            self.received,
            self.sent_s,
            0,
            _pct(self.lat_ms, 50),
            _pct(self.lat_ms, 99),
            self.server_cpu_s,
            self.client_cpu_s,
            extra={
                "max_ms": float(self.lat_ms.max()) if len(self.lat_ms) else float("nan"),
                "target_rate": rate,
                "achieved_rate": self.received / self.sent_s,
                "ack_p50_ms": _pct(self.acks, 50) * 1000,
                "ack_p99_ms": _pct(self.acks, 99) * 1000,
                "late_ticks": self.late_ticks,
            },
        )
        if self.failures or self.received != self.total:
            row.status = f"received {self.received} of {self.total}; {len(self.failures)} sends failed" + (
                f" ({self.failures[0]!r})" if self.failures else ""
            )
        return row


async def paced_tail(
    consumer: Consumer,
    send: Callable[[pa.Table], Awaitable[object]],
    table_for: Callable[[int, int], pa.Table],
    *,
    per_tick: int,
    ticks: int,
    tick_ms: float,
    server_cpu_s: Callable[[], float],
) -> Paced:
    """Hand ``table_for(tick, ts_us)`` to ``send`` every ``tick_ms`` (each tick its own task, so
    a slow acknowledgement never delays the schedule) while ``consumer`` tails; latency =
    wall clock when ``getmany_arrow`` returned a record - its ``ts``."""
    total = per_tick * ticks
    acks: list[float] = []
    lat: list[np.ndarray[Any, Any]] = []
    failures: list[BaseException] = []
    received = 0
    got_all = asyncio.Event()

    async def receive() -> None:
        nonlocal received
        while received < total:
            tables = await consumer.getmany_arrow(timeout_ms=1000)
            now = time.time_ns() // 1000
            for t in tables.values():
                lat.append(now - t.column("ts").to_numpy())
                received += t.num_rows
        got_all.set()

    async def post(i: int) -> None:
        table = table_for(i, time.time_ns() // 1000)
        t0 = time.perf_counter()
        try:
            await send(table)
        except Exception as exc:
            failures.append(exc)
            return
        acks.append(time.perf_counter() - t0)

    receiver = asyncio.create_task(receive())
    cpu0, ccpu0 = server_cpu_s(), _self_cpu_s()
    loop = asyncio.get_running_loop()
    start = loop.time()
    tasks: set[asyncio.Task[None]] = set()
    late = 0
    for i in range(ticks):
        # The schedule is the workload: tick i is due at start + i * tick, whatever the acks do.
        delay = start + i * tick_ms / 1000 - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        elif delay < -tick_ms / 1000:
            late += 1
        task = asyncio.create_task(post(i))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    sent_s = loop.time() - start + tick_ms / 1000
    await asyncio.gather(*tasks)
    try:
        await asyncio.wait_for(got_all.wait(), 60)
    except TimeoutError:
        _log(f"  received {received} of {total} within 60 s of the last send")
    finally:
        receiver.cancel()
        await asyncio.gather(receiver, return_exceptions=True)
    lat_ms = np.concatenate(lat) / 1000 if lat else np.zeros(0)
    return Paced(
        total, received, sent_s, lat_ms, acks, late, server_cpu_s() - cpu0, _self_cpu_s() - ccpu0, failures
    )


async def end_to_end(
    env: Env, node: Node, rate: int, seconds: float, tick_ms: float, *, producer: bool = False
) -> Row:
    """A paced Arrow sender at ``rate`` records/s and a tailing Consumer; latency = receipt - ts.

    The sender posts one Arrow body per tick itself, or (``producer``) hands each tick's
    table to ``Producer.send_arrow`` (its batching, one request in flight per shard).
    """
    from seglog.client import Producer

    targets = Targets(env)
    targets.serial = 100 if producer else 0  # one database per sender mode
    name = await targets.create("node", env.shards, 100)
    per_tick = max(1, round(rate * tick_ms / 1000))
    ticks = max(1, round(seconds * 1000 / tick_ms))
    keys, topics = device_columns()
    template = pa.table(
        {
            "topic": topics.take(pa.array(np.arange(per_tick) % DEVICES)),
            "key": keys.take(pa.array(np.arange(per_tick) % DEVICES)),
            "value": text_values(per_tick, 100, 7),
        }
    )
    path = f"{protocol.API_PREFIX}/dbs/{name}/records"

    def table_for(_tick: int, ts: int) -> pa.Table:
        return template.add_column(0, "ts", pa.array(np.full(per_tick, ts, np.int64)))

    async with contextlib.AsyncExitStack() as stack:
        consumer = await stack.enter_async_context(Consumer(env.url, name, auto_offset_reset="earliest"))
        if producer:
            sender = await stack.enter_async_context(Producer(env.url, name, acks=1))

            async def send(table: pa.Table) -> object:
                return await (await sender.send_arrow(table))

        else:

            async def send(table: pa.Table) -> object:
                return await env.session.request(
                    "POST", path, data=memoryview(ipc_stream(table)), content_type=protocol.ARROW_STREAM
                )

        paced = await paced_tail(
            consumer,
            send,
            table_for,
            per_tick=per_tick,
            ticks=ticks,
            tick_ms=tick_ms,
            server_cpu_s=node.cpu_s,
        )
    return paced.row(
        "e2e",
        f"{env.shards} shard{'s' if env.shards > 1 else ''}, {per_tick} records every {tick_ms:g} ms",
        "Producer.send_arrow -> tailing Consumer" if producer else "network Arrow -> tailing Consumer",
        rate,
    )


# --- run -------------------------------------------------------------------------------------


async def run_size(env: Env, node: Node, value_bytes: int, args: argparse.Namespace, rows: list[Row]) -> None:
    targets = Targets(env)
    shapes = [(args.senders, args.shards, False)]
    if not args.no_single:
        shapes.append((1, 1, True))
    main_dbs: dict[str, tuple[str, int]] = {}  # target -> (database, records stored)
    for senders, shards, single in shapes:
        baseline: Row | None = None
        for spec in PRODUCE_ROWS:
            if (single and not spec.single) or not re.search(args.only, spec.name):
                continue
            env.senders, env.shards = senders, shards
            label = f"{value_bytes} B {senders}s/{shards}sh {spec.name}"
            if spec.target == "kafka" and env.kafka is None:
                rows.append(
                    Row("produce", value_bytes, "", spec.name, status="skipped: --no-kafka or no broker")
                )
                continue
            try:
                env.db = await targets.create(spec.target, shards, value_bytes)
                await asyncio.to_thread(os.sync)  # no row pays for the previous one's writeback
                row = await run_produce(spec, env, node)
                stored = await targets.count(spec.target, env.db)
                if stored != env.workload.n:
                    row.status = f"stored {stored} of {env.workload.n}"
            except Exception as exc:  # a failing row is a row, not a failed run
                _log(f"  {label}: FAILED {type(exc).__name__}: {exc}")
                rows.append(
                    Row("produce", value_bytes, "", spec.name, status=f"failed: {type(exc).__name__}: {exc}")
                )
                continue
            if spec.baseline:
                baseline = row
            elif baseline is not None:
                row.ratio = row.records_s / baseline.records_s
            rows.append(row)
            if not single:
                main_dbs.setdefault(spec.target, (env.db, stored))
            _log(
                f"  {label}: {row.records_s:,.0f} rec/s, ack p50 {row.p50_ms:.1f} ms p99 {row.p99_ms:.1f} ms"
                + (f", x{row.ratio:.2f}" if row.ratio is not None else "")
            )
    baseline = None
    env.shards = args.shards
    for name, target, drain, is_base in CONSUME_ROWS if "consume" in args.sections else ():
        if not re.search(args.only, name):
            continue
        written = main_dbs.get(target)
        if written is None:
            rows.append(Row("consume", value_bytes, "", name, status="skipped: no data written"))
            continue
        db, stored = written
        try:
            if target == "node":
                await settle(env, db)
            await asyncio.to_thread(os.sync)
            runs = []  # (seconds, records, server CPU s, client CPU s)
            for _ in range(args.consume_runs):
                cpu0, ccpu0 = node.cpu_s(), _self_cpu_s()
                total, seconds = await drain(env, db, stored)
                runs.append((seconds, total, node.cpu_s() - cpu0, _self_cpu_s() - ccpu0))
                if total != stored:
                    runs = runs[-1:]  # a stalled drain is the row (shown with what it read)
                    break
            # The median run: a drain is short, one stall from a neighbour would decide it alone.
            seconds, total, cpu, ccpu = sorted(runs)[len(runs) // 2]
        except Exception as exc:
            _log(f"  {value_bytes} B consume {name}: FAILED {type(exc).__name__}: {exc}")
            rows.append(Row("consume", value_bytes, "", name, status=f"failed: {type(exc).__name__}: {exc}"))
            continue
        row = Row(
            "consume",
            value_bytes,
            f"1 reader/{args.shards} shards",
            name,
            total,
            seconds,
            env.workload.logical_bytes * total // env.workload.n,
            server_cpu_s=cpu if target == "node" else None,
            client_cpu_s=ccpu,
        )
        if total != stored:
            row.status = f"read {total} of {stored}"
        if is_base:
            baseline = row
        elif baseline is not None:
            row.ratio = row.records_s / baseline.records_s
        rows.append(row)
        _log(f"  {value_bytes} B consume {name}: {row.records_s:,.0f} rec/s")


async def run(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    work = Path(tempfile.mkdtemp(prefix="seglog-net-bench-", dir=args.dir))
    load_start = os.getloadavg()[0]
    t_start = time.perf_counter()
    rows: list[Row] = []
    node = Node(work)
    profiler: subprocess.Popen[bytes] | None = None
    kafka: Any = None
    kafka_version = "not run"
    try:
        await node.start()
        if args.profile_server:
            profiler = subprocess.Popen(
                ["py-spy", "record", "-r", "200", "--format", "raw", "-o", str(args.profile_server),
                 *args.profile_args.split(), "--pid", str(node.process.pid)],
                stdout=subprocess.DEVNULL,
            )  # fmt: skip
        if not args.no_kafka:
            try:
                from bench.peers.kafka_kraft import KafkaPeer

                (work / "kafka").mkdir()
                kafka = KafkaPeer(PeerContext(work / "kafka", args.cache, 0, 0))
                _log("  starting Kafka")
                await kafka.setup()
                kafka_version = kafka.version
            except (PeerUnavailable, ImportError, RuntimeError, TimeoutError) as exc:
                _log(f"  Kafka unavailable: {exc}")
                kafka_version = f"unavailable: {exc}"
                if kafka is not None:
                    await kafka.teardown()
                kafka = None
        session = NodeSession(node.url)
        async with seglog.open(work / "embedded", fsync="always") as store:
            for value_bytes in args.sizes if "produce" in args.sections else ():
                n = args.records or (args.records_100 if value_bytes <= 100 else args.records_1k)
                workload = make_workload(n, value_bytes, args.batch)
                env = Env(node.url, session, store, kafka, workload)
                await run_size(env, node, value_bytes, args, rows)
            for shards in args.e2e_shards if "e2e" in args.sections else ():
                env = Env(node.url, session, store, kafka, make_workload(1, 100, 1), shards=shards)
                _log(f"  end to end, {shards} shards, {args.e2e_rate:,} records/s for {args.e2e_seconds:g} s")
                for producer in (False, True):
                    e = await end_to_end(
                        env, node, args.e2e_rate, args.e2e_seconds, args.e2e_tick_ms, producer=producer
                    )
                    rows.append(e)
                    _log(
                        f"  {e.system}: e2e p50 {e.p50_ms:.1f} ms p99 {e.p99_ms:.1f} ms max {e.extra['max_ms']:.1f} ms"
                    )
        await session.close()
    finally:
        if profiler is not None:
            profiler.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
            profiler.wait(60)
        if kafka is not None:
            await kafka.teardown()
        node.stop()
        shutil.rmtree(work, ignore_errors=True)
    meta = run_meta(
        args,
        load_start,
        t_start,
        git=_git_state() + (f", seglog imported from {SEGLOG_ROOT}" if SEGLOG_ROOT else ""),
        kafka=kafka_version,
    )
    return render(meta, rows, args), {"meta": meta, "rows": [r.to_json() for r in rows]}


def _f(value: float | None, digits: int = 1) -> str:
    if value is None or value != value:
        return ""
    return f"{value:,.{digits}f}"


def render(meta: dict[str, Any], rows: list[Row], args: argparse.Namespace) -> str:
    out = [
        f"# seglog network benchmark, {meta['date']} ({meta['mode']})",
        "",
        f"Machine: {meta['machine']}; data dir filesystem: {meta['filesystem']}; {meta['load']}; "
        f"code: {meta['git']}; Kafka: {meta['kafka']}. The server, the bench client (and Kafka's JVM) "
        "share the machine's cores.",
        "",
        "One `seglog serve --fsync always` process; every append acknowledged only once fsynced (Kafka: "
        "acks=all, `log.flush.interval.messages=1`). Keys on every record (10,000 devices, a topic per "
        f"device); batches of {args.batch:,} records; `senders` tasks each keep one batch in flight. "
        "Ratios: records/s divided by the embedded row of the same section, shape and value size in this "
        "run. ack = batch handed over -> acknowledged. server CPU = the `seglog serve` process's CPU "
        "seconds during the row; client CPU = the bench process's (which also runs the embedded store).",
        "",
        "| section | value | shape | system | records/s | MB/s | ack p50 ms | ack p99 ms | server CPU s "
        "| client CPU s | ratio | status |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if r.section == "e2e":
            continue
        out.append(
            f"| {r.section} | {r.value_bytes} B | {r.shape} | {r.system} | {_f(r.records_s, 0)} | "
            f"{_f(r.mb_s)} | {_f(r.p50_ms, 2)} | {_f(r.p99_ms, 2)} | {_f(r.server_cpu_s, 2)} | "
            f"{_f(r.client_cpu_s, 2)} | {_f(r.ratio, 2)} | {r.status} |"
        )
    e2e = [r for r in rows if r.section == "e2e"]
    if e2e:
        out += [
            "",
            "End to end: one sender paced by a clock schedule hands a table of 100 B values (`ts` = "
            "wall clock at send) to the node every tick: posted as one Arrow body (several posts in flight), "
            "or given to `Producer.send_arrow` (acks=1: the node's fsynced write; its own batching, one "
            "request in flight per shard); one `Consumer` tails every shard with one long poll; "
            "latency = wall clock when `getmany_arrow` returned the record - its `ts`. ack = the tick's "
            "table handed over -> acknowledged; late ticks = ticks sent more than a tick behind schedule.",
            "",
            "| shape | sender | target records/s | achieved records/s | records | e2e p50 ms | e2e p99 ms "
            "| e2e max ms | ack p50 ms | ack p99 ms | late ticks | server CPU s | client CPU s |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in e2e:
            x = r.extra
            out.append(
                f"| {r.shape} | {r.system.split(' ->')[0]} | {x['target_rate']:,.0f} | {x['achieved_rate']:,.0f} | {r.records:,} | "
                f"{_f(r.p50_ms, 2)} | {_f(r.p99_ms, 2)} | {_f(x['max_ms'], 2)} | {_f(x['ack_p50_ms'], 2)} | "
                f"{_f(x['ack_p99_ms'], 2)} | {x['late_ticks']:.0f} | {_f(r.server_cpu_s, 2)} | "
                f"{_f(r.client_cpu_s, 2)} |"
            )
    out += [
        "",
        "Inputs are built before timing in each system's native form (Arrow tables; NDJSON bytes; Kafka "
        "(key, value, ts, topic header) per partition, partitions chosen with aiokafka's murmur2); the "
        "Arrow IPC serialisation and aiokafka's record building are timed. Consume rows drain what the "
        "produce rows of the first shape wrote, from offset 0, with one reader over every shard, "
        f"{args.consume_runs} times (the median drain is shown); "
        "getmany_arrow ends in Arrow tables, getmany and aiokafka in Python objects per record. "
        f"Runtime {meta['runtime_s']} s.",
    ]
    return "\n".join(out) + "\n"


def add_workload_args(p: argparse.ArgumentParser, *, quick_records: str) -> None:
    """The produce workload's options (value sizes, records, batch, senders), shared by
    ``bench.net`` and ``bench.cluster``."""
    p.add_argument(
        "--sizes", type=lambda v: [int(x) for x in v.split(",")], default=[100, 1024], help="value sizes (B)"
    )
    p.add_argument(
        "--records",
        type=int,
        default=None,
        help=f"records per size (default 1M at 100 B, 250k at 1 KiB; --quick {quick_records})",
    )
    p.add_argument("--records-100", type=int, default=1_000_000, help=argparse.SUPPRESS)
    p.add_argument("--records-1k", type=int, default=250_000, help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, default=5000, help="records per produce batch")
    p.add_argument("--senders", type=int, default=4, help="concurrent senders (batches in flight)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes: well under 3 minutes")
    add_workload_args(p, quick_records="200k/50k")
    p.add_argument("--shards", type=int, default=16, help="shards (Kafka partitions)")
    p.add_argument("--consume-runs", type=int, default=3, help="drains per consume row (the median is shown)")
    p.add_argument("--only", default="", help="run only the rows whose name matches this regex")
    p.add_argument("--no-single", action="store_true", help="skip the 1 sender/1 shard shape")
    p.add_argument("--no-kafka", action="store_true", help="skip the Kafka rows")
    p.add_argument("--e2e-rate", type=int, default=50_000, help="records/s of the end-to-end sender")
    p.add_argument("--e2e-seconds", type=float, default=None, help="default 10 (--quick: 3)")
    p.add_argument(
        "--e2e-shards",
        type=lambda v: [int(x) for x in v.split(",")],
        default=None,
        help="shard counts of the end-to-end runs (default: 1 and --shards)",
    )
    p.add_argument("--e2e-tick-ms", type=float, default=5.0, help="the paced sender posts a batch every tick")
    p.add_argument(
        "--sections",
        type=lambda v: set(v.split(",")),
        default={"produce", "consume", "e2e"},
        help="comma-separated subset of produce,consume,e2e (consume needs produce)",
    )
    p.add_argument(
        "--profile-server",
        type=Path,
        default=None,
        help="record the server with py-spy (pip install py-spy) into this file (raw folded stacks)",
    )
    p.add_argument(
        "--profile-args", default="--gil", help="extra py-spy arguments (default: only the GIL holder)"
    )
    p.add_argument("--cache", type=Path, default=CACHE_DIR, help="where `make peer-kafka` put the jars")
    p.add_argument("--out", type=Path, default=None, help="directory of the report (default bench/results)")
    p.add_argument("--dir", default=None, help="where to put temporary data (default: system temp)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.quick:
        args.records_100, args.records_1k = 200_000, 50_000
    if args.e2e_shards is None:
        args.e2e_shards = sorted({1, args.shards})
    if args.e2e_seconds is None:
        args.e2e_seconds = 3.0 if args.quick else 10.0
    text, data = asyncio.run(run(args))
    print(text)
    out_dir = args.out or RESULTS_DIR
    stem = f"{'quick-' if args.quick else ''}net-{data['meta']['date']}"
    out_dir.mkdir(parents=True, exist_ok=True)
    md = out_dir / f"{stem}.md"
    md.write_text(text)
    md.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
    _log(f"wrote {md} and {md.with_suffix('.json')} ({data['meta']['runtime_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
