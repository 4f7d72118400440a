"""Small helpers shared by tests."""

from __future__ import annotations

import fcntl
import queue
import struct
import termios
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO, Final

from aiohttp import web

import seglog

# A realistic timestamp (2023-11-14T22:13:20Z in µs): databases accept 2000..2200 by default.
T0 = 1_700_000_000_000_000


def make_records(n: int, *, start: int = 0, ts0: int = T0, keyed: bool = True) -> list[seglog.Record]:
    return [
        seglog.Record(
            topic=f"sensors/site{i % 7}/dev{i % 50}/temp",
            value=f"value-{i}".encode() * (1 + i % 5),
            ts=ts0 + i * 10,
            key=f"dev{i % 50}".encode() if keyed else None,
        )
        for i in range(start, start + n)
    ]


async def read_all(db: seglog.Database, shard: int) -> list[seglog.Record]:
    out: list[seglog.Record] = []
    offset = db.start_offset(shard)
    while True:
        batch = await db.read(shard, offset, max_records=5000)
        if not batch:
            return out
        out.extend(batch)
        offset = batch[-1].offset + 1  # type: ignore[operator]


def segment_files(data: Path, db: str, shard: int) -> list[Path]:
    return sorted((data / "dbs" / db / f"shard-{shard:04d}").glob("*.log"))


class ChildLines:
    """Lines of a child's pipe, read by a thread so the test can wait for each with a timeout."""

    def __init__(self, stream: IO[bytes], timeout_s: float = 60) -> None:
        self._q: queue.Queue[bytes] = queue.Queue()
        self.timeout_s = timeout_s
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: IO[bytes]) -> None:
        for line in stream:
            self._q.put(line)
        self._q.put(b"")

    def next(self, timeout_s: float | None = None) -> bytes:
        """The next line; ``b""`` once the child closed the pipe; ``queue.Empty`` on timeout."""
        return self._q.get(timeout=self.timeout_s if timeout_s is None else timeout_s)

    def take(self, n: int) -> list[bytes]:
        return [self.next() for _ in range(n)]


def wait_pipe_drained(fd: int, timeout_s: float = 60) -> None:
    """Wait until the reader of the pipe whose write end is ``fd`` has read everything in it.

    There is no event for "a pipe became empty", so this checks ``FIONREAD`` (bytes still in
    the pipe) until it is 0 or ``timeout_s`` passes; it waits for the child's read, not for a
    guessed amount of time.
    """
    deadline = time.monotonic() + timeout_s
    while struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]:
        if time.monotonic() > deadline:
            raise TimeoutError("the child did not read its input")
        time.sleep(0.005)


# What a wrong URL (an ``--etcd`` list's, a client's) may answer: another web service's page,
# some other JSON API, or a member that cannot serve (etcd's 503 without a leader).
FOREIGN_REPLIES: Final = {
    "html": (200, "text/html", "<html><body>a web page of another service</body></html>"),
    "json": (200, "application/json", '{"status": "ok", "service": "something else"}'),
    "unavailable": (503, "application/json", '{"error": "etcdserver: no leader", "code": 14}'),
}


@asynccontextmanager
async def foreign_server(kind: str) -> AsyncIterator[str]:
    """A loopback HTTP server that answers every request with ``FOREIGN_REPLIES[kind]``; its URL."""
    status, content_type, text = FOREIGN_REPLIES[kind]

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=status, text=text, content_type=content_type)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    async with serve_app(app) as url:
        yield url


@asynccontextmanager
async def serve_app(app: web.Application) -> AsyncIterator[str]:
    """Serve ``app`` on a free loopback port for the block; its ``http://127.0.0.1:PORT``."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
