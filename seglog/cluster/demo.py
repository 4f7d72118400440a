"""``seglog demo-cluster``: a 3-node cluster loses its leader mid-stream and nothing acknowledged is lost.

Starts one etcd (Debian's ``etcd-server``; ``make etcd`` installs it) and three ``seglog serve
--fsync always --etcd ...`` nodes on loopback ports in a temporary directory, creates a
replicated database (replication factor 3, ``min_insync`` 2), and runs a
``Producer(bootstrap=...)`` with ``acks="all"`` sending keyed records, each value a unique
sequence number. Part way through, the leader of shard 0 (and of every other shard it leads)
is SIGKILLed; the producer keeps sending (it re-routes to the new leaders the controller
elects from the ISR). The killed node is then restarted and rejoins every ISR. Every node
tiers into one shared directory (``--tier``): each shard's leader seals and uploads its
segments as Parquet, the followers then drop their local copies, and a
``Consumer(bootstrap=...)`` reads every shard from the start, the tiered part through the tier.

Printed: records acknowledged, records read back, lost (an acknowledged sequence number not
read back at its acknowledged shard and offset: must be 0), duplicates (the producer is
idempotent: a request retried after the kill whose first attempt had landed is answered with
the first attempt's offsets, not stored again: must be 0), the requests retried, and the
failover time (SIGKILL -> the first ``acks="all"`` write acknowledged on each new leader), and
the tier objects and the bytes left on the nodes' disks.
The exit status is 1 if anything acknowledged is missing or stored twice.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

from seglog.client import Consumer, Producer
from seglog.client._http import NodeSession
from seglog.cluster import protocol
from seglog.cluster.etcd import EtcdClient
from seglog.errors import InvalidArgument, SeglogError
from seglog.record import RecordMeta

__all__ = ["DemoResult", "run_demo"]

T = TypeVar("T")
HOST: Final = "127.0.0.1"
DB: Final = "demo"
NODES: Final = 3
REPLICATION_FACTOR: Final = 3
MIN_INSYNC: Final = 2
REPLICA_LAG_TIME_MAX_MS: Final = 3000
START_TIMEOUT_S: Final = 60.0
READY_TIMEOUT_S: Final = 60.0
POLL_S: Final = 0.05
SEQ_DIGITS: Final = 12
DEVICES: Final = 1000
VALUE_BYTES: Final = 100
# Records per pacing tick (the rate sets how many ticks per second).
TICK_RECORDS: Final = 20


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


async def _until(check: Callable[[], Awaitable[T | None]], what: str, timeout_s: float) -> T:
    """Poll ``check`` until it returns something truthy (a deadline, not a fixed sleep).

    Raises:
        SeglogError: The deadline passed (names the last error seen).
    """
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            value = await check()
            if value is not None and value is not False:
                return value
        except (SeglogError, OSError) as exc:
            last = exc
        await asyncio.sleep(POLL_S)
    raise SeglogError(f"timed out after {timeout_s:g} s waiting for {what} (last error: {last!r})")


class _Child:
    """A child process whose output goes to a log file."""

    def __init__(self, name: str, argv: list[str], log: Path) -> None:
        self.name = name
        self.argv = argv
        self.log = log
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=asyncio.subprocess.STDOUT
            )

    def check_running(self) -> None:
        """Raise if the child exited (with the end of its log)."""
        if self.proc is not None and self.proc.returncode is not None:
            tail = self.log.read_text(errors="replace")[-2000:]
            raise SeglogError(f"{self.name} exited with {self.proc.returncode}:\n{tail}")

    async def kill(self) -> None:
        """SIGKILL (a crash) and reap."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()

    async def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM and wait (SIGKILL after ``timeout_s``)."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout_s)
            except TimeoutError:
                await self.kill()


