"""Cluster benchmark (issue 13): a 3-node replicated cluster against one node and embedded seglog.

    python -m bench.cluster [--quick] [--sizes 100,1024] [--records N] [--kills N]
                            [--steady-rate R] [--steady-shards 1,16] [--node-ttl-s S]
                            [--no-kafka] [--out DIR]

Starts one etcd and three ``seglog serve --fsync always --etcd ...`` nodes (plus one plain
``seglog serve --fsync always`` node for the single-node rows) on this machine: every node
shares its disk and its cores with the others and with this process. Three sections:

* produce: the same keyed workload as ``bench/net.py`` (10,000 devices, a key and a topic on
  every record, batches of ``--batch``, ``--senders`` tasks each keeping one batch in flight)
  into 16 shards through embedded ``append_arrow`` (the baseline), ``Producer`` against the
  single node, and ``Producer(bootstrap=...)`` against a replicated database (replication
  factor 3, ``min_insync`` 2) with ``acks="all"``, ``"quorum"`` and ``1``; and Kafka with
  three KRaft brokers (topic replication factor 3, ``min.insync.replicas=2``, fsync per
  append, aiokafka acks=all; ``bench/peers/kafka_kraft.py``), started only for its rows and
  warmed up untimed first. Each row gets a fresh database (topic); records/s, MB/s, ack
  p50/p99 (batch handed over -> acknowledged), and ratios to the embedded, single-node and
  Kafka rows of the same value size.
* steady: a producer paced by a clock schedule at ``--steady-rate`` records/s (``acks="all"``,
  100 B values, ``ts`` = wall clock at send) while a ``Consumer`` tails every shard (on the
  cluster with ``bootstrap=``: it fetches each shard from its leader); ack p50/p99 and
  end-to-end p50/p99 (receipt - ``ts``). Run on the single node and on the cluster, into
  databases of each of ``--steady-shards`` shards.
* failover: a paced ``acks="all"`` producer writes one record to each shard every
  ``--failover-tick-ms``; ``--kills`` times the leader of shard 0 is SIGKILLed, and the
  failover time is kill -> the first acknowledgement of a shard-0 record sent after the
  kill. The killed node is restarted and the next kill waits until it is back in every
  shard's ISR. After each kill every record acknowledged since the previous check is read
  back from its shard's leader at its acknowledged offset; at the end every acknowledged
  record is checked again from offset 0. Any loss is printed loudly and shown in the table.

Writes ``bench/results/cluster-<date>.md`` and ``.json`` (``--quick``: ``quick-cluster-<date>``;
``--label L``: ``cluster-L-<date>``) and prints the Markdown.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

import seglog
from bench import net
from bench.core import run_meta
from bench.net import Env, ProduceRow, Row, Send, _f, _log, _pct
from bench.peers._server import LOOPBACK_HOST, ServerProcess, free_port, port_open
from seglog._routing import route_rows
from seglog.client import Consumer, Producer
from seglog.client._http import NodeSession
from seglog.cluster import protocol
from seglog.errors import SeglogError
from seglog.record import decode_frames

T = TypeVar("T")
REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "bench" / "results"
NODES = 3
SHARDS = 16
REPLICATION_FACTOR = 3
MIN_INSYNC = 2
START_TIMEOUT_S = 60.0
READY_TIMEOUT_S = 120.0
POLL_S = 0.05
READ_MAX_BYTES = 4 << 20
FAILOVER_VALUE_BYTES = 100
# How long the producer runs steadily before each kill (so every kill hits a busy leader).
PRE_KILL_S = 0.5
SEQ_DIGITS = 12
KAFKA_WARMUP_RECORDS = 50_000


EMBEDDED = "embedded append_arrow"
SINGLE = "single node Producer"
KAFKA_ROW = ProduceRow("Kafka 3 brokers aiokafka (acks=all, min.insync=2)", net.kafka_produce, "kafka")


# --- processes -------------------------------------------------------------------------------


class Etcd:
    """One single-member etcd on loopback ports (Debian's ``etcd-server``, ``make etcd``)."""

    def __init__(self, work: Path) -> None:
        binary = shutil.which("etcd")
        if binary is None:
            raise RuntimeError("etcd is not installed: run `make etcd`")
        self.url = f"http://{LOOPBACK_HOST}:{free_port()}"
        peer = f"http://{LOOPBACK_HOST}:{free_port()}"
        argv = [
            binary,
            "--name=seglog-bench",
            f"--data-dir={work / 'etcd'}",
            f"--listen-client-urls={self.url}",
            f"--advertise-client-urls={self.url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=seglog-bench={peer}",
        ]
        self.process = ServerProcess("etcd", argv, work / "etcd.log")

    def _healthy(self) -> bool:
        with urllib.request.urlopen(self.url + "/health", timeout=1) as resp:
            return bool(json.loads(resp.read()).get("health") == "true")

    async def start(self) -> None:
        self.process.start()
        await self.process.wait_until(self._healthy, "etcd health", START_TIMEOUT_S)

    def stop(self) -> None:
        self.process.stop()


class ClusterNode:
    """One ``seglog serve --fsync always --etcd ...`` member; a restart keeps its port and data."""

    def __init__(self, work: Path, node_id: int, etcd_url: str, ttl_s: int) -> None:
        self.node_id = node_id
        self.port = free_port()
        self.url = f"http://{LOOPBACK_HOST}:{self.port}"
        argv = [
            sys.executable,
            "-m",
            "seglog.cli",
            "serve",
            str(work / f"node{node_id}"),
            "--listen",
            f"{LOOPBACK_HOST}:{self.port}",
            "--advertise",
            self.url,
            "--fsync",
            "always",
            "--etcd",
            etcd_url,
            "--node-id",
            str(node_id),
            "--node-ttl-s",
            str(ttl_s),
        ]
        self.process = ServerProcess(f"seglog node {node_id}", argv, work / f"node{node_id}.log")
        self.alive = False
        # CPU seconds of earlier incarnations (a killed process's CPU is not readable any more).
        self._cpu_before = 0.0

    async def start(self) -> None:
        self.process.start()
        self.alive = True
        await self.process.wait_until(lambda: port_open(self.port), f"node {self.node_id}", START_TIMEOUT_S)

    def cpu_s(self) -> float:
        return self._cpu_before + (self.process.cpu_s() if self.alive else 0.0)

    def kill(self) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            self._cpu_before += self.process.cpu_s()
        self.alive = False
        self.process.kill()

    def stop(self) -> None:
        self.alive = False
        self.process.stop()


class Cluster:
    """Three nodes and their etcd; metadata questions go to whichever live node answers."""

    def __init__(self, work: Path, ttl_s: int) -> None:
        self.ttl_s = ttl_s
        self.etcd = Etcd(work)
        self.nodes = {i: ClusterNode(work, i, self.etcd.url, ttl_s) for i in range(1, NODES + 1)}
        self.sessions = {i: NodeSession(n.url, timeout_s=10.0) for i, n in self.nodes.items()}

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes.values()]

    def cpu_s(self) -> float:
        """CPU seconds of all three nodes (a row charges the difference)."""
        return sum(n.cpu_s() for n in self.nodes.values())

    async def start(self) -> None:
        await self.etcd.start()
        await asyncio.gather(*(n.start() for n in self.nodes.values()))
        await until(self._all_registered, "all nodes registered in etcd", READY_TIMEOUT_S)

    async def _all_registered(self) -> bool:
        return len((await self.view())["nodes"]) == NODES

    async def stop(self) -> None:
        for s in self.sessions.values():
            await s.close()
        for n in self.nodes.values():
            n.stop()
        self.etcd.stop()

    async def view(self, node_id: int | None = None) -> dict[str, Any]:
        """``GET /v1/cluster`` from ``node_id``, or from the first live node that answers."""
        ids = [node_id] if node_id is not None else [i for i, n in self.nodes.items() if n.alive]
        last: Exception | None = None
        for i in ids:
            try:
                reply = await self.sessions[i].request("GET", "/v1/cluster")
            except SeglogError as exc:
                last = exc
                continue
            view: dict[str, Any] = reply.json()
            return view
        raise RuntimeError(f"no live node answered /v1/cluster: {last!r}")

    async def create(self, name: str, shards: int = SHARDS) -> str:
        """Create a replicated database and wait until every shard has a leader and a full ISR."""
        body = {
            "name": name,
            "shards": shards,
            "replication_factor": REPLICATION_FACTOR,
            "min_insync": MIN_INSYNC,
        }
        first = next(i for i, n in self.nodes.items() if n.alive)
        await self.sessions[first].request("POST", f"{protocol.API_PREFIX}/dbs", json_body=body)
        await self.wait_healthy(name)
        return name

    async def leaders(self, name: str) -> list[int] | None:
        """Each shard's leader when every leader says it leads with a full ISR, else None."""
        leaders: dict[int, int] = {}
        for i, n in self.nodes.items():
            if not n.alive:
                continue
            view = await self.view(i)
            for p in view["leading"]:
                if p["db"] == name and len(p["isr"]) == REPLICATION_FACTOR:
                    leaders[int(p["shard"])] = i
        shards = len((await self.view())["dbs"].get(name, {}).get("state", []))
        if not shards or len(leaders) != shards:
            return None
        return [leaders[s] for s in range(shards)]

    async def wait_healthy(self, name: str) -> list[int]:
        """Wait until every live node is registered and ``leaders(name)`` holds; return the leaders."""
        return await until(
            lambda: self.leaders(name), f"{name}: every shard led with a full ISR", READY_TIMEOUT_S
        )

    async def count(self, name: str) -> int:
        """Records stored: the sum of every shard's log end on its leader."""
        leaders = await self.wait_healthy(name)
        ends: dict[int, list[int]] = {}
        for node_id in set(leaders):
            reply = await self.sessions[node_id].request("GET", f"{protocol.API_PREFIX}/dbs/{name}")
            ends[node_id] = [int(o["end"]) for o in reply.json()["offsets"]]
        return sum(ends[leader][s] for s, leader in enumerate(leaders))

    async def read(self, name: str, shard: int, start: int, stop: int) -> dict[int, bytes]:
        """Values at offsets ``[start, stop)`` of ``shard``, read from its leader (below the HW)."""
        leaders = await self.wait_healthy(name)
        session = self.sessions[leaders[shard]]
        out: dict[int, bytes] = {}
        offset = start
        while offset < stop:
            reply = await session.request(
                "GET",
                f"{protocol.API_PREFIX}/dbs/{name}/shards/{shard}/frames",
                params={"offset": offset, "max_bytes": READ_MAX_BYTES},
            )
            hw = int(reply.headers[protocol.HEADER_HIGH_WATERMARK])
            if not reply.body:
                break
            table = decode_frames(reply.body, offset, min(hw, stop))
            if not len(table):
                break
            offsets = table.column("offset").to_pylist()
            out.update(zip(offsets, table.column("value").to_pylist(), strict=True))
            offset = offsets[-1] + 1
        return out


