"""Redis Streams: Debian's redis-server with AOF ``appendfsync always``; pipelined XADD per batch."""

from __future__ import annotations

import importlib.metadata
import shutil
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, cast

import redis
from redis.utils import HIREDIS_AVAILABLE

from bench.peers import READ_PAGE_RECORDS, PeerContext, PeerUnavailable, Row, Workload
from bench.peers._server import LOOPBACK_HOST, ServerProcess, free_port

if TYPE_CHECKING:
    from bench.peers import Page

STREAM_KEY = "bench"
START_TIMEOUT_S = 30.0
SOCKET_TIMEOUT_S = 120.0
Fields = dict[bytes, bytes]


class RedisStreamsPeer:
    """One stream key; fields t (topic), s (ts, decimal), v (value)."""

    name = "redis"
    durability = "appendonly yes, appendfsync always (fsync before reply)"

    def __init__(self, ctx: PeerContext) -> None:
        self.ctx = ctx
        self.version = "?"
        self.server_pid: int | None = None
        self._server: ServerProcess | None = None
        self._client: redis.Redis | None = None

    async def setup(self) -> None:
        """Start redis-server on a free loopback port with a temp dir and connect."""
        exe = shutil.which("redis-server")
        if exe is None:
            raise PeerUnavailable("redis-server not on PATH (run `make peers`)")
        port = free_port()
        data_dir = self.ctx.work_dir / "redis"
        data_dir.mkdir()
        argv = [
            exe,
            "--bind",
            LOOPBACK_HOST,
            "--port",
            str(port),
            "--dir",
            str(data_dir),
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "",
            "--daemonize",
            "no",
            "--protected-mode",
            "yes",
            "--loglevel",
            "warning",
        ]
        self._server = ServerProcess("redis-server", argv, self.ctx.work_dir / "redis.log")
        self._server.start()
        self.server_pid = self._server.pid
        client = redis.Redis(
            host=LOOPBACK_HOST,
            port=port,
            socket_timeout=SOCKET_TIMEOUT_S,
            socket_connect_timeout=1.0,
        )
        self._client = client
        await self._server.wait_until(client.ping, "PING", START_TIMEOUT_S)
        aof = client.config_get("appendfsync")
        if aof.get("appendfsync") != "always":
            raise RuntimeError(f"appendfsync is {aof}, expected always")
        info = client.info("server")
        parser = (
            f"hiredis {importlib.metadata.version('hiredis')}" if HIREDIS_AVAILABLE else "pure-Python parser"
        )
        self.version = f"Redis {info['redis_version']}, redis-py {redis.__version__} ({parser})"

    def encode(self, workload: Workload, start: int, stop: int) -> list[Fields]:
        """XADD field maps."""
        return [
            {b"t": topic.encode(), b"s": str(ts).encode(), b"v": value}
            for topic, ts, value in zip(
                workload.topics[start:stop],
                workload.ts[start:stop],
                workload.values[start:stop],
                strict=True,
            )
        ]

    async def write_batch(self, batch: list[Fields]) -> None:
        """One pipeline of XADDs; replies arrive after the AOF write is fsynced."""
        assert self._client is not None
        pipe = self._client.pipeline(transaction=False)
        for fields in batch:
            pipe.xadd(STREAM_KEY, fields)  # type: ignore[arg-type]
        pipe.execute()

    async def read_all(self) -> AsyncIterator[Page]:
        """XRANGE pages, each starting after the last ID seen."""
        assert self._client is not None
        low: Any = "-"
        while True:
            entries = cast(
                "list[tuple[bytes, Fields]]",
                self._client.xrange(STREAM_KEY, min=low, max="+", count=READ_PAGE_RECORDS),
            )
            if not entries:
                return
            page: list[Row] = [
                (fields[b"t"].decode(), int(fields[b"s"]), fields[b"v"]) for _, fields in entries
            ]
            yield page
            low = b"(" + entries[-1][0]

    async def teardown(self) -> None:
        """Close the client and stop the server."""
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._server is not None:
            self._server.stop()