class _Cluster:
    """etcd and three nodes under ``work``; questions go to whichever live node answers."""

    def __init__(self, work: Path, ttl_s: int) -> None:
        binary = shutil.which("etcd")
        if binary is None:
            raise SeglogError("etcd is not installed: run `make etcd` (Debian's etcd-server)")
        self.etcd_url = f"http://{HOST}:{_free_port()}"
        peer = f"http://{HOST}:{_free_port()}"
        self.etcd = _Child(
            "etcd",
            [
                binary,
                "--name=seglog-demo",
                f"--data-dir={work / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=seglog-demo={peer}",
            ],
            work / "etcd.log",
        )
        self.urls: dict[int, str] = {}
        self.nodes: dict[int, _Child] = {}
        for i in range(1, NODES + 1):
            port = _free_port()
            self.urls[i] = f"http://{HOST}:{port}"
            argv = [
                sys.executable,
                "-m",
                "seglog.cli",
                "serve",
                str(work / f"node{i}"),
                "--listen",
                f"{HOST}:{port}",
                "--advertise",
                self.urls[i],
                "--fsync",
                "always",
                "--etcd",
                self.etcd_url,
                "--node-id",
                str(i),
                "--node-ttl-s",
                str(ttl_s),
                # The leader checks its ISR every quarter of this: a restarted node rejoins
                # within about a second instead of the default's 7.5 s.
                "--replica-lag-time-max-ms",
                str(REPLICA_LAG_TIME_MAX_MS),
                # One tier for the cluster; tiered by the demo's step (0: no timer).
                "--tier",
                (work / "tier").as_uri(),
                "--tier-interval-ms",
                "0",
            ]
            self.nodes[i] = _Child(f"node {i}", argv, work / f"node{i}.log")
        self.sessions = {i: NodeSession(url, timeout_s=5) for i, url in self.urls.items()}

    async def start(self) -> None:
        await self.etcd.start()
        await _until(self._etcd_healthy, "etcd to become healthy", START_TIMEOUT_S)
        for node in self.nodes.values():
            await node.start()
        await _until(self._all_registered, "all three nodes registered in etcd", START_TIMEOUT_S)

    async def _etcd_healthy(self) -> bool:
        self.etcd.check_running()
        # A read served is the readiness that matters (MetadataError until then).
        async with EtcdClient(self.etcd_url, request_timeout_s=1) as etcd:
            await etcd.get(b"/seglog-demo/ready")
        return True

    async def _all_registered(self) -> bool:
        for node in self.nodes.values():
            node.check_running()
        views = await self.views()
        return len(views) == NODES and all(len(v["nodes"]) == NODES for v in views.values())

    async def views(self) -> dict[int, dict[str, Any]]:
        """``GET /v1/cluster`` of every live node that answers."""
        out = {}
        for i, node in self.nodes.items():
            if not node.alive:
                continue
            with contextlib.suppress(SeglogError):
                reply = await self.sessions[i].request("GET", f"{protocol.API_PREFIX}/cluster")
                out[i] = reply.json()
        return out

    async def leaders(self, shards: int, full_isr: bool) -> dict[int, int] | None:
        """Shard -> the live node leading it by its own account (with a full ISR if asked)."""
        led: dict[int, int] = {}
        for i, view in (await self.views()).items():
            for p in view["leading"]:
                if p["db"] == DB and (not full_isr or len(p["isr"]) == REPLICATION_FACTOR):
                    led[int(p["shard"])] = i
        return led if len(led) == shards else None

    async def high_watermarks(self, shards: int) -> dict[int, int] | None:
        """Shard -> high watermark, from each shard's leader."""
        hws: dict[int, int] = {}
        for view in (await self.views()).values():
            for p in view["leading"]:
                if p["db"] == DB:
                    hws[int(p["shard"])] = int(p["high_watermark"])
        return hws if len(hws) == shards else None

    async def close(self) -> None:
        for s in self.sessions.values():
            await s.close()
        for node in self.nodes.values():
            await node.stop()
        await self.etcd.stop()


