"""Apache Kafka, one KRaft broker+controller from the Maven Central jars (``make peers``)."""

from __future__ import annotations

import asyncio
import base64
import functools
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiokafka
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from bench.peers import READ_PAGE_RECORDS, PeerContext, PeerUnavailable, Row, Workload
from bench.peers._server import LOOPBACK_HOST, ServerProcess, free_port, port_open

if TYPE_CHECKING:
    from bench.peers import Page

TOPIC = "bench"
PARTITION = 0
JVM_HEAP = "-Xmx1g"
JVM_HEAP_START = "-Xms512m"
FORMAT_TIMEOUT_S = 120.0
START_TIMEOUT_S = 120.0
REQUEST_TIMEOUT_MS = 120_000
MAX_BATCH_BYTES = 4 << 20
MAX_MESSAGE_BYTES = 16 << 20
FETCH_MAX_BYTES = 64 << 20
FETCH_TIMEOUT_MS = 5_000
STALLED_FETCHES_MAX = 12
TS_BYTES = 8
TOPIC_ALREADY_EXISTS = 36  # Kafka protocol error code
# Record: key = topic (UTF-8), value = 8-byte big-endian ts + value, one partition.

_LOG4J2_PROPERTIES = """\
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.stdout.ref = STDOUT
"""


def _cluster_id() -> str:
    """A random Kafka cluster id (URL-safe base64 of a UUID, as ``kafka-storage random-uuid``).

    Never one starting with ``-`` (Kafka's ``Uuid.randomUuid`` avoids them too): the storage
    tool's argument parser would take it for an option.
    """
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


