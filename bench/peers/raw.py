"""Baseline: length-prefixed records appended to one file, ``fdatasync`` per batch."""

from __future__ import annotations

import os
import platform
import struct
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from bench.peers import READ_PAGE_RECORDS, PeerContext, Row, Workload

if TYPE_CHECKING:
    from bench.peers import Page

# Record layout: ts int64, topic length u16, value length u32 (little endian), topic, value.
_HEADER = struct.Struct("<qHI")
READ_CHUNK_BYTES = 4 << 20


class RawFilePeer:
    """``os.write`` + ``os.fdatasync`` of pre-encoded batches; the floor for any durable log."""

    name = "raw"
    durability = "os.fdatasync per batch"

    def __init__(self, ctx: PeerContext) -> None:
        self.path = ctx.work_dir / "raw.log"
        self.version = f"Linux {platform.release()}"
        self.server_pid: int | None = None
        self._fd: int | None = None

    async def setup(self) -> None:
        """Create the log file and make its directory entry durable."""
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def encode(self, workload: Workload, start: int, stop: int) -> bytes:
        """One batch as a single contiguous buffer."""
        pack = _HEADER.pack
        parts: list[bytes] = []
        for topic, ts, value in zip(
            workload.topics[start:stop],
            workload.ts[start:stop],
            workload.values[start:stop],
            strict=True,
        ):
            topic_b = topic.encode()
            parts += (pack(ts, len(topic_b), len(value)), topic_b, value)
        return b"".join(parts)

    async def write_batch(self, batch: bytes) -> None:
        """Append the buffer and fdatasync it."""
        assert self._fd is not None
        view = memoryview(batch)
        while view:
            view = view[os.write(self._fd, view) :]
        os.fdatasync(self._fd)

    async def read_all(self) -> AsyncIterator[Page]:
        """Read the file in chunks and decode every record."""
        unpack = _HEADER.unpack_from
        header_bytes = _HEADER.size
        page: list[Row] = []
        with self.path.open("rb", buffering=0) as f:
            buf = b""
            while chunk := f.read(READ_CHUNK_BYTES):
                buf = buf + chunk if buf else chunk
                off, size = 0, len(buf)
                while off + header_bytes <= size:
                    ts, topic_len, value_len = unpack(buf, off)
                    topic_end = off + header_bytes + topic_len
                    end = topic_end + value_len
                    if end > size:
                        break
                    page.append((buf[off + header_bytes : topic_end].decode(), ts, buf[topic_end:end]))
                    off = end
                    if len(page) == READ_PAGE_RECORDS:
                        yield page
                        page = []
                buf = buf[off:]
            if buf:
                raise ValueError(f"raw log ends with {len(buf)} bytes of a torn record")
        if page:
            yield page

    async def teardown(self) -> None:
        """Close the file."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