@dataclass
class DemoResult:
    """What the demo measured and checked."""

    acked: int = 0
    failed_sends: int = 0
    read_back: int = 0
    lost: int = 0
    duplicates: int = 0
    retried: int = 0
    killed: int = -1
    killed_shards: list[int] = field(default_factory=list)
    # Parquet objects committed to the tier, their bytes, and the bytes of segments the nodes
    # still hold of the tiered database afterwards (the active segments only).
    tier_objects: int = 0
    tier_bytes: int = 0
    local_bytes: int = 0
    # Shard -> ms from the SIGKILL to the first acknowledged write sent after it (new leader).
    failover_ms: dict[int, float] = field(default_factory=dict)
    rejoin_s: float = 0.0

    @property
    def ok(self) -> bool:
        """Nothing acknowledged is missing, nothing is stored twice."""
        return self.lost == 0 and self.duplicates == 0 and self.acked > 0


class _Run:
    """The paced keyed producer, the kill, and the bookkeeping of acknowledgements."""

    def __init__(self, cluster: _Cluster, args: argparse.Namespace) -> None:
        self.cluster = cluster
        self.args = args
        self.result = DemoResult()
        # seq -> (shard, offset) of every acknowledged record.
        self.acked: dict[int, tuple[int, int]] = {}
        self.kill_at: float | None = None
        self.seq = 0

    def _on_ack(self, fut: asyncio.Future[RecordMeta], seq: int, sent: float) -> None:
        if fut.cancelled() or fut.exception() is not None:
            self.result.failed_sends += 1
            return
        meta = fut.result()
        self.acked[seq] = (meta.shard, meta.offset)
        r = self.result
        if self.kill_at is not None and sent >= self.kill_at and meta.shard in r.killed_shards:
            r.failover_ms.setdefault(meta.shard, (time.perf_counter() - self.kill_at) * 1000)

    async def _produce(self, producer: Producer, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        tick_s = TICK_RECORDS / self.args.rate
        start = loop.time()
        pad = b"x" * (VALUE_BYTES - SEQ_DIGITS)
        tick = 0
        while not stop.is_set():
            delay = start + tick * tick_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)  # the producer's pace, not synchronisation
            tick += 1
            for _ in range(TICK_RECORDS):
                self.seq += 1
                seq, device = self.seq, self.seq % DEVICES
                sent = time.perf_counter()
                fut = await producer.send(
                    f"site/{device % 10}/dev/{device}/temp",
                    f"{seq:0{SEQ_DIGITS}d}".encode() + pad,
                    key=b"dev-%d" % device,
                )
                fut.add_done_callback(functools.partial(self._on_ack, seq=seq, sent=sent))

    async def produce_and_kill(self) -> None:
        args, cluster, r = self.args, self.cluster, self.result
        urls = list(cluster.urls.values())
        stop = asyncio.Event()
        async with Producer(
            urls[0],
            DB,
            bootstrap=urls[1:],
            acks="all",
            linger_ms=5,
            retries=None,  # keep retrying through the election
            retry_backoff_ms=20,
            retry_backoff_max_ms=200,
            request_timeout_ms=10_000,
        ) as producer:
            t0 = time.perf_counter()
            sender = asyncio.create_task(self._produce(producer, stop))
            try:
                await asyncio.sleep(args.kill_after)  # the demo's schedule: produce, then kill
                leaders = await _until(
                    lambda: cluster.leaders(args.shards, full_isr=False), "every shard led", READY_TIMEOUT_S
                )
                r.killed = leaders[0]
                r.killed_shards = sorted(s for s, n in leaders.items() if n == r.killed)
                controller = any(v["controller"] for i, v in (await cluster.views()).items() if i == r.killed)
                self.kill_at = time.perf_counter()
                await cluster.nodes[r.killed].kill()
                print(
                    f"  t={self.kill_at - t0:4.1f} s  SIGKILL node {r.killed} (leader of shard(s) "
                    f"{', '.join(map(str, r.killed_shards))}{'; the controller' if controller else ''}), "
                    f"{len(self.acked):,} records acknowledged so far"
                )
                rest = args.seconds - (time.perf_counter() - t0)
                if rest > 0:
                    await asyncio.sleep(rest)  # keep producing through the failover
                await _until(self._recovered, "an acknowledged write on every new leader", READY_TIMEOUT_S)
                now = await _until(
                    lambda: cluster.leaders(args.shards, full_isr=False), "every shard led", READY_TIMEOUT_S
                )
                print(
                    "  new leaders (from the ISR): "
                    + ", ".join(f"shard {s} -> node {now[s]}" for s in r.killed_shards)
                    + "; the producer re-routed to them"
                )
            finally:
                stop.set()
                await sender
                with contextlib.suppress(SeglogError, TimeoutError):
                    await asyncio.wait_for(producer.flush(), READY_TIMEOUT_S)
            r.retried = producer.retried_requests
            print(f"  t={time.perf_counter() - t0:4.1f} s  producer stopped and flushed")

    async def _recovered(self) -> bool:
        return set(self.result.failover_ms) == set(self.result.killed_shards)

    async def rejoin(self) -> None:
        """Restart the killed node and wait until it is back in every shard's ISR."""
        t0 = time.perf_counter()
        await self.cluster.nodes[self.result.killed].start()
        await _until(
            lambda: self.cluster.leaders(self.args.shards, full_isr=True),
            f"node {self.result.killed} back in every ISR",
            READY_TIMEOUT_S,
        )
        self.result.rejoin_s = time.perf_counter() - t0

    async def tier(self) -> None:
        """Seal and upload on every shard's leader, then let the followers drop what is tiered."""
        cluster, r = self.cluster, self.result
        path = f"{protocol.API_PREFIX}/dbs/{DB}/tier"
        # A node leads some shards and follows others: a first pass on every node seals and
        # uploads what each leads, a second lets each drop the copies the others uploaded.
        for seal in (True, False):
            for node in cluster.urls:
                reply = (await cluster.sessions[node].request("POST", path, json_body={"seal": seal})).json()
                r.tier_objects += len(reply["committed"])
                r.tier_bytes += sum(e["bytes"] for e in reply["committed"])
        for node in cluster.urls:
            desc = (await cluster.sessions[node].request("GET", f"{protocol.API_PREFIX}/dbs/{DB}")).json()
            r.local_bytes += sum(t["hot_bytes"] + t["warm_bytes"] for t in desc["tier"])
        print(
            f"  tiered: {r.tier_objects} Parquet objects ({r.tier_bytes:,} bytes), each uploaded by its "
            f"shard's leader; {r.local_bytes:,} bytes of segments left on the nodes"
        )

    async def read_back(self) -> None:
        """Consume every shard from the start up to its high watermark; check the acknowledgements."""
        cluster, r = self.cluster, self.result
        hws = await _until(
            lambda: cluster.high_watermarks(self.args.shards), "high watermarks", READY_TIMEOUT_S
        )
        want = sum(hws.values())
        urls = list(cluster.urls.values())
        stored: dict[tuple[int, int], int] = {}
        async with Consumer(urls[0], DB, bootstrap=urls[1:], max_wait_ms=200) as consumer:
            while len(stored) < want:
                got = await consumer.getmany_arrow(timeout_ms=int(READY_TIMEOUT_S * 1000))
                if not got:
                    raise SeglogError(
                        f"the consumer got nothing for {READY_TIMEOUT_S:g} s after {len(stored):,}"
                    )
                for shard, table in got.items():
                    offsets = table.column("offset").to_pylist()
                    values = table.column("value").to_pylist()
                    for offset, value in zip(offsets, values, strict=True):
                        stored[(shard, offset)] = int(value[:SEQ_DIGITS])
        r.read_back = len(stored)
        r.acked = len(self.acked)
        r.lost = sum(1 for seq, where in self.acked.items() if stored.get(where) != seq)
        r.duplicates = len(stored) - len(set(stored.values()))