async def until(check: Callable[[], Awaitable[T | None]], what: str, timeout_s: float) -> T:
    """Poll ``check`` (async) until it returns something truthy (a deadline, not a fixed sleep)."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            value = await check()
            if value:
                return value
        except (SeglogError, RuntimeError, OSError) as exc:
            last = exc
        await asyncio.sleep(POLL_S)
    raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what} (last error: {last!r})")


# --- produce ---------------------------------------------------------------------------------


def producer_opener(
    acks: str, urls: list[str] | None, in_flight: int
) -> Callable[[Env], contextlib.AbstractAsyncContextManager[Send]]:
    """``Producer.send_arrow`` rows: ``urls`` None = the single node of ``env.url``, else a cluster."""

    @asynccontextmanager
    async def open_(env: Env) -> AsyncIterator[Send]:
        url, bootstrap = (env.url, None) if urls is None else (urls[0], urls[1:])
        async with Producer(
            url,
            env.db,
            acks=acks,  # type: ignore[arg-type]
            max_batch_bytes=4 << 20,
            max_in_flight=in_flight,
            bootstrap=bootstrap,
        ) as producer:

            async def send(table: pa.Table) -> None:
                await (await producer.send_arrow(table))

            yield send

    return open_


def produce_specs(cluster: Cluster, in_flight: int) -> list[ProduceRow]:
    """Rows in table order: embedded (baseline), single node, then the cluster per acks mode."""
    return [
        ProduceRow(EMBEDDED, net.embedded_arrow, "embedded", baseline=True),
        ProduceRow(SINGLE, producer_opener("all", None, in_flight), "node"),
        *(
            ProduceRow(
                f"3-node cluster Producer acks={acks}",
                producer_opener(acks, cluster.urls, in_flight),
                "cluster",
            )
            for acks in ("all", "quorum", "1")
        ),
    ]


class Servers:
    """The row's server side: the single node or the cluster, for CPU accounting."""

    def __init__(self, node: net.Node, cluster: Cluster) -> None:
        self.node = node
        self.cluster = cluster
        self.target = "node"

    def cpu_s(self) -> float:
        return self.cluster.cpu_s() if self.target == "cluster" else self.node.cpu_s()


