"""A TCP fault proxy for network tests: forwards to a target until told to cut the link.

Runs its own event loop in a thread so it serves while the test blocks. ``cut()`` closes
every open connection and refuses new ones (a partition); ``heal()`` forwards again.
``drop_replies()`` forwards requests but throws away what the target answers (a request that
is carried out and whose reply is lost: the ambiguous failure a retry must not duplicate).
``corrupt_replies(marker)`` flips a bit of ``marker`` wherever a reply chunk carries it (a
mangling middlebox: the bytes arrive, wrong).
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from typing import Any, Final

CHUNK_BYTES: Final = 1 << 16
START_TIMEOUT_S: Final = 10.0


class FaultProxy:
    """``127.0.0.1:port`` forwarding to ``target`` (set before the first connection)."""

    def __init__(self) -> None:
        self.target: tuple[str, int] | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._cut = False
        self._drop_replies = False
        self._corrupt = None
        self._corrupt: bytes | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server = self._call(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = int(self._server.sockets[0].getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"

    def _call(self, coro: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(START_TIMEOUT_S)

    def set_target(self, url: str) -> None:
        """Forward to ``http://host:port``."""
        host, port = url.rsplit("/", 1)[-1].rsplit(":", 1)
        self.target = (host, int(port))

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut or self.target is None:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, *, reply: bool) -> None:
            try:
                while not self._cut and (data := await src.read(CHUNK_BYTES)):
                    if reply and self._drop_replies:
                        continue
                    if reply and self._corrupt is not None and (at := data.find(self._corrupt)) >= 0:
                        data = data[:at] + bytes([data[at] ^ 1]) + data[at + 1 :]
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer, reply=False), pipe(up_reader, writer, reply=True))
        self._writers -= {writer, up_writer}

    async def _close_all(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    def cut(self) -> None:
        """Partition: drop every open connection, refuse new ones."""
        self._cut = True
        self._call(self._close_all())

    def heal(self) -> None:
        """Forward again (both ways)."""
        self._cut = False
        self._drop_replies = False
        self._corrupt = None

    def drop_replies(self) -> None:
        """Forward requests, throw away the replies (until :meth:`heal`)."""
        self._drop_replies = True

    def corrupt_replies(self, marker: bytes) -> None:
        """Flip a bit of ``marker`` in the replies that carry it (until :meth:`heal`)."""
        self._corrupt = marker

    def close(self) -> None:
        """Stop the proxy and its thread."""
        self.cut()
        self._server.close()
        self._call(self._server.wait_closed())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(START_TIMEOUT_S)
