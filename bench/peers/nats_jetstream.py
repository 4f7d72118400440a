"""NATS JetStream: nats-server (go install into the cache) with ``sync_interval: always``."""

from __future__ import annotations

import asyncio
import importlib.metadata
import shutil
import urllib.request
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType

from bench.peers import READ_PAGE_RECORDS, PeerContext, PeerUnavailable, Row, Workload
from bench.peers._server import LOOPBACK_HOST, ServerProcess, free_port

if TYPE_CHECKING:
    from bench.peers import Page

STREAM = "BENCH"
SUBJECTS = "sensors.>"
START_TIMEOUT_S = 30.0
ACK_TIMEOUT_S = 60.0
FETCH_TIMEOUT_S = 10.0
HEALTH_TIMEOUT_S = 1.0
TS_BYTES = 8
MAX_FILE_STORE_BYTES = 64 << 30
MAX_MEMORY_STORE_BYTES = 256 << 20

# Subject = topic with "/" -> "."; payload = 8-byte big-endian ts + value.


class NatsJetStreamPeer:
    """A file-backed stream on ``sensors.>``; async publishes, acks awaited per batch."""

    name = "nats"
    durability = "JetStream file store, sync_interval: always (fsync per message before ack)"

    def __init__(self, ctx: PeerContext) -> None:
        self.ctx = ctx
        self.version = "?"
        self.server_pid: int | None = None
        self._server: ServerProcess | None = None
        self._nc: Any = None
        self._js: Any = None

    def _binary(self) -> str:
        local = self.ctx.cache_dir / "bin" / "nats-server"
        if local.is_file():
            return str(local)
        found = shutil.which("nats-server")
        if found is None:
            raise PeerUnavailable(f"nats-server not in {local.parent} or PATH (run `make peers`)")
        return found

    async def setup(self) -> None:
        """Start nats-server with JetStream on free loopback ports, connect, create the stream."""
        exe = self._binary()
        port, http_port = free_port(), free_port()
        store_dir = self.ctx.work_dir / "jetstream"
        conf = self.ctx.work_dir / "nats.conf"
        conf.write_text(
            f'listen: "{LOOPBACK_HOST}:{port}"\n'
            f'http: "{LOOPBACK_HOST}:{http_port}"\n'
            "jetstream {\n"
            f'  store_dir: "{store_dir}"\n'
            "  sync_interval: always\n"
            f"  max_file_store: {MAX_FILE_STORE_BYTES}\n"
            f"  max_memory_store: {MAX_MEMORY_STORE_BYTES}\n"
            "}\n"
        )
        self._server = ServerProcess("nats-server", [exe, "-c", str(conf)], self.ctx.work_dir / "nats.log")
        self._server.start()
        self.server_pid = self._server.pid
        health_url = f"http://{LOOPBACK_HOST}:{http_port}/healthz?js-enabled-only=true"

        def healthy() -> bool:
            with urllib.request.urlopen(health_url, timeout=HEALTH_TIMEOUT_S) as resp:
                return bool(resp.status == 200)

        await self._server.wait_until(healthy, "/healthz", START_TIMEOUT_S)
        self._nc = await nats.connect(
            f"nats://{LOOPBACK_HOST}:{port}",
            allow_reconnect=False,
            connect_timeout=5,
        )
        self._js = self._nc.jetstream(timeout=ACK_TIMEOUT_S)
        await self._js.add_stream(
            name=STREAM,
            subjects=[SUBJECTS],
            storage=StorageType.FILE,
            num_replicas=1,
        )
        server = self._nc.connected_server_version
        self.version = (
            f"nats-server {server.major}.{server.minor}.{server.patch}, "
            f"nats-py {importlib.metadata.version('nats-py')}"
        )

    def encode(self, workload: Workload, start: int, stop: int) -> list[tuple[str, bytes]]:
        """(subject, payload) pairs."""
        return [
            (topic.replace("/", "."), ts.to_bytes(TS_BYTES, "big", signed=True) + value)
            for topic, ts, value in zip(
                workload.topics[start:stop],
                workload.ts[start:stop],
                workload.values[start:stop],
                strict=True,
            )
        ]

    async def write_batch(self, batch: list[tuple[str, bytes]]) -> None:
        """``publish_async`` every message, then await all PubAcks (stored and fsynced)."""
        publish = self._js.publish_async
        futures = [await publish(subject, payload) for subject, payload in batch]
        await asyncio.wait_for(asyncio.gather(*futures), ACK_TIMEOUT_S)

    async def read_all(self) -> AsyncIterator[Page]:
        """An ephemeral pull consumer without acks, fetched in pages up to the stream's end."""
        info = await self._js.stream_info(STREAM)
        total = info.state.messages
        config = ConsumerConfig(
            ack_policy=AckPolicy.NONE,
            deliver_policy=DeliverPolicy.ALL,
            inactive_threshold=60.0,
        )
        sub = await self._js.pull_subscribe(SUBJECTS, stream=STREAM, config=config)
        seen = 0
        try:
            while seen < total:
                msgs = await sub.fetch(
                    batch=min(READ_PAGE_RECORDS, total - seen),
                    timeout=FETCH_TIMEOUT_S,
                )
                page: list[Row] = [
                    (
                        m.subject.replace(".", "/"),
                        int.from_bytes(m.data[:TS_BYTES], "big", signed=True),
                        m.data[TS_BYTES:],
                    )
                    for m in msgs
                ]
                seen += len(page)
                yield page
        finally:
            await sub.unsubscribe()

    async def teardown(self) -> None:
        """Close the connection and stop the server."""
        if self._nc is not None:
            try:
                await self._nc.close()
            finally:
                self._nc = None
        if self._server is not None:
            self._server.stop()
