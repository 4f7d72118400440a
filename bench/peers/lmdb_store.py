"""LMDB (py-lmdb): one synced write transaction per batch, keys are big-endian sequence numbers."""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import lmdb

from bench.peers import READ_PAGE_RECORDS, PeerContext, Row, Workload

if TYPE_CHECKING:
    from bench.peers import Page

# Value layout: ts int64, topic length u16 (little endian), topic, value.
_HEADER = struct.Struct("<qH")
MAP_SIZE_BYTES = 16 << 30  # sparse; only what is written takes disk


class LmdbPeer:
    """py-lmdb with ``sync=True``: ``commit()`` returns after the data and meta page are flushed."""

    name = "lmdb"
    durability = "sync=True, metasync=True, 1 write txn per batch"

    def __init__(self, ctx: PeerContext) -> None:
        self.path = ctx.work_dir / "lmdb"
        version = ".".join(map(str, lmdb.version()))
        self.version = f"LMDB {version}, py-lmdb {lmdb.__version__}"
        self.server_pid: int | None = None
        self._env: Any = None
        self._next_key = 0

    async def setup(self) -> None:
        """Open a fresh environment."""
        self._env = lmdb.open(
            str(self.path),
            map_size=MAP_SIZE_BYTES,
            sync=True,
            metasync=True,
            max_dbs=0,
            readahead=True,
            writemap=False,
        )

    def encode(self, workload: Workload, start: int, stop: int) -> list[tuple[bytes, bytes]]:
        """(key, value) pairs; keys are the 8-byte big-endian record sequence."""
        pack = _HEADER.pack
        items: list[tuple[bytes, bytes]] = []
        for seq in range(start, stop):
            topic_b = workload.topics[seq].encode()
            value = pack(workload.ts[seq], len(topic_b)) + topic_b + workload.values[seq]
            items.append((seq.to_bytes(8, "big"), value))
        return items

    async def write_batch(self, batch: list[tuple[bytes, bytes]]) -> None:
        """``putmulti(append=True)`` inside one write transaction; commit syncs."""
        with self._env.begin(write=True) as txn:
            txn.cursor().putmulti(batch, dupdata=False, overwrite=True, append=True)

    async def read_all(self) -> AsyncIterator[Page]:
        """Cursor scan in key order inside one read transaction."""
        unpack = _HEADER.unpack_from
        header_bytes = _HEADER.size
        page: list[Row] = []
        with self._env.begin(buffers=False) as txn:
            for value in txn.cursor().iternext(keys=False, values=True):
                ts, topic_len = unpack(value)
                topic_end = header_bytes + topic_len
                page.append((value[header_bytes:topic_end].decode(), ts, value[topic_end:]))
                if len(page) == READ_PAGE_RECORDS:
                    yield page
                    page = []
        if page:
            yield page

    async def teardown(self) -> None:
        """Close the environment."""
        if self._env is not None:
            self._env.close()
            self._env = None