class KafkaPeer:
    """aiokafka with ``acks=all``; the broker fsyncs every append (``log.flush.interval.messages=1``)."""

    name = "kafka"
    durability = "acks=all, log.flush.interval.messages=1 (fsync per append before ack)"

    def __init__(self, ctx: PeerContext, brokers: int = 1, min_insync: int = 1) -> None:
        """``brokers`` combined broker+controller nodes (a KRaft quorum of that many voters);
        topics get a replica on each broker and ``min.insync.replicas=min_insync``."""
        self.ctx = ctx
        self.brokers = brokers
        self.min_insync = min_insync
        self.home = ctx.cache_dir / "kafka"
        self.version = "?"
        self.server_pid: int | None = None
        self._servers: list[ServerProcess] = []
        self._producer: Any = None
        self._bootstrap = ""

    @property
    def bootstrap(self) -> str:
        """``host:port[,host:port...]`` of the running brokers (after ``setup()``)."""
        return self._bootstrap

    def _java_cmd(self, log4j_conf: str) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise PeerUnavailable("java not on PATH")
        libs = self.home / "libs"
        if not any(libs.glob("kafka_*.jar")):
            raise PeerUnavailable(f"Kafka jars missing in {libs} (run `make peers`)")
        return [
            java,
            JVM_HEAP_START,
            JVM_HEAP,
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={log4j_conf}",
            "-cp",
            f"{libs}/*",
        ]

    def _properties(self, node_id: int, work: Path, port: int, controller_port: int, voters: str) -> str:
        internal_rf = min(self.brokers, 3)
        internal_isr = min(self.min_insync, internal_rf)
        return "\n".join(
            [
                "process.roles=broker,controller",
                f"node.id={node_id}",
                f"controller.quorum.voters={voters}",
                f"listeners=PLAINTEXT://{LOOPBACK_HOST}:{port},CONTROLLER://{LOOPBACK_HOST}:{controller_port}",
                f"advertised.listeners=PLAINTEXT://{LOOPBACK_HOST}:{port}",
                "controller.listener.names=CONTROLLER",
                "inter.broker.listener.name=PLAINTEXT",
                "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                f"log.dirs={work / 'kafka-logs'}",
                f"metadata.log.dir={work / 'kraft-metadata'}",
                "num.partitions=1",
                f"default.replication.factor={self.brokers}",
                f"min.insync.replicas={self.min_insync}",
                "auto.create.topics.enable=false",
                f"offsets.topic.replication.factor={internal_rf}",
                f"transaction.state.log.replication.factor={internal_rf}",
                f"transaction.state.log.min.isr={internal_isr}",
                f"share.coordinator.state.topic.replication.factor={internal_rf}",
                f"share.coordinator.state.topic.min.isr={internal_isr}",
                "group.initial.rebalance.delay.ms=0",
                "log.flush.interval.messages=1",
                # The workloads' record timestamps lie in 2023, past the 7-day default: the
                # broker's first retention check (30 s after start) deleted whole partitions
                # before a later consume row read them ("read 0 of 1000000").
                "log.retention.ms=-1",
                f"message.max.bytes={MAX_MESSAGE_BYTES}",
                f"replica.fetch.max.bytes={MAX_MESSAGE_BYTES}",
                "num.network.threads=2",
                "num.io.threads=2",
                "",
            ]
        )

    async def setup(self) -> None:
        """Format KRaft storage, start the brokers, create the topic through the producer."""
        work = self.ctx.work_dir
        log4j_conf = work / "log4j2.properties"
        log4j_conf.write_text(_LOG4J2_PROPERTIES)
        java = self._java_cmd(str(log4j_conf))
        ids = range(1, self.brokers + 1)
        ports = {i: (free_port(), free_port()) for i in ids}
        voters = ",".join(f"{i}@{LOOPBACK_HOST}:{ports[i][1]}" for i in ids)
        cluster_id = _cluster_id()
        version_file = self.home / "VERSION"
        kafka_version = version_file.read_text().strip() if version_file.is_file() else "?"
        props: dict[int, Path] = {}
        for i in ids:
            # One broker keeps the single-broker layout (work dir itself) of earlier runs.
            node_work = work if self.brokers == 1 else work / f"broker{i}"
            node_work.mkdir(parents=True, exist_ok=True)
            props[i] = node_work / "server.properties"
            props[i].write_text(self._properties(i, node_work, *ports[i], voters))
            fmt = subprocess.run(
                [*java, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props[i])],
                capture_output=True,
                text=True,
                timeout=FORMAT_TIMEOUT_S,
                check=False,
            )
            if fmt.returncode != 0:
                raise RuntimeError(f"kafka storage format failed: {(fmt.stderr or fmt.stdout)[-300:]}")
        for i in ids:
            server = ServerProcess(
                f"kafka broker {i}",
                [*java, "kafka.Kafka", str(props[i])],
                props[i].parent / "kafka.log",
                cwd=props[i].parent,
            )
            server.start()
            self._servers.append(server)
        self.server_pid = self._servers[0].pid
        for server, i in zip(self._servers, ids, strict=True):
            await server.wait_until(functools.partial(port_open, ports[i][0]), "broker port", START_TIMEOUT_S)
        self._bootstrap = ",".join(f"{LOOPBACK_HOST}:{ports[i][0]}" for i in ids)
        await self._servers[0].wait_until(self._create_topic, "topic creation", START_TIMEOUT_S)
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self._bootstrap,
            acks="all",
            linger_ms=0,
            max_batch_size=MAX_BATCH_BYTES,
            max_request_size=MAX_MESSAGE_BYTES,
            request_timeout_ms=REQUEST_TIMEOUT_MS,
            enable_idempotence=False,
        )
        await self._producer.start()
        # Waits until the new topic's leader is in the metadata.
        await asyncio.wait_for(self._producer.partitions_for(TOPIC), START_TIMEOUT_S)
        brokers = (
            "" if self.brokers == 1 else f", {self.brokers} brokers, min.insync.replicas={self.min_insync}"
        )
        self.version = f"Kafka {kafka_version} (KRaft{brokers}), aiokafka {aiokafka.__version__}"

    def cpu_s(self) -> float:
        """CPU seconds of every broker process so far."""
        return sum(s.cpu_s() for s in self._servers)

    async def _create_topic(self) -> bool:
        """Create the one-partition topic through the admin API; True once it exists."""
        await self.create_topic(TOPIC, 1)
        return True

    async def create_topic(self, name: str, partitions: int) -> None:
        """Create topic ``name`` with ``partitions`` partitions (an existing one is left as is)."""
        admin = AIOKafkaAdminClient(
            bootstrap_servers=self._bootstrap,
            request_timeout_ms=REQUEST_TIMEOUT_MS,
        )
        await admin.start()
        try:
            response = await admin.create_topics(
                [
                    NewTopic(
                        name,
                        num_partitions=partitions,
                        replication_factor=self.brokers,
                        topic_configs={
                            "max.message.bytes": str(MAX_MESSAGE_BYTES),
                            "min.insync.replicas": str(self.min_insync),
                        },
                    )
                ]
            )
        finally:
            await admin.close()
        error_code = response.topic_errors[0][1]
        if error_code not in (0, TOPIC_ALREADY_EXISTS):
            raise RuntimeError(f"CreateTopics error {response.topic_errors[0]}")

    def encode(self, workload: Workload, start: int, stop: int) -> list[tuple[bytes, bytes]]:
        """(key, value) pairs."""
        return [
            (topic.encode(), ts.to_bytes(TS_BYTES, "big", signed=True) + value)
            for topic, ts, value in zip(
                workload.topics[start:stop],
                workload.ts[start:stop],
                workload.values[start:stop],
                strict=True,
            )
        ]

    async def write_batch(self, batch: list[tuple[bytes, bytes]]) -> None:
        """Build one record batch (split only if it overflows), send it, await the acks."""
        producer = self._producer
        futures = []
        builder = producer.create_batch()
        for key, value in batch:
            if builder.append(key=key, value=value, timestamp=None) is None:
                futures.append(await producer.send_batch(builder, TOPIC, partition=PARTITION))
                builder = producer.create_batch()
                if builder.append(key=key, value=value, timestamp=None) is None:
                    raise ValueError("record larger than max_batch_size")
        futures.append(await producer.send_batch(builder, TOPIC, partition=PARTITION))
        await asyncio.gather(*futures)

    async def read_all(self) -> AsyncIterator[Page]:
        """A group-less consumer assigned to the partition, from the beginning to the end offset."""
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=MAX_MESSAGE_BYTES,
            fetch_max_bytes=FETCH_MAX_BYTES,
            request_timeout_ms=REQUEST_TIMEOUT_MS,
        )
        await consumer.start()
        try:
            tp = TopicPartition(TOPIC, PARTITION)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            end = (await consumer.end_offsets([tp]))[tp]
            stalled = 0
            while await consumer.position(tp) < end:
                batches = await consumer.getmany(
                    tp,
                    timeout_ms=FETCH_TIMEOUT_MS,
                    max_records=READ_PAGE_RECORDS,
                )
                msgs = batches.get(tp, [])
                if not msgs:
                    stalled += 1
                    if stalled >= STALLED_FETCHES_MAX:
                        raise TimeoutError(f"no records fetched for {stalled} polls before {end}")
                    continue
                stalled = 0
                page: list[Row] = [
                    (
                        m.key.decode(),
                        int.from_bytes(m.value[:TS_BYTES], "big", signed=True),
                        m.value[TS_BYTES:],
                    )
                    for m in msgs
                ]
                yield page
        finally:
            await consumer.stop()

    async def teardown(self) -> None:
        """Stop the producer and the broker."""
        if self._producer is not None:
            try:
                await self._producer.stop()
            finally:
                self._producer = None
        servers, self._servers = self._servers, []
        for server in servers:
            server.stop()