def _report(r: DemoResult, ttl_s: int) -> None:
    times = sorted(r.failover_ms.values())
    failover = f"{times[-1]:,.0f} ms" if times else "n/a"
    per_shard = ", ".join(f"shard {s} {ms:,.0f} ms" for s, ms in sorted(r.failover_ms.items()))
    rows = [
        ("acknowledged", f"{r.acked:,}", 'records the producer got an acks="all" acknowledgement for'),
        (
            "failed sends",
            f"{r.failed_sends:,}",
            "sends that never got one (retried without limit: 0 expected)",
        ),
        ("read back", f"{r.read_back:,}", "records a Consumer(bootstrap=...) read below the high watermark"),
        ("lost", f"{r.lost:,}", "acknowledged records missing or not at their acknowledged offset"),
        (
            "duplicates",
            f"{r.duplicates:,}",
            "records stored twice (the producer is idempotent: a retry of a request that had "
            "landed gets its first offsets)",
        ),
        (
            "retried",
            f"{r.retried:,}",
            "produce requests the producer sent again (timeouts, NotLeader, refused)",
        ),
        (
            "failover",
            failover,
            f"SIGKILL -> first acknowledged write on the new leader ({per_shard}; node lease TTL {ttl_s} s)",
        ),
        ("rejoin", f"{r.rejoin_s:.1f} s", f"node {r.killed} restarted -> back in every ISR"),
        (
            "tiered",
            f"{r.tier_objects:,}",
            f"Parquet objects ({r.tier_bytes:,} bytes) uploaded by the shards' leaders; read back "
            f"through the tier with {r.local_bytes:,} bytes of segments left on the nodes",
        ),
    ]
    print()
    for name, value, note in rows:
        print(f"{name:<14}{value:>12}  {note}")
    print()
    if r.ok:
        print("OK: nothing acknowledged was lost, nothing was stored twice")
    else:
        print(f"FAILED: {r.lost:,} acknowledged records were lost, {r.duplicates:,} stored twice")


