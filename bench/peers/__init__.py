"""Peer systems for the comparison benchmark, all behind the small :class:`Peer` protocol.

Each module implements one system. The runner (``bench/compare.py``) drives them identically:

1. ``setup()``: start the server / open the store (untimed).
2. ``encode(workload, start, stop)``: pre-encode one producer batch into the system's native
   input form (untimed; client-library serialisation is left to the timed write).
3. ``write_batch(batch)``: timed; returns only once the batch is durable.
4. ``read_all()``: timed per page; yields pages in log order until everything written is read.
5. ``teardown()``: close clients, stop the server by its PID, always called.

Methods are ``async`` for every peer so the runner has one code path; peers with a blocking client
simply never yield inside them.
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

if TYPE_CHECKING:
    import pyarrow as pa

READ_PAGE_RECORDS = 10_000
"""Records per read page, the same for every system."""

Row: TypeAlias = tuple[str, int, bytes]
"""One decoded record: (topic, ts in µs, value)."""

Page: TypeAlias = "list[Row] | pa.Table"
"""A read page: decoded rows, or a pyarrow Table with topic/ts/value columns (seglog-arrow)."""


class PeerUnavailable(RuntimeError):
    """The system cannot run here (binary or jars missing, core not importable)."""


@dataclass(frozen=True)
class Workload:
    """The records every system writes and reads back, generated once per value size.

    Attributes:
        topics: MQTT-style topic of each record.
        ts: Timestamp of each record in µs since the epoch (int64).
        values: Random payload of each record, ``value_bytes`` long.
        value_bytes: Payload size S in bytes.
    """

    topics: list[str]
    ts: list[int]
    values: list[bytes]
    value_bytes: int
    _rows: list[Row] = field(default_factory=list, repr=False, compare=False)
    _keys: list[bytes] = field(default_factory=list, repr=False, compare=False)

    @property
    def n(self) -> int:
        """Number of records."""
        return len(self.ts)

    @property
    def logical_bytes(self) -> int:
        """Bytes of record content (topic + 8-byte ts + value), the basis of MB/s."""
        return sum(map(len, self.topics)) + self.n * (8 + self.value_bytes)

    def keys(self) -> list[bytes]:
        """The key of each record for the keyed rows: its device, ``<site>/<device>`` of the
        topic ``sensors/<site>/<device>/temp`` (the demo's shape: a device id on every record)."""
        if len(self._keys) != len(self.topics):
            self._keys[:] = ["/".join(t.split("/", 3)[1:3]).encode() for t in self.topics]
        return self._keys

    def probe_key(self) -> tuple[bytes, list[int]]:
        """The first record's key and the sequence number of every record with it: what one
        key lookup after the keyed rows' read-back must return."""
        keys = self.keys()
        return keys[0], [i for i, k in enumerate(keys) if k == keys[0]]

    def rows(self) -> list[Row]:
        """Expected (topic, ts, value) tuples in log order, built once."""
        if not self._rows:
            self._rows.extend(zip(self.topics, self.ts, self.values, strict=True))
        return self._rows


@dataclass(frozen=True)
class PeerContext:
    """Where a peer may put things.

    Attributes:
        work_dir: Empty temp directory owned by this run (data, config, server log).
        cache_dir: The project cache holding peer binaries and jars (``make peers``).
        expected_records: How many records will be written (for sizing stores).
        value_bytes: Payload size of this run.
    """

    work_dir: Path
    cache_dir: Path
    expected_records: int
    value_bytes: int


class Peer(Protocol):
    """One system under test.

    Attributes:
        name: Row label in the result table.
        durability: The durability setting used, as shown in the table.
        version: Server / library version, known after ``setup()``.
        server_pid: PID of the server process whose CPU time is reported, None if in-process.
    """

    name: str
    durability: str
    version: str
    server_pid: int | None

    async def setup(self) -> None:
        """Start the server or open the store; raise PeerUnavailable if it cannot run here."""
        ...

    def encode(self, workload: Workload, start: int, stop: int) -> Any:
        """Pre-encode records ``[start, stop)`` into this system's batch form (untimed)."""
        ...

    async def write_batch(self, batch: Any) -> None:
        """Write one batch and return once it is durable."""
        ...

    def read_all(self) -> AsyncIterator[Page]:
        """Yield pages (``Page``) of everything written, in order."""
        ...

    async def teardown(self) -> None:
        """Close clients and stop servers; safe to call after a failed setup."""
        ...


_MODULES: dict[str, tuple[str, str]] = {
    "raw": ("raw", "RawFilePeer"),
    "seglog": ("seglog_embedded", "SeglogPeer"),
    "seglog-arrow": ("seglog_embedded", "SeglogArrowPeer"),
    "seglog-arrow-keyed": ("seglog_embedded", "SeglogArrowKeyedPeer"),
    "lmdb": ("lmdb_store", "LmdbPeer"),
    "lmdb-keyed": ("lmdb_store", "LmdbKeyedPeer"),
    "sqlite": ("sqlite_store", "SqlitePeer"),
    "redis": ("redis_streams", "RedisStreamsPeer"),
    "nats": ("nats_jetstream", "NatsJetStreamPeer"),
    "kafka": ("kafka_kraft", "KafkaPeer"),
}
SYSTEMS: tuple[str, ...] = tuple(_MODULES)
"""Every row the runner knows, in table order."""

IN_PROCESS_SYSTEMS: tuple[str, ...] = (
    "raw",
    "seglog",
    "seglog-arrow",
    "seglog-arrow-keyed",
    "lmdb",
    "lmdb-keyed",
    "sqlite",
)
"""Systems that need no external server."""


def peer_factory(system: str) -> Callable[[PeerContext], Peer]:
    """Return the peer class for ``system``, importing its module lazily.

    Args:
        system: One of :data:`SYSTEMS`.

    Raises:
        PeerUnavailable: The module's client library is not importable.
    """
    module_name, class_name = _MODULES[system]
    try:
        module = importlib.import_module(f"{__name__}.{module_name}")
    except ImportError as exc:
        raise PeerUnavailable(f"client library missing: {exc}") from exc
    factory: Callable[[PeerContext], Peer] = getattr(module, class_name)
    return factory
