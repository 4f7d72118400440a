"""The network producer: batch records by shard and append them on a seglog node over HTTP.

``async with Producer(url, db, buffer_dir="buf") as p: fut = await p.send("a/b", b"v")``.
Names follow aiokafka's ``AIOKafkaProducer`` with shards for partitions.

How a record travels:

1. :meth:`Producer.send` validates it at once (the embedded API's rules,
   :func:`seglog.record.validate_record`, against the database's limits learned at start;
   an invalid record raises ``InvalidRecord`` and nothing is enqueued), stamps ``ts`` with
   :func:`seglog.record.now_us` when absent (so its ``RecordMeta.ts`` is known), and adds it
   to the open batch: a few Python lists, no per-record objects beyond its future.
2. The open batch is sealed after ``linger_ms``, when it reaches ``max_batch_bytes``, on
   :meth:`~Producer.flush`, or at once when the disk buffer syncs every append (below).
   Sealing builds Arrow columns for the whole batch, routes every row with the server's
   rule (:func:`seglog._routing.route_rows`: the key's hash, else the topic's, modulo the
   shard count from ``GET /v1/dbs/{db}``), and splits it into one item per shard: an Arrow
   IPC record-batch message, appended to the buffer.
3. A sender takes the oldest items of every shard with no request in flight (up to
   ``max_batch_bytes`` in all) and POSTs them as one Arrow IPC stream to
   ``/v1/dbs/{db}/records?shards=a,b,...&acks=A`` (item ``i`` to shard ``shards[i]``: one
   request per round whatever the shard count, so the node pays one request, one append
   and one sync for all of them). A producer routing to leaders (``bootstrap=``) puts in one
   request the shards one node leads (as last learned; a ``NotLeader`` puts the items back
   to be regrouped); a replicated database reached through one URL sends one shard per
   request (``?shard=N``). At most ``max_in_flight`` requests are in
   flight at once. The reply's per-shard ``base_offset`` gives every record its offset
   (``base_offset + i`` in order).
4. Retriable failures (:func:`seglog.cluster.protocol.is_retriable`: the node unreachable,
   the connection lost, 503 ``Overloaded``/shutting down, 429) are retried with exponential
   backoff (``retry_backoff_ms`` doubling up to ``retry_backoff_max_ms``, at least the
   server's ``Retry-After``), ``retries`` times (``None``: until :meth:`~Producer.stop`).
   Any other error fails the futures of that request's records with the class the server
   named (e.g. ``InvalidRecord``, ``PermissionDenied``); a batch given up on is removed from
   the buffer.

``acks``: ``1``, ``"all"`` (default) or ``"quorum"``, sent as ``acks=``. For a database
that is not replicated (every database of a single ``seglog serve`` node) all three wait
for the same thing: the node's local write, durable under the node's own fsync policy. On a
replicated database they mean the leader's write, a majority of the replicas, and every
in-sync replica (see the cluster section of the README); this producer sends every shard to
the one node ``url`` names, so it suits a single node or a cluster whose shards that node
leads (``NotLeader`` and ``NotEnoughReplicas`` are retried like any ``ServerUnavailable``).

**The buffer** holds every batch from sealing until the node acknowledged it (or it was
given up on): in memory (``buffer_dir=None``) or on disk (``buffer_dir=``, see
:mod:`seglog.client._buffer`: replayq-style segments with CRC-framed items, an atomically
replaced commit file of the acknowledged position). On :meth:`~Producer.start` every item
the disk buffer holds that was never acknowledged is resent, before any new data of its
shard. The database description is cached in the directory (``producer.json``) so a
producer can start, and buffer, while the node is down; a directory belongs to one
database. A buffer item is ``b"SP" | version u8 (1) | 0 u8 | shard u32 | record count u32``
(little-endian) and then one Arrow IPC record-batch message with the produce columns
(``ts, topic, key, value, headers``): a request body is the schema message, the items'
messages, and the end-of-stream marker, so nothing is re-encoded on the way out.

``buffer_fsync`` (disk buffer only) decides what a returned ``send()`` survives:

* ``"always"``: ``send()`` returns only after its record's batch is written to the buffer
  and fdatasync'ed (group commit: the records of concurrent sends share one sync). A record
  whose ``send()`` returned survives a SIGKILL of the producer, an OS crash and power loss.
  A strictly sequential ``await send()`` loop pays one sync per record: send concurrently,
  or use :meth:`~Producer.send_arrow`, for throughput.
* ``"interval"``: ``send()`` returns once the record is in the open batch in memory; the
  batch is written when sealed (``linger_ms``) and synced at most ``fsync_interval`` (1 s)
  later. A producer SIGKILL loses the records of the open batch (at most ``linger_ms`` of
  sends); an OS crash or power loss also loses what was written since the last sync.
* ``"never"``: as ``"interval"`` without syncs: an OS crash loses what the OS had not yet
  written back, and may leave a damaged older segment (``CorruptBuffer`` on open).

**Acknowledgement rule: at least once.** A future that resolves to a ``RecordMeta`` means
the node stored the record at that offset. With a disk buffer, a record is *accepted* when
its ``send()`` returned under ``"always"`` (under ``"interval"``/``"never"``: once its batch
was sealed, and not lost by an OS crash per the policy above); an accepted record is stored
at least once, by this producer or by the next one started on the same ``buffer_dir``,
unless its batch was given up on (its future then says why: a non-retriable error, retries
run out, or ``"drop_oldest"``). Without a disk buffer only this process can send it, so a
``stop()`` that times out fails what is left with ``ClosedResourceError``.

A record can be stored twice when its batch is sent again after an ambiguous failure:
(1) a request whose connection was lost or that timed out after the node may have written
it is retried; (2) a producer killed after the node's write and before the commit file
recorded the acknowledgement resends the batch on restart (the commit file is rewritten at
most every 50 ms, and an acknowledgement above an older batch still unacknowledged is not
persisted). Resends are of whole batches, so only batches in flight at the failure (or
acknowledged but not yet committed, for a producer restart) can be duplicated; a failed
future whose error was ambiguous (``ServerUnavailable`` after retries ran out) may also
have been stored. The idempotent producer (issue 13: a producer id and per-shard sequence
numbers the leader checks) removes these duplicates. Order within a shard is send order: a shard has at
most one request in flight (``max_in_flight`` spreads over shards), and a retried batch is
retried before the next one of its shard starts.

**Overflow** (``buffer_max_bytes``, counting records accepted and not yet acknowledged):
``"block"`` waits for acknowledgements to free room, up to ``request_timeout_ms``, then
raises :class:`~seglog.errors.BufferFull`; ``"error"`` raises ``BufferFull`` at once
(nothing enqueued); ``"drop_oldest"`` drops the oldest batches not yet sent (their futures
fail with ``BufferFull``; counted in ``dropped_batches``/``dropped_records``) and, if what
is in flight still leaves no room, waits as ``"block"`` does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import itertools
import json
import logging
import os
import struct
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from ssl import SSLContext
from types import TracebackType
from typing import Any, Final, Literal, TypeVar

import numpy as np
import pyarrow as pa

from seglog import _fs
from seglog._routing import route_rows
from seglog.client._buffer import (
    DEFAULT_FSYNC_INTERVAL_S,
    FSYNC_POLICIES,
    Buffer,
    DiskBuffer,
    FsyncPolicy,
    MemoryBuffer,
)
from seglog.client._http import NodeSession, Reply
from seglog.client._metadata import LeaderCache
from seglog.cluster import protocol
from seglog.errors import (
    BufferFull,
    ClosedResourceError,
    ConfigMismatch,
    CorruptBuffer,
    DatabaseNotFound,
    InvalidArgument,
    NotLeader,
    RemoteError,
    SeglogError,
    ServerUnavailable,
    StorageError,
)
from seglog.record import (
    DEFAULT_MAX_RECORD_BYTES,
    FRAME_SCHEMA,
    HEADERS_TYPE,
    MAX_SEQUENCE,
    RecordMeta,
    now_us,
    null_headers,
    table_to_batch,
    validate_record,
)

__all__ = ["Producer"]

log = logging.getLogger("seglog.client")

T = TypeVar("T")
Acks = Literal[1, "1", "all", "quorum"]
Overflow = Literal["block", "error", "drop_oldest"]

# The columns a produce request carries (the frame schema without ``stream``).
PRODUCE_SCHEMA: Final = pa.schema([f for f in FRAME_SCHEMA if f.name != "stream"])
_SCHEMA_MESSAGE: Final = PRODUCE_SCHEMA.serialize().to_pybytes()
_EOS: Final = b"\xff\xff\xff\xff\x00\x00\x00\x00"
# Given explicitly: without options, every stream writer reads the environment for a legacy flag.
_IPC_OPTIONS: Final = pa.ipc.IpcWriteOptions()
# A buffer item: magic, version, shard, record count, then one Arrow record-batch message.
_ITEM = struct.Struct("<2sBxII")
_ITEM_MAGIC: Final = b"SP"
# A request names each item's shard (and sequence) in its query string, which the node reads
# up to 8190 bytes: a backlog of tiny items (a replayed buffer) goes in several requests.
_MAX_ITEMS_PER_REQUEST: Final = 256
_ITEM_VERSION: Final = 1
# Per-record overhead counted against the buffer besides the payload bytes (ts, offsets).
_RECORD_OVERHEAD: Final = 24
_COMMIT_INTERVAL_S: Final = 0.05
_META_NAME: Final = "producer.json"
MiB: Final = 1 << 20


class _Item:
    """One shard's sealed batch in the buffer: its header and its Arrow IPC message, kept
    apart (the buffer stores them without joining them). An item sealed by this producer
    also keeps the whole one-batch IPC stream its message was written in (``body``): a
    request of that one item sends it as is."""

    __slots__ = (
        "arrow",
        "body",
        "count",
        "futs",
        "header",
        "id",
        "message",
        "pid",
        "rows",
        "seq",
        "shard",
        "size",
        "ts",
    )

    def __init__(
        self,
        shard: int,
        count: int,
        message: memoryview,
        futs: list[asyncio.Future[RecordMeta]] | None = None,
        ts: list[int] | None = None,
        arrow: _ArrowResult | None = None,
        rows: np.ndarray[Any, Any] | slice | None = None,
        body: memoryview | None = None,
    ) -> None:
        self.id = -1
        self.shard = shard
        self.count = count
        self.header = _ITEM.pack(_ITEM_MAGIC, _ITEM_VERSION, shard, count)
        self.message = message
        self.body = body
        self.size = _ITEM.size + message.nbytes  # the buffer item's bytes
        self.futs = futs
        self.ts = ts
        self.arrow = arrow
        self.rows = rows
        # An idempotent producer's id and the sequence of the first record, fixed when the
        # item is first sent (every retry carries the same ones); -1 until then.
        self.pid = -1
        self.seq = -1

    @property
    def parts(self) -> tuple[bytes, memoryview]:
        """The buffer item, as the parts it is the concatenation of."""
        return (self.header, self.message)

    @staticmethod
    def parse(payload: bytes, where: str) -> _Item:
        if len(payload) < _ITEM.size:
            raise CorruptBuffer(f"{where}: a buffer item is shorter than its header", path=where)
        magic, version, shard, count = _ITEM.unpack_from(payload)
        if magic != _ITEM_MAGIC or version != _ITEM_VERSION:
            raise CorruptBuffer(
                f"{where}: not a producer item (magic {magic!r}, version {version})", path=where
            )
        return _Item(shard, count, memoryview(payload)[_ITEM.size :])


class _Group:
    """The open batch of :meth:`Producer.send`: columns as Python lists."""

    __slots__ = ("bytes", "durable", "futs", "headers", "keys", "topics", "ts", "values")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.topics: list[str] = []
        self.values: list[bytes] = []
        self.keys: list[bytes | None] = []
        self.ts: list[int] = []
        self.headers: list[dict[str, bytes] | None] | None = None  # None: no record has headers
        self.futs: list[asyncio.Future[RecordMeta]] = []
        self.bytes = 0
        self.durable: asyncio.Future[None] = loop.create_future()


class _ArrowResult:
    """One :meth:`Producer.send_arrow` call: its result columns fill in as parts are acknowledged."""

    __slots__ = ("future", "offsets", "pending", "shards")

    def __init__(self, n: int, slices: int, loop: asyncio.AbstractEventLoop) -> None:
        self.shards = np.empty(n, np.int32)
        self.offsets = np.empty(n, np.int64)
        # One per slice not yet built into items, plus one per item not yet acknowledged.
        self.pending = slices
        self.future: asyncio.Future[pa.Table] = loop.create_future()
        if not n:
            self.future.set_result(self.table())

    def table(self) -> pa.Table:
        return pa.table({"shard": self.shards, "offset": self.offsets})

    def part_done(
        self, rows: np.ndarray[Any, Any] | slice, shard: int, offsets: np.ndarray[Any, Any]
    ) -> None:
        self.shards[rows] = shard
        self.offsets[rows] = offsets
        self.pending -= 1
        if not self.pending and not self.future.done():
            self.future.set_result(self.table())

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)
            self.future.exception()  # a caller that dropped the future must not get noise


class _ArrowSend:
    """A slice of a :meth:`Producer.send_arrow` table on its way into the buffer."""

    __slots__ = ("batch", "bytes", "durable", "result", "row_base")

    def __init__(
        self, batch: pa.RecordBatch, row_base: int, result: _ArrowResult, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.batch = batch
        self.row_base = row_base
        self.result = result
        self.bytes = batch.nbytes + _RECORD_OVERHEAD * batch.num_rows
        self.durable: asyncio.Future[None] = loop.create_future()

    def fail(self, exc: BaseException) -> None:
        self.result.fail(exc)


class Producer:
    """Append records to a database on a node; see the module docstring for the guarantees.

    Args:
        url: The node, ``http[s]://host:port``.
        db: The database (it must exist).
        token: Bearer token (needs ``write`` on ``db``).
        ssl: TLS context for ``https``.
        acks: ``1``, ``"all"`` or ``"quorum"`` (on a database that is not replicated all
            mean the node's local write, durable under its fsync policy).
        linger_ms: How long a batch stays open for more records.
        max_batch_bytes: Seal a batch (and cap a request) at about this many bytes (at
            most a quarter of ``buffer_max_bytes``).
        max_in_flight: Produce requests in flight at once.
        retries: Retries of a retriable failure per request (``None``: until stopped).
        retry_backoff_ms: First retry delay; doubles per retry ...
        retry_backoff_max_ms: ... up to this.
        request_timeout_ms: Timeout of one request, and the longest ``"block"`` wait for room.
        buffer_dir: Keep unacknowledged batches in this directory (resent on the next start).
        buffer_max_bytes: Most bytes of records accepted and not yet acknowledged.
        overflow: ``"block"``, ``"error"`` or ``"drop_oldest"`` when the buffer is full.
        buffer_fsync: ``"always"``, ``"interval"`` or ``"never"`` (disk buffer only).
        bootstrap: More nodes of a cluster: each shard's batches then go to its leader,
            learned from any node (``GET /v1/cluster``) and refreshed after ``NotLeader`` or
            an unreachable node; ``url`` is one of the bootstrap nodes.

    Metrics (attributes): ``dropped_records``, ``dropped_batches`` (``"drop_oldest"``),
    ``failed_batches`` (given up on), ``retried_requests``, ``sent_requests`` (attempts,
    retries included), ``buffered_bytes`` (property).
    """

    def __init__(
        self,
        url: str,
        db: str,
        *,
        token: str | None = None,
        ssl: SSLContext | None = None,
        acks: Acks = "all",
        linger_ms: float = 5,
        max_batch_bytes: int = MiB,
        max_in_flight: int = 4,
        retries: int | None = 5,
        retry_backoff_ms: float = 100,
        retry_backoff_max_ms: float = 5_000,
        request_timeout_ms: float = 30_000,
        buffer_dir: str | os.PathLike[str] | None = None,
        buffer_max_bytes: int = 64 * MiB,
        overflow: Overflow = "block",
        buffer_fsync: FsyncPolicy = "always",
        bootstrap: Sequence[str] | None = None,
        idempotent: bool = True,
    ) -> None:
        if not isinstance(db, str) or not db:
            raise InvalidArgument(f"db must be a database name, not {db!r}")
        if acks not in (1, "1", "all", "quorum"):
            raise InvalidArgument(f"acks must be 1, 'all' or 'quorum', not {acks!r}")
        if overflow not in ("block", "error", "drop_oldest"):
            raise InvalidArgument(f"overflow must be 'block', 'error' or 'drop_oldest', not {overflow!r}")
        if buffer_fsync not in FSYNC_POLICIES:
            raise InvalidArgument(f"buffer_fsync must be one of {FSYNC_POLICIES}, not {buffer_fsync!r}")
        for name, value in (
            ("max_batch_bytes", max_batch_bytes),
            ("max_in_flight", max_in_flight),
            ("buffer_max_bytes", buffer_max_bytes),
        ):
            if type(value) is not int or value < 1:
                raise InvalidArgument(f"{name} must be an int >= 1, not {value!r}")
        if retries is not None and (type(retries) is not int or retries < 0):
            raise InvalidArgument(f"retries must be an int >= 0 or None, not {retries!r}")
        if not isinstance(idempotent, bool):
            raise InvalidArgument(f"idempotent must be a bool, not {idempotent!r}")
        for name, ms in (
            ("linger_ms", linger_ms),
            ("retry_backoff_ms", retry_backoff_ms),
            ("retry_backoff_max_ms", retry_backoff_max_ms),
            ("request_timeout_ms", request_timeout_ms),
        ):
            if not isinstance(ms, int | float) or ms < 0:
                raise InvalidArgument(f"{name} must be a number >= 0, not {ms!r}")
        self.url = url
        self.db = db
        self._acks = str(acks)
        self._linger_s = linger_ms / 1000
        # A batch never takes more than a quarter of the buffer, so that "drop_oldest" has
        # sealed batches to drop and the open batch alone never fills the buffer.
        self._max_batch_bytes = min(max_batch_bytes, max(1, buffer_max_bytes // 4))
        self._retries = retries
        self._backoff_s = retry_backoff_ms / 1000
        self._backoff_max_s = max(retry_backoff_max_ms, retry_backoff_ms) / 1000
        self._timeout_s = request_timeout_ms / 1000
        self._buffer_dir = None if buffer_dir is None else Path(buffer_dir)
        self._max_bytes = buffer_max_bytes
        self._overflow: Overflow = overflow
        self._fsync: FsyncPolicy = buffer_fsync
        # Seal at every send and let send() return only once durable (group commit).
        self._eager = self._buffer_dir is not None and buffer_fsync == "always"
        self._session = NodeSession(
            url, token=token, ssl_context=ssl, timeout_s=self._timeout_s, pool_connections=max_in_flight + 2
        )
        self._path = f"{protocol.API_PREFIX}/dbs/{db}/records"
        # A cluster: each shard's batches go to its leader, found through any node.
        self._leaders = (
            None
            if bootstrap is None
            else LeaderCache([url, *bootstrap], token=token, ssl_context=ssl, timeout_s=self._timeout_s)
        )
        # The idempotent producer: an id from the node (per producer session, and again after
        # a batch was given up on), and per shard the sequence of the next record sent.
        self.idempotent = idempotent
        self._pid = -1
        self._pid_lock = asyncio.Lock()
        self._next_seq: dict[int, int] = {}
        # Known at start.
        self.shards = 0
        self._shard_per_request = False
        self._max_record_bytes = DEFAULT_MAX_RECORD_BYTES
        self._min_ts_us: int | None = None
        self._max_ts_us: int | None = None
        self._buffer: Buffer | None = None
        self._io: concurrent.futures.ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # State.
        self._group: _Group | None = None
        self._linger_handle: asyncio.TimerHandle | None = None
        self._seal_queue: deque[_Group | _ArrowSend] = deque()
        self._wake_writer = asyncio.Event()
        self._unsent: dict[int, deque[_Item]] = {}
        self._ready_shards: deque[int] = deque()
        # Shards with a request in flight (one at a time per shard keeps send order).
        self._busy_shards: set[int] = set()
        self._unsent_bytes = 0
        self._wake_sender = asyncio.Event()
        self._batch_full = asyncio.Event()
        self._slots = asyncio.Semaphore(max_in_flight)
        self._unfinished: dict[int, _Item] = {}  # by id, in id order
        self._last_id = -1
        self._progress: list[asyncio.Future[None]] = []
        self._space: list[asyncio.Future[None]] = []
        self._buffered = 0
        self._acks_to_commit: list[int] = []
        self._commit_wanted = asyncio.Event()
        self._sync_timer: asyncio.TimerHandle | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._requests: set[asyncio.Task[None]] = set()
        self._flushing = 0
        self._started = False
        self._closed = False
        # Metrics.
        self.dropped_records = 0
        self.dropped_batches = 0
        self.failed_batches = 0
        self.retried_requests = 0
        self.sent_requests = 0

    # --- lifecycle -----------------------------------------------------------------------

    async def __aenter__(self) -> Producer:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    @property
    def buffered_bytes(self) -> int:
        """Bytes of records accepted and not yet acknowledged (or given up on)."""
        return self._buffered

    async def start(self) -> None:
        """Learn the database, open the buffer, and resend what it holds unacknowledged.

        Raises:
            DatabaseNotFound: The database does not exist.
            ServerUnavailable: The node cannot be reached and ``buffer_dir`` has no cached
                description of the database.
            CorruptBuffer: The disk buffer is damaged (see :mod:`seglog.client._buffer`).
            BusyResourceError: Another producer has ``buffer_dir`` open.
        """
        if self._started:
            return
        if self._closed:
            raise ClosedResourceError("the producer was stopped")
        self._started = True
        self._loop = asyncio.get_running_loop()
        try:
            await self._open()
        except BaseException:
            await self._shutdown()
            raise

    async def _open(self) -> None:
        assert self._loop is not None
        desc = await self._describe()
        self.shards = int(desc["shards"])
        # Leaders differ per shard, and a replicated database takes one shard per request.
        self._shard_per_request = self._leaders is not None or bool(desc.get("replicated", False))
        config = desc.get("config", {})
        self._max_record_bytes = int(config.get("max_record_bytes", DEFAULT_MAX_RECORD_BYTES))
        self._min_ts_us = config.get("min_ts_us")
        self._max_ts_us = config.get("max_ts_us")
        self._unsent = {s: deque() for s in range(self.shards)}
        if self.idempotent:
            with contextlib.suppress(ServerUnavailable):  # a node down at start: at the first send
                await self._producer_id()
        self._group = _Group(self._loop)
        if self._buffer_dir is None:
            self._buffer = MemoryBuffer(self._max_bytes)
        else:
            self._io = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="seglog-producer-buffer")
            directory = self._buffer_dir
            self._buffer = await self._run_io(
                lambda: DiskBuffer(directory, max_bytes=self._max_bytes, fsync=self._fsync)
            )
            pending = await self._run_io(self._buffer.pending)
            replayed = 0
            for item_id, stored in pending:
                payload = stored if isinstance(stored, bytes) else b"".join(stored)
                item = _Item.parse(payload, str(directory))
                item.id = item_id
                if not 0 <= item.shard < self.shards:
                    log.warning(
                        "producer buffer item %d names shard %d of %d: dropped",
                        item_id,
                        item.shard,
                        self.shards,
                    )
                    self._buffer.ack(item_id)
                    continue
                self._unfinished[item_id] = item
                self._last_id = item_id
                self._enqueue(item)
                self._buffered += len(payload)
                replayed += item.count
            if pending:
                log.info("producer: resending %d records from %s", replayed, self._buffer_dir)
        self._tasks = [
            asyncio.create_task(self._writer(), name="seglog-producer-writer"),
            asyncio.create_task(self._sender(), name="seglog-producer-sender"),
            asyncio.create_task(self._committer(), name="seglog-producer-commit"),
        ]
        for task in self._tasks:
            task.add_done_callback(_report_crash)

    async def _describe_from_any(self) -> Reply:
        """The description from ``url``, or (a cluster) from any node that holds the database."""
        path = f"{protocol.API_PREFIX}/dbs/{self.db}"
        try:
            return await self._session.request("GET", path)
        except (DatabaseNotFound, ServerUnavailable):
            if self._leaders is None:
                raise
        view = await self._leaders.refresh(force=True)
        last: SeglogError | None = None
        for url in view.nodes.values():
            try:
                return await self._leaders.session(url).request("GET", path)
            except (DatabaseNotFound, ServerUnavailable) as exc:
                last = exc
        raise last or DatabaseNotFound(f"no node holds database {self.db!r}")

    async def _describe(self) -> dict[str, Any]:
        """``GET /v1/dbs/{db}``; cached in (and, when the node is down, read from) buffer_dir."""
        meta_path = None if self._buffer_dir is None else self._buffer_dir / _META_NAME
        cached: dict[str, Any] | None = None
        if meta_path is not None and meta_path.exists():
            cached = json.loads(meta_path.read_text())
            if cached.get("name") != self.db:
                raise ConfigMismatch(
                    f"buffer_dir {self._buffer_dir} holds batches of database {cached.get('name')!r}, not {self.db!r}"
                )
        try:
            desc: dict[str, Any] = (await self._describe_from_any()).json()
        except SeglogError as exc:
            if cached is None or not protocol.is_retriable(exc):
                raise
            log.warning("producer: node unreachable (%s); using the description cached in %s", exc, meta_path)
            return cached
        if meta_path is not None:
            keep = {
                "name": desc["name"],
                "shards": desc["shards"],
                "config": desc.get("config", {}),
                "replicated": desc.get("replicated", False),
            }
            if cached is not None and cached.get("shards") != keep["shards"]:
                raise ConfigMismatch(
                    f"buffer_dir {self._buffer_dir} was written for {cached.get('shards')} shards,"
                    f" the database has {keep['shards']}"
                )
            if cached != keep:
                await asyncio.to_thread(_write_meta, meta_path, keep)
        return desc

    async def stop(self, *, timeout_s: float | None = None) -> None:
        """Flush (up to ``timeout_s``, default the request timeout), then close; idempotent.

        Records not acknowledged by then fail with ``ClosedResourceError``; with a
        ``buffer_dir`` they stay in it and are resent by the next producer on it.
        """
        if self._closed:
            return
        if self._started and self._loop is not None:
            try:
                await asyncio.wait_for(self.flush(), self._timeout_s if timeout_s is None else timeout_s)
            except TimeoutError:
                log.warning("producer: stopping with %d batches unacknowledged", len(self._unfinished))
            except SeglogError as exc:
                log.warning("producer: flush at stop failed: %s", exc)
        await self._shutdown()

    close = stop

    async def _shutdown(self) -> None:
        self._closed = True
        if self._linger_handle is not None:
            self._linger_handle.cancel()
        if self._sync_timer is not None:
            self._sync_timer.cancel()
        tasks = [*self._tasks, *self._requests]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        where = (
            ""
            if self._buffer_dir is None
            else f"; it stays in {self._buffer_dir} and is resent on the next start"
        )
        closed = ClosedResourceError(f"the producer stopped before the record was acknowledged{where}")
        leftovers: list[_Group | _ArrowSend] = list(self._seal_queue)
        if self._group is not None:
            leftovers.append(self._group)
        for work in leftovers:
            if isinstance(work, _Group):
                _fail_all(work.futs, closed)
                if not work.durable.done():
                    work.durable.set_exception(closed)
                    work.durable.exception()
            else:
                work.fail(closed)
                if not work.durable.done():
                    work.durable.set_exception(closed)
                    work.durable.exception()
        self._seal_queue.clear()
        self._group = None
        for item in self._unfinished.values():
            self._fail_item(item, closed)
        self._unfinished.clear()
        _wake(self._progress)
        for waiter in self._space:
            if not waiter.done():
                waiter.set_exception(closed)
                waiter.exception()
        self._space.clear()
        if self._buffer is not None:
            buffer, acks = self._buffer, self._acks_to_commit
            self._acks_to_commit = []

            def close() -> None:
                for item_id in acks:
                    buffer.ack(item_id)
                buffer.close()

            try:
                await self._run_io(close)
            except OSError as exc:
                log.warning("producer: closing the buffer failed: %s", exc)
            self._buffer = None
        if self._io is not None:
            self._io.shutdown(wait=True)
            self._io = None
        await self._session.close()
        if self._leaders is not None:
            await self._leaders.close()

    def _check_running(self) -> None:
        if self._closed:
            raise ClosedResourceError("the producer was stopped")
        if not self._started or self._group is None:
            raise ClosedResourceError("the producer is not started: await start() or use async with")

    # --- sending -------------------------------------------------------------------------

    async def send(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        ts: int | None = None,
        headers: Mapping[str, bytes] | None = None,
    ) -> asyncio.Future[RecordMeta]:
        """Enqueue one record; return a future of its :class:`~seglog.record.RecordMeta`.

        Returns once the record is accepted: in the open batch (memory buffer, or
        ``buffer_fsync`` ``"interval"``/``"never"``), or written and fsynced to the disk
        buffer (``"always"``). The future fails with the server's error class if the batch
        is rejected, ``BufferFull`` if ``"drop_oldest"`` dropped it, the last error when
        retries ran out, ``ClosedResourceError`` if the producer stopped first.

        Raises:
            InvalidRecord: Invalid by the embedded API's rules; nothing was enqueued.
            BufferFull: No room (see ``overflow``); nothing was enqueued.
            ClosedResourceError: Not started, or stopped.
            StorageError: Writing the disk buffer failed (``"always"``); the record is not accepted.
        """
        self._check_running()
        hdrs = dict(headers) if isinstance(headers, Mapping) and not isinstance(headers, dict) else headers
        stamp, size = validate_record(
            topic,
            value,
            key,
            ts,
            hdrs,
            max_record_bytes=self._max_record_bytes,
            min_ts_us=self._min_ts_us,
            max_ts_us=self._max_ts_us,
        )
        size += _RECORD_OVERHEAD
        if self._buffered + size > self._max_bytes:
            await self._make_room(size)
            self._check_running()
        self._buffered += size
        group = self._group
        assert group is not None and self._loop is not None
        fut: asyncio.Future[RecordMeta] = self._loop.create_future()
        group.topics.append(topic)
        group.values.append(value)
        group.keys.append(key)
        group.ts.append(now_us() if stamp is None else stamp)
        if hdrs is not None or group.headers is not None:
            if group.headers is None:
                group.headers = [None] * (len(group.topics) - 1)
            group.headers.append(hdrs or None)
        group.futs.append(fut)
        group.bytes += size
        if group.bytes >= self._max_batch_bytes:
            self._seal()
        elif self._eager:
            self._wake_writer.set()  # the writer seals what gathered by the time it runs
        elif len(group.futs) == 1:
            self._linger_handle = self._loop.call_later(self._linger_s, self._linger_expired, group)
        if self._eager:
            await group.durable
        return fut

    async def send_and_wait(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        ts: int | None = None,
        headers: Mapping[str, bytes] | None = None,
    ) -> RecordMeta:
        """:meth:`send` and wait for the acknowledgement."""
        fut = await self.send(topic, value, key=key, ts=ts, headers=headers)
        return await fut

    async def send_arrow(self, table: pa.Table | pa.RecordBatch) -> asyncio.Future[pa.Table]:
        """Enqueue a table of records (columns as ``Database.append_arrow`` takes them).

        The whole table is validated first (``InvalidRecord``: nothing enqueued); rows
        without ``ts`` are stamped now. It is split by shard (and into batches of about
        ``max_batch_bytes``) and sent like :meth:`send`'s batches; returns as :meth:`send`
        does. A table larger than half of ``buffer_max_bytes`` is taken in slices of a
        quarter of it, each waiting for room by the overflow policy (``"error"`` takes the
        table whole or raises ``BufferFull``); if room for a later slice never comes, the
        future fails with ``BufferFull`` and the earlier slices are still sent.

        Returns:
            A future of what ``Database.append_arrow`` returns: a table with ``shard``
            (int32) and ``offset`` (int64), one row per input row, in input order. If any
            part fails, the future fails with that error; other parts may have been stored.
        """
        self._check_running()
        assert self._loop is not None
        if not isinstance(table, pa.Table | pa.RecordBatch):
            raise InvalidArgument("send_arrow takes a pyarrow Table or RecordBatch")
        batch = table_to_batch(
            table,
            max_record_bytes=self._max_record_bytes,
            min_ts_us=self._min_ts_us,
            max_ts_us=self._max_ts_us,
        ).select(PRODUCE_SCHEMA.names)
        n = batch.num_rows
        size = batch.nbytes + _RECORD_OVERHEAD * n
        if size > self._max_bytes // 2 and self._overflow != "error":
            # Larger than half the buffer: enqueue it in slices, each waiting for room.
            per_slice = max(1, n * (self._max_bytes // 4) // size)
        else:
            per_slice = max(n, 1)
        starts = range(0, n, per_slice)
        result = _ArrowResult(n, len(starts), self._loop)
        works: list[_ArrowSend] = []
        for start in starts:
            work = _ArrowSend(batch.slice(start, per_slice), start, result, self._loop)
            if self._buffered + work.bytes > self._max_bytes:
                try:
                    await self._make_room(work.bytes)
                    self._check_running()
                except BaseException as exc:
                    if not works:
                        raise  # nothing enqueued
                    result.fail(exc)  # earlier slices are on their way: report on the future
                    break
            self._buffered += work.bytes
            self._seal()  # the open batch goes first: per-shard order is send order
            self._seal_queue.append(work)
            self._wake_writer.set()
            works.append(work)
        if self._eager:
            for work in works:
                await work.durable
        return result.future

    async def flush(self) -> None:
        """Send everything accepted so far and wait until each batch is acknowledged or failed.

        Failures are reported on the records' futures, not raised here.
        """
        self._check_running()
        self._flushing += 1
        self._batch_full.set()
        try:
            self._seal()
            for durable in [w.durable for w in self._seal_queue]:
                with contextlib.suppress(SeglogError, OSError):
                    await asyncio.shield(durable)
            target = self._last_id
            while self._unfinished and next(iter(self._unfinished)) <= target:
                await self._wait(self._progress)
        finally:
            self._flushing -= 1

    # --- overflow ------------------------------------------------------------------------

    async def _make_room(self, size: int) -> None:
        if size > self._max_bytes:
            raise BufferFull(f"{size} bytes do not fit in buffer_max_bytes={self._max_bytes}")
        if self._overflow == "error":
            raise BufferFull(
                f"the producer buffer holds {self._buffered} of buffer_max_bytes={self._max_bytes};"
                f" {size} more do not fit"
            )
        if self._overflow == "drop_oldest":
            self._drop_oldest(size)
        assert self._loop is not None
        deadline = self._loop.time() + self._timeout_s
        while self._buffered + size > self._max_bytes:
            left = deadline - self._loop.time()
            if left <= 0:
                raise BufferFull(
                    f"no room for {size} bytes in buffer_max_bytes={self._max_bytes} freed within"
                    f" request_timeout_ms={self._timeout_s * 1000:g}"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wait(self._space), left)
            if self._overflow == "drop_oldest":
                self._drop_oldest(size)

    def _drop_oldest(self, size: int) -> None:
        dropped = BufferFull("dropped by overflow='drop_oldest' before it was sent: the buffer was full")
        while self._buffered + size > self._max_bytes:
            heads = [(q[0].id, s) for s, q in self._unsent.items() if q]
            if not heads:
                return
            _, shard = min(heads)
            queue = self._unsent[shard]
            item = queue.popleft()
            if not queue:
                with contextlib.suppress(ValueError):
                    self._ready_shards.remove(shard)
            self._unsent_bytes -= item.size
            self.dropped_batches += 1
            self.dropped_records += item.count
            log.debug("producer: dropped a batch of %d records of shard %d (buffer full)", item.count, shard)
            self._fail_item(item, dropped)
            self._finish(item)

    # --- sealing into the buffer ---------------------------------------------------------

    def _linger_expired(self, group: _Group) -> None:
        if group is self._group:
            self._seal()

    def _seal(self) -> None:
        """Close the open batch (if it has records) and have the writer store it."""
        group = self._group
        assert group is not None and self._loop is not None
        if self._linger_handle is not None:
            self._linger_handle.cancel()
            self._linger_handle = None
        if not group.futs:
            return
        self._seal_queue.append(group)
        self._group = _Group(self._loop)
        self._wake_writer.set()

    async def _writer(self) -> None:
        """Build items from sealed work and append them to the buffer, in order (one task)."""
        while True:
            await self._wake_writer.wait()
            self._wake_writer.clear()
            if self._eager:
                self._seal()  # group commit: every send since the last append, in one
            if not self._seal_queue:
                continue
            works = list(self._seal_queue)
            self._seal_queue.clear()
            items: list[_Item] = []
            built: list[tuple[_Group | _ArrowSend, list[_Item]]] = []
            for work in works:
                try:
                    mine = self._group_items(work) if isinstance(work, _Group) else self._arrow_items(work)
                except SeglogError as exc:  # cannot happen for validated records; fail just this work
                    self._fail_work(work, exc)
                    continue
                built.append((work, mine))
                items.extend(mine)
            if not items:
                continue
            assert self._buffer is not None
            payloads = [it.parts for it in items]
            try:
                if self._io is None:
                    ids = self._buffer.append_many(payloads)
                else:
                    ids = await self._run_io(self._buffer.append_many, payloads)
            except OSError as exc:
                err = StorageError(f"writing the producer buffer failed: {exc}")
                err.__cause__ = exc
                for work, _ in built:
                    self._fail_work(work, err)
                continue
            for item, item_id in zip(items, ids, strict=True):
                item.id = item_id
                self._unfinished[item_id] = item
                self._enqueue(item)
            self._last_id = ids[-1]
            for work, mine in built:
                # The estimate counted at send() becomes the stored size.
                self._buffered += sum(it.size for it in mine) - work.bytes
                if not work.durable.done():
                    work.durable.set_result(None)
            if self._fsync == "interval" and self._io is not None and self._sync_timer is None:
                assert self._loop is not None
                self._sync_timer = self._loop.call_later(DEFAULT_FSYNC_INTERVAL_S, self._sync_soon)

    def _sync_soon(self) -> None:
        self._sync_timer = None
        if self._io is not None and self._buffer is not None:
            self._io.submit(self._buffer.sync).add_done_callback(_report_sync)

    def _fail_work(self, work: _Group | _ArrowSend, exc: SeglogError) -> None:
        self._buffered -= work.bytes
        if isinstance(work, _Group):
            _fail_all(work.futs, exc)
        else:
            work.fail(exc)
        if not work.durable.done():
            work.durable.set_exception(exc)
            work.durable.exception()  # awaited only under "always": never "never retrieved" noise
        _wake(self._space)

    def _group_items(self, group: _Group) -> list[_Item]:
        n = len(group.futs)
        headers = (
            null_headers(n)
            if group.headers is None
            else pa.array([None if h is None else list(h.items()) for h in group.headers], HEADERS_TYPE)
        )
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array(group.ts, pa.int64()),
                pa.array(group.topics, pa.string()),
                pa.array(group.keys, pa.binary()),
                pa.array(group.values, pa.binary()),
                headers,
            ],
            schema=PRODUCE_SCHEMA,
        )
        items = []
        parts = self._split(batch)
        for shard, rows, part in parts:
            if rows is None:
                futs, ts = group.futs, group.ts
            else:
                idx = rows.tolist()
                futs = [group.futs[i] for i in idx]
                ts = [group.ts[i] for i in idx]
            message, body = _encode(part, whole=len(parts) == 1)
            items.append(_Item(shard, part.num_rows, message, futs=futs, ts=ts, body=body))
        return items

    def _arrow_items(self, work: _ArrowSend) -> list[_Item]:
        batch = work.batch
        n = batch.num_rows
        per_row = max(1, batch.nbytes // max(n, 1))
        chunk_rows = max(1, self._max_batch_bytes // per_row)
        items = []
        parts = self._split(batch)
        for shard, rows, part in parts:
            all_rows = None if rows is None else work.row_base + rows
            for start in range(0, part.num_rows, chunk_rows):
                piece = part.slice(start, chunk_rows)
                stop = start + piece.num_rows
                message, body = _encode(piece, whole=len(parts) == 1)
                items.append(
                    _Item(
                        shard,
                        piece.num_rows,
                        message,
                        body=body,
                        arrow=work.result,
                        # All rows to one shard: a range of the result's rows (no index array).
                        rows=(
                            slice(work.row_base + start, work.row_base + stop)
                            if all_rows is None
                            else all_rows[start:stop]
                        ),
                    )
                )
        work.result.pending += len(items) - 1  # this slice is built: its items are what is left
        return items

    def _split(self, batch: pa.RecordBatch) -> list[tuple[int, np.ndarray[Any, Any] | None, pa.RecordBatch]]:
        """Rows by shard (the server's routing), each shard's rows in input order."""
        if self.shards == 1:
            return [(0, None, batch)]
        routes = route_rows(batch.column("topic"), batch.column("key"), self.shards)
        first = int(routes[0])
        if (routes == first).all():
            return [(first, None, batch)]
        order = np.argsort(routes, kind="stable")
        ordered = routes[order]
        bounds = [0, *(np.flatnonzero(np.diff(ordered)) + 1).tolist(), len(order)]
        taken = batch.take(pa.array(order))
        return [(int(ordered[a]), order[a:b], taken.slice(a, b - a)) for a, b in itertools.pairwise(bounds)]

    # --- the network side ----------------------------------------------------------------

    def _enqueue(self, item: _Item) -> None:
        queue = self._unsent[item.shard]
        if not queue:
            self._ready_shards.append(item.shard)
        queue.append(item)
        self._unsent_bytes += item.size
        if self._unsent_bytes >= self._max_batch_bytes:
            self._batch_full.set()
        self._wake_sender.set()

    async def _sender(self) -> None:
        """Start requests: the free shards' oldest items per request, ``max_in_flight`` at once.

        At most one request per shard is in flight: two requests of one shard on two
        connections may be written in either order, and a log keeps send order per shard.
        """
        linger = self._linger_s if self._eager else 0.0
        while True:
            while not any(s not in self._busy_shards for s in self._ready_shards):
                self._wake_sender.clear()
                await self._wake_sender.wait()
            if linger and not self._flushing and self._unsent_bytes < self._max_batch_bytes:
                # Items were sealed per send (group commit): let more of them gather.
                self._batch_full.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._batch_full.wait(), linger)
            await self._slots.acquire()
            for dropped in [s for s in self._ready_shards if not self._unsent[s]]:
                self._ready_shards.remove(dropped)  # its batches were dropped meanwhile
            free = [s for s in self._ready_shards if s not in self._busy_shards]
            if not free:
                self._slots.release()
                continue
            groups: list[tuple[int, list[_Item]]] = []
            size = 0
            pid: int | None = None  # a request carries one producer id (items sent before keep theirs)
            n_items = 0
            for shard in self._same_node(free):
                if groups and (size >= self._max_batch_bytes or n_items >= _MAX_ITEMS_PER_REQUEST):
                    break
                queue = self._unsent[shard]
                if pid is None:
                    pid = queue[0].pid
                elif queue[0].pid != pid:
                    continue
                self._ready_shards.remove(shard)
                items = [queue.popleft()]
                size += items[0].size
                while (
                    queue
                    and size + queue[0].size <= self._max_batch_bytes
                    and queue[0].pid == pid
                    and n_items + len(items) < _MAX_ITEMS_PER_REQUEST
                ):
                    items.append(queue.popleft())
                    size += items[-1].size
                n_items += len(items)
                if queue:
                    self._ready_shards.append(shard)
                self._busy_shards.add(shard)
                groups.append((shard, items))
            self._unsent_bytes -= size
            task = asyncio.create_task(self._request(groups), name=f"seglog-produce-{groups[0][0]}")
            self._requests.add(task)
            task.add_done_callback(self._requests.discard)
            task.add_done_callback(functools.partial(self._shards_done, [g[0] for g in groups]))

    def _same_node(self, free: list[int]) -> list[int]:
        """The free shards one request may carry: all of them for a single node; with
        ``bootstrap=``, those the first one's leader leads (as last learned); one shard for
        a replicated database reached through one URL (its shards' leaders may differ)."""
        if self._leaders is not None:
            leaders = self._leaders.view.leaders.get(self.db, [])

            def node(shard: int) -> int:
                return leaders[shard][0] if shard < len(leaders) else -1

            first = node(free[0])
            return [s for s in free if node(s) == first] if first >= 0 else free[:1]
        return free[:1] if self._shard_per_request else free

    def _requeue(self, groups: list[tuple[int, list[_Item]]]) -> None:
        """Put a refused request's items back in front of their shards, to be regrouped."""
        for shard, items in groups:
            queue = self._unsent[shard]
            queue.extendleft(reversed(items))
            self._unsent_bytes += sum(it.size for it in items)
            if shard not in self._ready_shards:
                self._ready_shards.append(shard)
        self._wake_sender.set()

    def _shards_done(self, shards: list[int], _task: asyncio.Task[None]) -> None:
        self._busy_shards.difference_update(shards)
        self._wake_sender.set()

    async def _request(self, groups: list[tuple[int, list[_Item]]]) -> None:
        try:
            items = [it for _, its in groups for it in its]
            shard = groups[0][0]
            body: bytes | memoryview
            if len(items) == 1 and items[0].body is not None:
                body = items[0].body  # the stream it was sealed in: nothing copied
            else:
                body = b"".join([_SCHEMA_MESSAGE, *(it.message for it in items), _EOS])
            params: dict[str, str | int] = {"acks": self._acks}
            if len(groups) == 1:
                params["shard"] = shard
            else:
                params["shards"] = ",".join([str(it.shard) for it in items])
            expected = {s: sum(it.count for it in its) for s, its in groups}
            which = f"shard {shard}" if len(groups) == 1 else f"shards {sorted(expected)}"
            attempt = 0
            delay = self._backoff_s
            while True:
                try:
                    if self.idempotent:
                        await self._number(items, params)
                    self.sent_requests += 1
                    session = self._session
                    if self._leaders is not None:
                        session = self._leaders.session(await self._leaders.leader_url(self.db, shard))
                    reply = await session.request(
                        "POST",
                        self._path,
                        params=params,
                        data=body,
                        content_type=protocol.ARROW_STREAM,
                        timeout_s=self._timeout_s,
                    )
                    offsets = _reply_offsets(reply.json(), expected)
                except SeglogError as exc:
                    if len(groups) > 1 and isinstance(exc, NotLeader):
                        # Refused before anything was written: the leaders moved apart.
                        # Learn them again and let the sender regroup the shards.
                        await asyncio.sleep(self._backoff_s)  # no tight loop while a shard has no leader
                        if self._leaders is not None:
                            with contextlib.suppress(ServerUnavailable):
                                await self._leaders.refresh(force=True)
                        self.retried_requests += 1
                        self._requeue(groups)
                        return
                    if protocol.is_retriable(exc) and (self._retries is None or attempt < self._retries):
                        if self._leaders is not None and isinstance(exc, ServerUnavailable):
                            # The leader moved or died: learn the new one before retrying.
                            with contextlib.suppress(ServerUnavailable):
                                await self._leaders.refresh(force=True)
                        attempt += 1
                        self.retried_requests += 1
                        wait = max(delay, getattr(exc, "retry_after_s", None) or 0.0)
                        log.info(
                            "producer: %s request failed (%s); retry %d in %.2f s",
                            which,
                            exc,
                            attempt,
                            wait,
                        )
                        await asyncio.sleep(wait)
                        delay = min(delay * 2, self._backoff_max_s)
                        continue
                    self.failed_batches += len(items)
                    log.warning("producer: giving up on %d batches of %s: %r", len(items), which, exc)
                    if any(it.seq >= 0 for it in items):
                        # Their sequence numbers may or may not be stored: the shards' next
                        # records cannot follow them. A new producer id starts afresh.
                        self._new_producer_id(items[0].pid)
                    for item in items:
                        self._fail_item(item, exc)
                        self._finish(item)
                    return
                for s, its in groups:
                    at = 0
                    for item in its:
                        self._complete(item, s, offsets[s][at : at + item.count])
                        at += item.count
                        self._finish(item)
                return
        finally:
            self._slots.release()

    async def _producer_id(self) -> int:
        """The current producer id, asked of the node when there is none (after start or
        after a batch was given up on)."""
        async with self._pid_lock:
            if self._pid < 0:
                session = self._session
                if self._leaders is not None:
                    session = self._leaders.session(await self._leaders.leader_url(self.db, 0))
                reply = await session.request("POST", f"{protocol.API_PREFIX}/dbs/{self.db}/producer-id")
                try:
                    self._pid = int(reply.json()["producer_id"])
                except (KeyError, TypeError, ValueError):
                    raise RemoteError(f"unexpected producer-id reply: {reply.json()!r:.200}") from None
                self._next_seq = {}
            return self._pid

    def _new_producer_id(self, old: int) -> None:
        """Drop ``old`` (if still current): the next item sent asks for a new id."""
        if self._pid == old:
            self._pid = -1

    async def _number(self, items: list[_Item], params: dict[str, str | int]) -> None:
        """Give the items never sent the current producer id and their shards' next sequence
        numbers (a retry keeps the ones it was sent with), and name them in ``params``."""
        if any(it.seq < 0 for it in items):
            pid = items[0].pid if items[0].seq >= 0 else await self._producer_id()
            for it in items:
                if it.seq < 0:
                    seq = self._next_seq.get(it.shard, 0)
                    if seq + it.count > MAX_SEQUENCE:  # numbering exhausted: a new id
                        self._new_producer_id(pid)
                        pid = await self._producer_id()
                        seq = 0
                    it.pid, it.seq = pid, seq
                    self._next_seq[it.shard] = seq + it.count
        params["producer_id"] = items[0].pid
        params["producer_epoch"] = 0
        params["seqs"] = ",".join(str(it.seq) for it in items)

    def _complete(self, item: _Item, shard: int, offsets: np.ndarray[Any, Any]) -> None:
        if item.futs is not None:
            ts = item.ts
            assert ts is not None
            for i, (fut, offset) in enumerate(zip(item.futs, offsets.tolist(), strict=True)):
                if not fut.done():
                    fut.set_result(RecordMeta(shard, offset, ts[i]))
        elif item.arrow is not None:
            assert item.rows is not None
            item.arrow.part_done(item.rows, shard, offsets)

    def _fail_item(self, item: _Item, exc: BaseException) -> None:
        if item.futs is not None:
            _fail_all(item.futs, exc)
        elif item.arrow is not None:
            item.arrow.fail(exc)

    def _finish(self, item: _Item) -> None:
        """The item is acknowledged or given up on: free its room, remove it from the buffer."""
        if self._unfinished.pop(item.id, None) is None:
            return
        self._buffered -= item.size
        if self._io is None:
            if self._buffer is not None:
                self._buffer.ack(item.id)
        else:
            self._acks_to_commit.append(item.id)
            self._commit_wanted.set()
        _wake(self._space)
        _wake(self._progress)

    async def _committer(self) -> None:
        """Apply acknowledgements to the disk buffer and persist them, at most every 50 ms."""
        while True:
            await self._commit_wanted.wait()
            self._commit_wanted.clear()
            acks, self._acks_to_commit = self._acks_to_commit, []
            buffer = self._buffer
            if buffer is None or self._io is None:
                continue

            def commit(acks: list[int] = acks, buffer: Buffer = buffer) -> None:
                for item_id in acks:
                    buffer.ack(item_id)
                buffer.commit()

            try:
                await self._run_io(commit)
            except OSError as exc:
                log.warning("producer: writing the buffer's commit file failed: %s", exc)
            except asyncio.CancelledError:
                # Stopping: the close applies these (acks are idempotent if this one ran).
                self._acks_to_commit[:0] = acks
                raise
            await asyncio.sleep(_COMMIT_INTERVAL_S)

    # --- helpers -------------------------------------------------------------------------

    async def _wait(self, waiters: list[asyncio.Future[None]]) -> None:
        assert self._loop is not None
        fut: asyncio.Future[None] = self._loop.create_future()
        waiters.append(fut)
        try:
            await fut
        finally:
            with contextlib.suppress(ValueError):
                waiters.remove(fut)

    async def _run_io(self, fn: Callable[..., T], *args: Any) -> T:
        assert self._loop is not None
        return await self._loop.run_in_executor(self._io, fn, *args)


def _encode(batch: pa.RecordBatch, *, whole: bool) -> tuple[memoryview, memoryview | None]:
    """An item's record-batch message, and the one-batch stream it is a view of when the
    item is likely to go alone in a request (``whole``: its batch was not split by shard);
    an item of a split goes with other shards' items, in a body joined from their messages
    (the stream's schema and end marker would only cost its writer's setup per item)."""
    if whole:
        body = _stream(batch)
        return _message(body), body
    return memoryview(batch.serialize()), None


def _stream(batch: pa.RecordBatch) -> memoryview:
    """``batch`` as a whole Arrow IPC stream (schema message, record-batch message,
    end-of-stream marker): the body of a request of this one batch, as is.

    Written once, in one buffer of Arrow's pool, and never copied after: the buffer item is
    its header and :func:`_message`'s view of it. (The producer used to join the header and
    the message into the item, then the item's message into the body: two more copies of
    every batch before the HTTP client's own.)
    """
    if not batch.schema.equals(PRODUCE_SCHEMA):  # e.g. schema metadata: the stream declares ours
        batch = pa.RecordBatch.from_arrays(batch.columns, schema=PRODUCE_SCHEMA)
    buf = pa.allocate_buffer(len(_SCHEMA_MESSAGE) + pa.ipc.get_record_batch_size(batch) + len(_EOS))
    sink = pa.FixedSizeBufferWriter(buf)
    with pa.ipc.RecordBatchStreamWriter(sink, PRODUCE_SCHEMA, options=_IPC_OPTIONS) as writer:
        writer.write_batch(batch)
    return memoryview(buf)[: sink.tell()]  # (the size is exact; never send bytes not written)


def _message(body: memoryview) -> memoryview:
    """The record-batch message of a one-batch stream from :func:`_stream`."""
    return body[len(_SCHEMA_MESSAGE) : len(body) - len(_EOS)]


def _reply_offsets(reply: Any, expected: dict[int, int]) -> dict[int, np.ndarray[Any, Any]]:
    """Each shard's record offsets, in send order, from a produce reply's parts (one per shard,
    or for an idempotent produce runs in order: records stored before keep their offsets,
    ``-1`` when the node no longer knows them), checked against the records sent."""
    try:
        runs: dict[int, list[np.ndarray[Any, Any]]] = {}
        for p in reply["parts"]:
            base, count = int(p["base_offset"]), int(p["count"])
            run = np.full(count, -1, np.int64) if base < 0 else np.arange(base, base + count, dtype=np.int64)
            runs.setdefault(int(p["shard"]), []).append(run)
        out = {s: np.concatenate(r) for s, r in runs.items()}
        if {s: len(o) for s, o in out.items()} != expected:
            raise ValueError
        return out
    except (KeyError, TypeError, ValueError):
        raise RemoteError(
            f"unexpected produce reply for {expected} (shard: records): {reply!r:.200}"
        ) from None


def _fail_all(futs: list[asyncio.Future[RecordMeta]], exc: BaseException) -> None:
    for fut in futs:
        if not fut.done():
            fut.set_exception(exc)
            fut.exception()  # a caller that dropped the future must not get "never retrieved" noise


def _report_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("producer: task %s failed", task.get_name(), exc_info=task.exception())


def _report_sync(fut: concurrent.futures.Future[None]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.warning("producer: syncing the buffer failed: %s", fut.exception())


def _wake(waiters: list[asyncio.Future[None]]) -> None:
    for fut in waiters:
        if not fut.done():
            fut.set_result(None)


def _write_meta(path: Path, meta: dict[str, Any]) -> None:
    _fs.makedirs_durable(path.parent)
    _fs.atomic_write(path, json.dumps(meta).encode())