async def run_demo(args: argparse.Namespace) -> DemoResult:
    """Run the cluster demo (see the module docstring); print as it goes and the summary.

    Raises:
        InvalidArgument: Inconsistent options.
        SeglogError: etcd or a node did not start, or the cluster did not recover in time.
    """
    if not 0 < args.kill_after < args.seconds:
        raise InvalidArgument(
            f"--kill-after must be in (0, --seconds={args.seconds:g}), not {args.kill_after:g}"
        )
    if args.rate < TICK_RECORDS or args.shards < 1 or args.node_ttl_s < 1:
        raise InvalidArgument(f"--rate must be >= {TICK_RECORDS}, --shards and --node-ttl-s >= 1")
    work = Path(tempfile.mkdtemp(prefix="seglog-cluster-demo-", dir=args.dir))
    cluster = _Cluster(work, args.node_ttl_s)
    print(f"seglog cluster demo in {work}: etcd + {NODES} `seglog serve --fsync always` nodes")
    try:
        await cluster.start()
        print(f"  etcd {cluster.etcd_url}; nodes " + ", ".join(f"{i}: {u}" for i, u in cluster.urls.items()))
        body = {
            "name": DB,
            "shards": args.shards,
            "replication_factor": REPLICATION_FACTOR,
            "min_insync": MIN_INSYNC,
            # Local copies go once tiered: the read back below goes through the tier.
            "local_retention_bytes": 0,
        }
        await cluster.sessions[1].request("POST", f"{protocol.API_PREFIX}/dbs", json_body=body)
        leaders = await _until(
            lambda: cluster.leaders(args.shards, full_isr=True),
            "every shard led with a full ISR",
            READY_TIMEOUT_S,
        )
        print(
            f"  database {DB!r}: {args.shards} shards, replication factor {REPLICATION_FACTOR}, "
            f"min_insync {MIN_INSYNC}; leaders "
            + ", ".join(f"shard {s} -> node {n}" for s, n in sorted(leaders.items()))
        )
        print(
            f'producing keyed records with acks="all" at {args.rate:,} records/s for {args.seconds:g} s, '
            f"SIGKILL of shard 0's leader at {args.kill_after:g} s ..."
        )
        run = _Run(cluster, args)
        await run.produce_and_kill()
        await run.rejoin()
        await run.tier()
        await run.read_back()
        _report(run.result, args.node_ttl_s)
        return run.result
    finally:
        await cluster.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