async def run_produce_size(
    env: Env, servers: Servers, value_bytes: int, args: argparse.Namespace, rows: list[Row]
) -> None:
    """Every produce row at one value size; a failing row is a row, not a failed run."""
    targets = net.Targets(env)
    cluster = servers.cluster
    env.senders, env.shards = args.senders, SHARDS
    for spec in produce_specs(cluster, args.in_flight):
        servers.target = spec.target
        try:
            if spec.target == "cluster":
                targets.serial += 1
                env.db = await cluster.create(f"b{value_bytes}-cluster-{targets.serial}")
            else:
                env.db = await targets.create(spec.target, SHARDS, value_bytes)
            await asyncio.to_thread(os.sync)  # no row pays for the previous one's writeback
            row = await net.run_produce(spec, env, servers)
            stored = await (
                cluster.count(env.db) if spec.target == "cluster" else targets.count(spec.target, env.db)
            )
            if stored != env.workload.n:
                row.status = f"stored {stored} of {env.workload.n}"
        except Exception as exc:
            _log(f"  {value_bytes} B {spec.name}: FAILED {type(exc).__name__}: {exc}")
            rows.append(
                Row("produce", value_bytes, "", spec.name, status=f"failed: {type(exc).__name__}: {exc}")
            )
            continue
        rows.append(row)
        _log(
            f"  {value_bytes} B {spec.name}: {row.records_s:,.0f} rec/s, ack p50 {row.p50_ms:.1f} ms "
            f"p99 {row.p99_ms:.1f} ms"
        )


