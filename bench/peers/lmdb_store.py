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
_KEY_LEN = struct.Struct("<H")  # keyed rows: the key's length, after the topic
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
        self._env = self._open_env(max_dbs=0)

    def _open_env(self, *, max_dbs: int) -> Any:
        """The environment, synced on every commit (data and meta page)."""
        return lmdb.open(
            str(self.path),
            map_size=MAP_SIZE_BYTES,
            sync=True,
            metasync=True,
            max_dbs=max_dbs,
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


class LmdbKeyedPeer(LmdbPeer):
    """:class:`LmdbPeer` with a key on every record (``Workload.keys``) and a key index, the
    capability seglog's keyed row has: a second database (``MDB_DUPSORT``) maps each key to the
    sequence numbers of its records, written in the same synced transaction as the records.
    The value gains the key (u16 length, then the key) after the topic."""

    name = "lmdb-keyed"
    durability = "sync=True, metasync=True, 1 write txn per batch (records + key index)"

    def __init__(self, ctx: PeerContext) -> None:
        super().__init__(ctx)
        self._records: Any = None
        self._by_key: Any = None
        self._expected: tuple[bytes, list[int]] | None = None

    async def setup(self) -> None:
        """Open a fresh environment with the records and the key index databases."""
        self._env = self._open_env(max_dbs=2)
        self._records = self._env.open_db(b"records")
        self._by_key = self._env.open_db(b"by_key", dupsort=True)

    def encode(self, workload: Workload, start: int, stop: int) -> Any:
        """(records, key index entries): record pairs as :class:`LmdbPeer`'s with the key
        after the topic, and ``(key, 8-byte sequence)`` pairs."""
        pack = _HEADER.pack
        keys = workload.keys()
        records: list[tuple[bytes, bytes]] = []
        postings: list[tuple[bytes, bytes]] = []
        for seq in range(start, stop):
            topic_b = workload.topics[seq].encode()
            key = keys[seq]
            seq_b = seq.to_bytes(8, "big")
            head = pack(workload.ts[seq], len(topic_b))
            records.append(
                (seq_b, b"".join((head, topic_b, _KEY_LEN.pack(len(key)), key, workload.values[seq])))
            )
            postings.append((key, seq_b))
        if start == 0:
            self._expected = workload.probe_key()  # checked after the reads
        return records, postings

    async def write_batch(self, batch: tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes]]]) -> None:
        """Records (``append=True``) and key index entries in one write transaction; commit syncs."""
        records, postings = batch
        with self._env.begin(write=True) as txn:
            txn.cursor(db=self._records).putmulti(records, dupdata=False, overwrite=True, append=True)
            txn.cursor(db=self._by_key).putmulti(postings, dupdata=True)

    async def read_all(self) -> AsyncIterator[Page]:
        """Cursor scan of the records in key order, then one key lookup that must find exactly
        the records written with the first record's key (proof the index was written)."""
        unpack = _HEADER.unpack_from
        header_bytes = _HEADER.size
        key_len_bytes = _KEY_LEN.size
        page: list[Row] = []
        with self._env.begin(db=self._records, buffers=False) as txn:
            for value in txn.cursor().iternext(keys=False, values=True):
                ts, topic_len = unpack(value)
                topic_end = header_bytes + topic_len
                (key_len,) = _KEY_LEN.unpack_from(value, topic_end)
                page.append(
                    (value[header_bytes:topic_end].decode(), ts, value[topic_end + key_len_bytes + key_len :])
                )
                if len(page) == READ_PAGE_RECORDS:
                    yield page
                    page = []
        if page:
            yield page
        assert self._expected is not None
        key, seqs = self._expected
        with self._env.begin(db=self._by_key, buffers=False) as txn:
            cursor = txn.cursor()
            got = [int.from_bytes(v, "big") for v in cursor.iternext_dup()] if cursor.set_key(key) else []
        if got != seqs:
            raise RuntimeError(f"key {key!r}: index holds {got[:5]}..., expected {seqs[:5]}...")