async def run_kafka(args: argparse.Namespace, work: Path, rows: list[Row]) -> str:
    """The Kafka rows (3 brokers, acks=all, min.insync.replicas=2), started only for them.

    Returns the Kafka version, or why it did not run.
    """
    from bench.peers import PeerContext, PeerUnavailable
    from bench.peers.kafka_kraft import KafkaPeer

    (work / "kafka").mkdir()
    kafka = KafkaPeer(PeerContext(work / "kafka", args.cache, 0, 0), brokers=NODES, min_insync=MIN_INSYNC)
    try:
        _log(f"  starting Kafka, {NODES} brokers")
        try:
            await kafka.setup()
        except (PeerUnavailable, RuntimeError, TimeoutError) as exc:
            _log(f"  Kafka unavailable: {exc}")
            for value_bytes in args.sizes:
                rows.append(Row("produce", value_bytes, "", KAFKA_ROW.name, status=f"skipped: {exc}"))
            return f"unavailable: {exc}"
        # Untimed: the JVMs' JIT warms up on a throwaway topic (seglog's rows need no warm-up).
        warm = Env("", None, None, kafka, net.make_workload(KAFKA_WARMUP_RECORDS, 100, args.batch))  # type: ignore[arg-type]
        warm.senders, warm.shards = args.senders, SHARDS
        try:
            warm.db = await net.Targets(warm).create("kafka", SHARDS, 0)
            await net.run_produce(KAFKA_ROW, warm, kafka)
        except Exception as exc:  # the timed rows still run, and say what fails
            _log(f"  Kafka warm-up failed: {type(exc).__name__}: {exc}")
        for value_bytes in args.sizes:
            n = args.records or (args.records_100 if value_bytes <= 100 else args.records_1k)
            env = Env("", None, None, kafka, net.make_workload(n, value_bytes, args.batch))  # type: ignore[arg-type]
            env.senders, env.shards = args.senders, SHARDS
            targets = net.Targets(env)
            try:
                env.db = await targets.create("kafka", SHARDS, value_bytes)
                await asyncio.to_thread(os.sync)
                row = await net.run_produce(KAFKA_ROW, env, kafka)
                stored = await targets.count("kafka", env.db)
                if stored != env.workload.n:
                    row.status = f"stored {stored} of {env.workload.n}"
            except Exception as exc:
                _log(f"  {value_bytes} B Kafka: FAILED {type(exc).__name__}: {exc}")
                rows.append(
                    Row(
                        "produce",
                        value_bytes,
                        "",
                        KAFKA_ROW.name,
                        status=f"failed: {type(exc).__name__}: {exc}",
                    )
                )
                continue
            rows.append(row)
            _log(
                f"  {value_bytes} B {KAFKA_ROW.name}: {row.records_s:,.0f} rec/s, ack p99 {row.p99_ms:.1f} ms"
            )
        return str(kafka.version)
    finally:
        await kafka.teardown()


def set_ratios(rows: list[Row]) -> None:
    """Per value size: records/s over the embedded, single-node and Kafka rows of this run."""
    ok = {(r.value_bytes, r.system): r for r in rows if r.section == "produce" and r.status == "ok"}
    for r in rows:
        if r.section != "produce" or r.status != "ok":
            continue
        refs = {
            "embedded": ok.get((r.value_bytes, EMBEDDED)),
            "vs_single": ok.get((r.value_bytes, SINGLE)),
            "vs_kafka": ok.get((r.value_bytes, KAFKA_ROW.name)),
        }
        for key, ref in refs.items():
            if ref is None or ref is r or not ref.records_s:
                continue
            if key == "embedded":
                r.ratio = r.records_s / ref.records_s
            elif r.system != EMBEDDED and (key == "vs_single" or r.system.startswith("3-node")):
                r.extra[key] = r.records_s / ref.records_s


# --- steady rate, end to end -----------------------------------------------------------------


async def steady(
    name: str,
    db: str,
    producer_url: str,
    bootstrap: list[str] | None,
    cpu: Callable[[], float],
    rate: int,
    seconds: float,
    tick_ms: float,
) -> Row:
    """A producer paced at ``rate`` records/s (acks=all, 100 B) and tailing consumers.

    Args:
        name: Row label.
        db: The (empty) database.
        producer_url: The node the producer starts from.
        bootstrap: The other cluster nodes (None: a single node); the consumer takes them too.
        cpu: CPU seconds of the server side.
        rate: Records per second.
        seconds: How long the schedule runs.
        tick_ms: The producer hands over one table per tick.
    """
    per_tick = max(1, round(rate * tick_ms / 1000))
    ticks = max(1, round(seconds * 1000 / tick_ms))
    keys, topics = net.device_columns()

    # Built before the clock (only the send-time ``ts`` is added at each tick): generating the
    # workload on the schedule took CPU from the nodes it measures (the same two cores).
    ticks_tables = []
    for i in range(ticks):
        devices = pa.array((np.arange(per_tick) + i * per_tick) % net.DEVICES)
        ticks_tables.append(
            pa.table(
                {
                    "topic": topics.take(devices),
                    "key": keys.take(devices),
                    "value": net.text_values(per_tick, 100, i),
                }
            )
        )

    def table_for(i: int, ts: int) -> pa.Table:
        return ticks_tables[i].add_column(0, "ts", pa.array(np.full(per_tick, ts, np.int64)))

    async with contextlib.AsyncExitStack() as stack:
        producer = await stack.enter_async_context(
            Producer(producer_url, db, acks="all", linger_ms=1, max_in_flight=SHARDS, bootstrap=bootstrap)
        )
        consumer = await stack.enter_async_context(
            Consumer(producer_url, db, auto_offset_reset="earliest", bootstrap=bootstrap)
        )

        async def send(table: pa.Table) -> object:
            return await (await producer.send_arrow(table))

        paced = await net.paced_tail(
            consumer, send, table_for, per_tick=per_tick, ticks=ticks, tick_ms=tick_ms, server_cpu_s=cpu
        )
    return paced.row("steady", f"{rate:,} records/s, {per_tick} every {tick_ms:g} ms", name, rate)


async def quiesce(session: NodeSession, cluster: Cluster) -> None:
    """Drop the produce section's databases on the single node and the cluster, then ``sync``.

    Their gigabytes of dirty pages would otherwise be written back by the kernel during the
    steady section and queue every fdatasync of it behind them (ack p99 ~100-200 ms at one
    shard instead of ~10): the steady rows measure the paced stream, not the previous rows.
    """
    targets = [session, cluster.sessions[next(i for i, n in cluster.nodes.items() if n.alive)]]
    for target in targets:
        names = (await target.request("GET", f"{protocol.API_PREFIX}/dbs")).json()["dbs"]
        for name in names:
            await target.request("DELETE", f"{protocol.API_PREFIX}/dbs/{name}")
    await asyncio.to_thread(os.sync)


async def run_steady(
    node: net.Node, session: NodeSession, cluster: Cluster, shards: int, args: argparse.Namespace
) -> list[Row]:
    """The steady-rate rows at ``shards`` shards: the single node, then the cluster."""
    name = f"steady-{shards}"
    await session.request("POST", f"{protocol.API_PREFIX}/dbs", json_body={"name": name, "shards": shards})
    _log(
        f"  steady {args.steady_rate:,} records/s for {args.steady_seconds:g} s, {shards} shards: single node"
    )
    pace = (args.steady_rate, args.steady_seconds, args.steady_tick_ms)
    out = [
        await steady(
            "single node Producer acks=all -> Consumer",
            name,
            node.url,
            None,
            node.cpu_s,
            *pace,
        )
    ]
    await cluster.create(name, shards)
    _log(f"  steady, {shards} shards: 3-node cluster")
    out.append(
        await steady(
            "3-node cluster Producer acks=all -> Consumer (bootstrap)",
            name,
            cluster.urls[0],
            cluster.urls[1:],
            cluster.cpu_s,
            *pace,
        )
    )
    for r in out:
        r.shape = f"{shards} shard{'s' if shards > 1 else ''}, {r.shape}"
        x = r.extra
        _log(
            f"  {r.system}: ack p99 {x['ack_p99_ms']:.1f} ms, e2e p50 {r.p50_ms:.1f} p99 {r.p99_ms:.1f} ms"
            + ("" if r.status == "ok" else f" ({r.status})")
        )
    return out


# --- failover --------------------------------------------------------------------------------


@dataclass
class Kill:
    """One leader SIGKILL and what followed."""

    n: int
    killed: int
    was_controller: bool
    new_leader: int = -1
    elected_ms: float | None = None
    failover_ms: float | None = None
    rejoin_s: float | None = None
    checked: int = 0
    lost: int = 0
    status: str = "ok"


@dataclass
class Failover:
    """The failover section: every kill, the final check, the settings."""

    ttl_s: int
    tick_ms: float
    kills: list[Kill] = field(default_factory=list)
    acked: int = 0
    failed_sends: int = 0
    final_checked: int = 0
    final_lost: int = 0
    duplicates: int = 0
    status: str = "ok"

    def times_ms(self) -> list[float]:
        return [k.failover_ms for k in self.kills if k.failover_ms is not None]


def shard_keys(shards: int) -> list[tuple[bytes, str]]:
    """One device (key, topic) per shard, by the routing rule the producer and server share."""
    keys, topics = net.device_columns()
    routes = route_rows(topics, keys, shards)
    out: list[tuple[bytes, str]] = []
    for s in range(shards):
        d = int(np.flatnonzero(routes == s)[0])
        out.append((keys[d].as_py(), topics[d].as_py()))
    return out


class FailoverRun:
    """A paced acks=all producer over every shard, the kills, and the read-back checks."""

    def __init__(self, cluster: Cluster, db: str, args: argparse.Namespace) -> None:
        self.cluster = cluster
        self.db = db
        self.tick_s = args.failover_tick_ms / 1000
        self.result = Failover(cluster.ttl_s, args.failover_tick_ms)
        self.keys = shard_keys(SHARDS)
        # shard -> offset -> sequence number, for records acknowledged and not yet checked.
        self.unchecked: dict[int, dict[int, int]] = {s: {} for s in range(SHARDS)}
        self.all_acked: dict[int, dict[int, int]] = {s: {} for s in range(SHARDS)}
        self.kill_at: float | None = None
        self.first_ack_after_kill: float | None = None
        self.recovered = asyncio.Event()
        self.seq = 0

    def _on_ack(self, fut: asyncio.Future[Any], shard: int, seq: int, sent: float) -> None:
        if fut.cancelled() or fut.exception() is not None:
            self.result.failed_sends += 1
            return
        meta = fut.result()
        now = time.perf_counter()
        self.unchecked[shard][meta.offset] = seq
        self.all_acked[shard][meta.offset] = seq
        self.result.acked += 1
        if (
            shard == 0
            and self.kill_at is not None
            and sent >= self.kill_at
            and self.first_ack_after_kill is None
        ):
            self.first_ack_after_kill = now
            self.recovered.set()

    async def _produce(self, producer: Producer, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        pad = b"x" * (FAILOVER_VALUE_BYTES - SEQ_DIGITS)
        tick = 0
        while not stop.is_set():
            delay = start + tick * self.tick_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tick += 1
            for shard, (key, topic) in enumerate(self.keys):
                self.seq += 1
                seq = self.seq
                sent = time.perf_counter()
                fut = await producer.send(topic, f"{seq:0{SEQ_DIGITS}d}".encode() + pad, key=key)
                fut.add_done_callback(functools.partial(self._on_ack, shard=shard, seq=seq, sent=sent))

    async def _elected(self, old_epoch: int) -> float | None:
        """When a live node's metadata first names a leader of shard 0 above ``old_epoch``."""
        state = (await self.cluster.view())["dbs"][self.db]["state"][0]
        if int(state["leader_epoch"]) > old_epoch and int(state["leader"]) >= 0:
            return time.perf_counter()
        return None

    async def _check(self, acked: dict[int, dict[int, int]]) -> tuple[int, int, int]:
        """Read every record in ``acked`` back from its leader: (checked, lost, duplicates seen)."""
        checked = lost = dups = 0
        for shard, by_offset in acked.items():
            if not by_offset:
                continue
            lo, hi = min(by_offset), max(by_offset) + 1
            stored = await self.cluster.read(self.db, shard, lo, hi)
            seen: dict[int, int] = {}
            for value in stored.values():
                q = int(value[:SEQ_DIGITS])
                seen[q] = seen.get(q, 0) + 1
            dups += sum(c - 1 for c in seen.values())
            for offset, seq in by_offset.items():
                checked += 1
                got = stored.get(offset)
                if got is None or int(got[:SEQ_DIGITS]) != seq:
                    lost += 1
        return checked, lost, dups

    async def run(self, kills: int) -> Failover:
        cluster = self.cluster
        stop = asyncio.Event()
        async with (
            Producer(
                cluster.urls[0],
                self.db,
                acks="all",
                linger_ms=1,
                max_in_flight=SHARDS,
                retries=None,  # keep retrying through the election
                retry_backoff_ms=10,
                retry_backoff_max_ms=50,
                request_timeout_ms=10_000,
                bootstrap=cluster.urls[1:],
            ) as producer
        ):
            sender = asyncio.create_task(self._produce(producer, stop))
            try:
                for n in range(1, kills + 1):
                    await self._one_kill(n)
            finally:
                stop.set()
                await sender
                with contextlib.suppress(SeglogError, TimeoutError):
                    await asyncio.wait_for(producer.flush(), 60)
        await cluster.wait_healthy(self.db)
        checked, lost, dups = await self._check(self.all_acked)
        r = self.result
        r.final_checked, r.final_lost, r.duplicates = checked, lost, dups
        if lost or any(k.lost for k in r.kills):
            r.status = "LOSS: acknowledged records missing"
        return r

    async def _one_kill(self, n: int) -> None:
        cluster = self.cluster
        leaders = await cluster.wait_healthy(self.db)
        victim = leaders[0]
        before = await cluster.view(victim)
        was_controller = bool(before.get("controller"))
        old_epoch = int(before["dbs"][self.db]["state"][0]["leader_epoch"])
        await asyncio.sleep(PRE_KILL_S)  # the paced producer keeps running meanwhile
        kill = Kill(n, victim, was_controller)
        self.first_ack_after_kill = None
        self.recovered.clear()
        self.kill_at = time.perf_counter()
        cluster.nodes[victim].kill()
        timeout = max(30.0, 10.0 * cluster.ttl_s)
        election = asyncio.create_task(until(lambda: self._elected(old_epoch), "a new leader", timeout))
        try:
            await asyncio.wait_for(self.recovered.wait(), timeout)
            assert self.first_ack_after_kill is not None
            kill.failover_ms = (self.first_ack_after_kill - self.kill_at) * 1000
            kill.elected_ms = (await election - self.kill_at) * 1000
        except TimeoutError:
            kill.status = f"no shard-0 ack within {timeout:g} s"
        finally:
            election.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await election
        view = await cluster.view()
        kill.new_leader = int(view["dbs"][self.db]["state"][0]["leader"])
        t0 = time.perf_counter()
        await cluster.nodes[victim].start()
        await cluster.wait_healthy(self.db)
        kill.rejoin_s = time.perf_counter() - t0
        batch, self.unchecked = self.unchecked, {s: {} for s in range(SHARDS)}
        kill.checked, kill.lost, _ = await self._check(batch)
        if kill.lost:
            kill.status = f"LOSS: {kill.lost} acknowledged records missing"
            _log(f"  !!! kill {n}: {kill.lost} of {kill.checked} acknowledged records NOT readable !!!")
        self.result.kills.append(kill)
        _log(
            f"  kill {n}: node {victim}{' (controller)' if was_controller else ''} -> leader {kill.new_leader}, "
            f"elected {_f(kill.elected_ms)} ms, failover {_f(kill.failover_ms)} ms, rejoined in {kill.rejoin_s:.1f} s, "
            f"{kill.checked} acked records checked, {kill.lost} lost"
        )


# --- run -------------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    work = Path(tempfile.mkdtemp(prefix="seglog-cluster-bench-", dir=args.dir))
    load_start = os.getloadavg()[0]
    t_start = time.perf_counter()
    rows: list[Row] = []
    failover: Failover | None = None
    kafka_version = "not run (--no-kafka)"
    node = net.Node(work)
    cluster = Cluster(work, args.node_ttl_s)
    session = NodeSession(node.url)
    try:
        _log(f"  starting etcd, {NODES} cluster nodes and a single node in {work}")
        await asyncio.gather(node.start(), cluster.start())
        servers = Servers(node, cluster)
        async with seglog.open(work / "embedded", fsync="always") as store:
            for value_bytes in args.sizes if "produce" in args.sections else ():
                n = args.records or (args.records_100 if value_bytes <= 100 else args.records_1k)
                env = Env(node.url, session, store, None, net.make_workload(n, value_bytes, args.batch))
                await run_produce_size(env, servers, value_bytes, args, rows)
        if "produce" in args.sections and not args.no_kafka:
            kafka_version = await run_kafka(args, work, rows)
        set_ratios(rows)
        if "produce" in args.sections and "steady" in args.sections:
            await quiesce(session, cluster)
        for shards in args.steady_shards if "steady" in args.sections else ():
            rows += await run_steady(node, session, cluster, shards, args)
        if "failover" in args.sections and args.kills:
            db = await cluster.create("failover")
            _log(f"  failover: {args.kills} leader kills, node TTL {args.node_ttl_s} s")
            failover = await FailoverRun(cluster, db, args).run(args.kills)
            _log(
                f"  failover p50 {_f(_pct(failover.times_ms(), 50))} ms max {_f(max(failover.times_ms(), default=None))} ms; "
                f"final check {failover.final_checked} acknowledged, {failover.final_lost} lost, "
                f"{failover.duplicates} duplicates"
            )
            if failover.status != "ok":
                _log(f"  !!! {failover.status} !!!")
    finally:
        await session.close()
        node.stop()
        await cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    meta = run_meta(args, load_start, t_start, kafka=kafka_version)
    data = {
        "meta": meta,
        "rows": [r.to_json() for r in rows],
        "failover": None
        if failover is None
        else {
            **asdict(failover),
            "p50_ms": _pct(failover.times_ms(), 50),
            "max_ms": max(failover.times_ms(), default=None),
        },
    }
    return render(meta, rows, failover, args), data


def render(meta: dict[str, Any], rows: list[Row], failover: Failover | None, args: argparse.Namespace) -> str:
    out = [
        f"# seglog cluster benchmark, {meta['date']} ({meta['mode']})",
        "",
        f"Machine: {meta['machine']}; data dir filesystem: {meta['filesystem']}; {meta['load']}; "
        f"code: {meta['git']}; Kafka: {meta['kafka']}. **All three cluster nodes, etcd, the single node "
        "and this bench client share the machine's two cores and one disk** (Kafka's three JVMs run "
        "only during their rows, alone): replication here costs CPU and fsyncs that separate "
        "machines would not take from each other.",
        "",
        f"Every node runs `seglog serve --fsync always`; the cluster database has {SHARDS} shards, "
        f"replication factor {REPLICATION_FACTOR}, `min_insync` {MIN_INSYNC}, node lease TTL "
        f"{args.node_ttl_s} s. Keys on every record (10,000 devices, a topic per device); batches of "
        f"{args.batch:,} records; {args.senders} senders each keep one batch in flight; Producer "
        f"`max_in_flight` {args.in_flight}. ack = batch handed over -> acknowledged. Ratios: records/s "
        "over the embedded row, the single-node row and the Kafka row of the same value size in this "
        "run. server CPU = CPU seconds of the single node, or of all three cluster nodes, during the "
        "row. Kafka: 3 KRaft broker+controller JVMs, topic replication factor 3, "
        "`min.insync.replicas=2`, every broker fsyncs each append (`log.flush.interval.messages=1`), "
        "aiokafka acks=all, records built per partition with `create_batch`/`send_batch`.",
    ]
    produce_rows = sorted((r for r in rows if r.section == "produce"), key=lambda r: r.value_bytes)
    if produce_rows:
        out += [
            "",
            "| value | system | records/s | MB/s | ack p50 ms | ack p99 ms | server CPU s | client CPU s "
            "| vs embedded | vs single node | vs Kafka | status |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
    for r in produce_rows:
        out.append(
            f"| {r.value_bytes} B | {r.system} | {_f(r.records_s, 0)} | {_f(r.mb_s)} | {_f(r.p50_ms, 2)} | "
            f"{_f(r.p99_ms, 2)} | {_f(r.server_cpu_s, 2)} | {_f(r.client_cpu_s, 2)} | {_f(r.ratio, 2)} | "
            f"{_f(r.extra.get('vs_single'), 2)} | {_f(r.extra.get('vs_kafka'), 2)} | {r.status} |"
        )
    steady_rows = [r for r in rows if r.section == "steady"]
    if steady_rows:
        out += [
            "",
            f"Steady rate: one `Producer` (acks=all) paced by a clock schedule, 100 B values, `ts` = wall "
            f"clock at send, for {args.steady_seconds:g} s; a `Consumer` tails every shard with long polls "
            "(cluster: `bootstrap=`, one poll per leader node over the shards it leads). ack = `send_arrow` -> "
            "acknowledged; e2e = receipt - `ts`; late ticks = ticks handed over more than a tick behind.",
            "",
            "| system | shape | achieved records/s | records | ack p50 ms | ack p99 ms | e2e p50 ms | e2e p99 ms "
            "| e2e max ms | late ticks | server CPU s | status |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for r in steady_rows:
            x = r.extra
            out.append(
                f"| {r.system} | {r.shape} | {x['achieved_rate']:,.0f} | {r.records:,} | {_f(x['ack_p50_ms'], 2)} | "
                f"{_f(x['ack_p99_ms'], 2)} | {_f(r.p50_ms, 2)} | {_f(r.p99_ms, 2)} | {_f(x['max_ms'], 2)} | "
                f"{x['late_ticks']:.0f} | {_f(r.server_cpu_s, 2)} | {r.status} |"
            )
    if failover is not None:
        times = failover.times_ms()
        out += [
            "",
            f"Failover: a `Producer` (acks=all, retries until stopped, backoff 10-50 ms) writes one 100 B "
            f"record to each of the {SHARDS} shards every {failover.tick_ms:g} ms; the leader of shard 0 is "
            f"SIGKILLed {len(failover.kills)} times; failover = kill -> first acknowledgement of a shard-0 "
            f"record sent after the kill. Node lease TTL {failover.ttl_s} s (target: under 2 x TTL = "
            f"{2000 * failover.ttl_s:,} ms). The killed node restarts and rejoins every ISR before the "
            "next kill; elected = kill -> a live node's metadata names a new leader of shard 0 (lease "
            "expiry, controller election; polled every 50 ms), the rest of the failover is the new leader "
            "taking over and the producer finding it; checked = records acknowledged since the previous "
            "check, read back from each shard's leader at their acknowledged offsets.",
            "",
            f"**failover p50 {_f(_pct(times, 50), 0)} ms, max {_f(max(times, default=None), 0)} ms** over "
            f"{len(times)} of {len(failover.kills)} kills; {failover.acked:,} records acknowledged, "
            f"{failover.failed_sends} sends failed; final check from offset 0: {failover.final_checked:,} "
            f"acknowledged records read back, **{failover.final_lost} lost**, {failover.duplicates} "
            f"duplicates (the `Producer` is idempotent, its default: a retried batch is stored once). Status: "
            f"**{failover.status}**.",
            "",
            "| kill | killed node | was controller | new leader | elected ms | failover ms | rejoin s | checked "
            "| lost | status |",
            "|---:|---:|---|---:|---:|---:|---:|---:|---:|---|",
        ]
        for k in failover.kills:
            out.append(
                f"| {k.n} | {k.killed} | {'yes' if k.was_controller else 'no'} | {k.new_leader} | "
                f"{_f(k.elected_ms, 0)} | {_f(k.failover_ms, 0)} | {_f(k.rejoin_s)} | {k.checked:,} | {k.lost} | {k.status} |"
            )
    out += [
        "",
        "Kafka takes part in the produce rows only (no steady-rate or failover rows for it). "
        f"Runtime {meta['runtime_s']} s.",
    ]
    return "\n".join(out) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes and 3 kills: under 3 minutes")
    net.add_workload_args(p, quick_records="100k/25k")
    p.add_argument("--in-flight", type=int, default=SHARDS, help="Producer max_in_flight (requests)")
    p.add_argument("--steady-rate", type=int, default=10_000, help="records/s of the steady producer")
    p.add_argument("--steady-seconds", type=float, default=None, help="default 10 (--quick: 3)")
    p.add_argument(
        "--steady-shards",
        type=lambda v: [int(x) for x in v.split(",")],
        default=[1, SHARDS],
        help="shard counts of the steady runs (default 1,16)",
    )
    p.add_argument("--steady-tick-ms", type=float, default=5.0, help="the steady producer sends every tick")
    p.add_argument("--kills", type=int, default=None, help="leader SIGKILLs (default 20, --quick 3)")
    p.add_argument("--failover-tick-ms", type=float, default=10.0, help="one record per shard every tick")
    p.add_argument("--node-ttl-s", type=int, default=2, help="cluster node lease TTL (seconds)")
    p.add_argument(
        "--sections",
        type=lambda v: set(v.split(",")),
        default={"produce", "steady", "failover"},
        help="comma-separated subset of produce,steady,failover",
    )
    p.add_argument("--no-kafka", action="store_true", help="skip the Kafka rows (3 brokers)")
    p.add_argument("--cache", type=Path, default=net.CACHE_DIR, help="where `make peer-kafka` put the jars")
    p.add_argument("--out", type=Path, default=None, help="directory of the report (default bench/results)")
    p.add_argument("--label", default="", help="report name: cluster-LABEL-<date> (a variant run)")
    p.add_argument("--dir", default=None, help="where to put temporary data (default: system temp)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.quick:
        args.records_100, args.records_1k = 100_000, 25_000
    if args.kills is None:
        args.kills = 3 if args.quick else 20
    if args.steady_seconds is None:
        args.steady_seconds = 3.0 if args.quick else 10.0
    text, data = asyncio.run(run(args))
    print(text)
    out_dir = args.out or RESULTS_DIR
    label = f"{args.label}-" if args.label else ""
    stem = f"{'quick-' if args.quick else ''}cluster-{label}{data['meta']['date']}"
    out_dir.mkdir(parents=True, exist_ok=True)
    md = out_dir / f"{stem}.md"
    md.write_text(text)
    md.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
    _log(f"wrote {md} and {md.with_suffix('.json')} ({data['meta']['runtime_s']} s)")
    failover = data["failover"]
    return 1 if failover is not None and failover["status"] != "ok" else 0


if __name__ == "__main__":
    sys.exit(main())
