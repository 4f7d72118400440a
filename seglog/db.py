"""A database: shards, routing, validation, and the async read/append API."""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Final, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from seglog._routing import route_rows, shard_for
from seglog.db_config import DbConfig, validate_db_name
from seglog.db_producers import Producers
from seglog.engines.base import (
    Engine,
    GenerationEngine,
    GenerationInfo,
    Quota,
    SegmentedEngine,
    ShardStats,
    StreamEngine,
    StreamRead,
    empty_read_table,
)
from seglog.errors import (
    ClosedResourceError,
    ConfigMismatch,
    CorruptFrame,
    CurrentGeneration,
    ForeignIterator,
    GenerationDropped,
    InvalidArgument,
    InvalidIterator,
    OffsetOutOfRange,
    StreamFilterMismatch,
    UnknownGeneration,
    UnknownStream,
)
from seglog.groups import GroupStore, validate_group_name
from seglog.iterators import Iterator as StreamIterator
from seglog.iterators import Slab, Stream, structure_check
from seglog.record import (
    MAX_LEADER_EPOCH,
    Record,
    RecordMeta,
    now_us,
    parse_header,
    records_from_table,
    records_to_batch,
    table_to_batch,
    timestamp_us,
    verify_frame,
)
from seglog.segment.epoch_cache import epoch_for_offset
from seglog.segment.producer_state import ProducerStamp
from seglog.tiering.seam import ManifestEntry, TieredStorage
from seglog.topics import structure_regex, validate_topic_filter, varying_filter_for

if TYPE_CHECKING:
    from seglog.consumer import Consumer, StartFrom
    from seglog.subscriptions import Subscription, SubscriptionManager, SubscriptionStats

__all__ = ["AppendResult", "Database", "DbConfig", "TierShardStats", "shard_for", "validate_db_name"]

log = logging.getLogger("seglog.db")

# Reads larger than this convert to Record objects off the event loop.
_INLINE_RECORDS_MAX: Final = 4096
# Frames read for shipping are CRC-checked on the loop up to this size (a tail's few frames);
# larger reads are checked in a thread, so a follower's big fetch does not stall the loop.
_INLINE_VERIFY_BYTES: Final = 256 << 10
# Frames one next()/next_arrow() call reads at most (each may hold the stream): a very
# selective filter returns fewer records (maybe none) and a position further on.
_NEXT_MAX_FRAMES: Final = 4096
# Builds RecordMeta tuples without a Python-level __new__ per record.
_META: Final = functools.partial(tuple.__new__, RecordMeta)


class AppendResult(Sequence[RecordMeta]):
    """Where each appended record went, in input order: a read-only list of :class:`RecordMeta`.

    Items are built when accessed (building 1000 tuples per append cost 20% of a small-record
    append); ``shards``, ``offsets`` and ``timestamps`` are the underlying numpy arrays.
    Compares equal to any sequence of the same ``RecordMeta`` items.
    """

    __slots__ = ("offsets", "shards", "timestamps")

    def __init__(
        self, shards: np.ndarray[Any, Any], offsets: np.ndarray[Any, Any], timestamps: np.ndarray[Any, Any]
    ) -> None:
        self.shards = shards
        self.offsets = offsets
        self.timestamps = timestamps

    @classmethod
    def empty(cls) -> AppendResult:
        """The result of appending nothing."""
        return cls(np.empty(0, np.int32), np.empty(0, np.int64), np.empty(0, np.int64))

    def __len__(self) -> int:
        return len(self.offsets)

    @overload
    def __getitem__(self, index: int) -> RecordMeta: ...

    @overload
    def __getitem__(self, index: slice) -> list[RecordMeta]: ...

    def __getitem__(self, index: int | slice) -> RecordMeta | list[RecordMeta]:
        if isinstance(index, slice):
            return list(
                map(
                    _META,
                    zip(
                        self.shards[index].tolist(),
                        self.offsets[index].tolist(),
                        self.timestamps[index].tolist(),
                        strict=True,
                    ),
                )
            )
        return RecordMeta(int(self.shards[index]), int(self.offsets[index]), int(self.timestamps[index]))

    def __iter__(self) -> Iterator[RecordMeta]:
        return map(
            _META, zip(self.shards.tolist(), self.offsets.tolist(), self.timestamps.tolist(), strict=True)
        )

    def __eq__(self, other: object) -> bool:
        if isinstance(other, AppendResult | list | tuple):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        items = list(self[:3])
        more = f", ... {len(self) - 3} more" if len(self) > 3 else ""
        return f"AppendResult([{', '.join(map(repr, items))}{more}])"


class Database:
    """One database of a :class:`~seglog.Store`; get it from ``store.create_db``/``open_db``."""

    def __init__(
        self,
        name: str,
        config: DbConfig,
        engine: Engine,
        *,
        groups: GroupStore | None = None,
        clock_us: Callable[[], int] = now_us,
        persist_config: Callable[[DbConfig], None] | None = None,
        quota: Quota | None = None,
        tier: TieredStorage | None = None,
        uid: int = 0,
    ) -> None:
        self.name = name
        #: The database's random 64-bit id (stream iterators carry it).
        self.id = uid
        self.config = config
        self._engine = engine
        self._groups = groups
        self._clock_us = clock_us
        self._persist_config = persist_config
        self._quota = quota
        # What the engine can do beyond Engine, asked once (a structural check is not free).
        self._segmented: SegmentedEngine | None = engine if isinstance(engine, SegmentedEngine) else None
        self._stream_engine: StreamEngine | None = engine if isinstance(engine, StreamEngine) else None
        self._gen_engine: GenerationEngine | None = engine if isinstance(engine, GenerationEngine) else None
        self._gen_lock = asyncio.Lock()  # add_generation and drop_slab, one at a time
        if tier is not None and self._segmented is None:
            raise ConfigMismatch(
                f"database {name!r}: tiering needs the 'segment' engine, not {config.engine!r}"
            )
        # Tiering lives behind the seam: every tier-aware operation below delegates to it.
        self._tier = tier
        self._replicated = False  # set_replicated: retention stops at the high watermark
        self._wakeups: dict[int, asyncio.Event] = {}
        self._active_tails = 0
        self._subscriptions: SubscriptionManager | None = None  # made by the first subscribe
        engine.listener = self._wake
        engine.listener_many = self._wake_many
        self._config_lock = asyncio.Lock()
        self._producers = Producers()  # idempotent appends (append_arrow(producer=))
        self._closed = False

    @property
    def shards(self) -> int:
        """Number of shards."""
        return self.config.shards

    def _check(self) -> Engine:
        if self._closed:
            raise ClosedResourceError(f"database {self.name!r} is closed")
        return self._engine

    def _check_shard(self, shard: object) -> int:
        if type(shard) is not int or not 0 <= shard < self.config.shards:
            raise InvalidArgument(f"shard must be an int in 0..{self.config.shards - 1}, not {shard!r}")
        return shard

    # --- append ------------------------------------------------------------------------

    async def append(
        self, records: Record | Iterable[Record], *, shard: int | None = None, leader_epoch: int = 0
    ) -> AppendResult:
        """Append one record or a batch durably; return where each went, in input order.

        Records go to ``shard`` if given, else to their own ``shard`` attribute if set, else
        to :meth:`shard_for` of the key, or of the topic when there is no key. Within a shard,
        records keep their order. Either every record is validated and written or, on a
        validation error, nothing is.

        Records without ``ts`` are stamped ``now_us()`` (read once per call) plus their index
        in the call, so a batch keeps its order in time. Every ``ts`` must lie in
        ``[config.min_ts_us, config.max_ts_us]``. ``leader_epoch`` is stamped on the frames
        (0 for a standalone store; a replicated leader passes its epoch).

        Returns:
            An :class:`AppendResult`: a read-only list of ``RecordMeta(shard, offset, ts)``.

        Raises:
            InvalidRecord: A record is invalid (its index is in the message);
                :class:`~seglog.errors.InvalidTimestamp` for a ``ts`` out of range.
            InvalidArgument: ``records`` is neither a Record nor an iterable of them.
            StorageError: The disk failed; records of other shards may have been written.
        """
        engine = self._check()
        _check_epoch(leader_epoch)
        if isinstance(records, Record):
            recs: list[Record] = [records]
        elif isinstance(records, list):
            recs = records
        else:
            try:
                recs = list(records)
            except TypeError:
                raise InvalidArgument(
                    f"append takes a Record or an iterable of Records, not {type(records).__name__}"
                ) from None
        if not recs:
            return AppendResult.empty()
        if shard is not None:
            self._check_shard(shard)
        cfg = self.config
        batch = records_to_batch(
            recs, max_record_bytes=cfg.max_record_bytes, min_ts_us=cfg.min_ts_us, max_ts_us=cfg.max_ts_us
        )
        explicit: list[int | None] = []
        if shard is None:
            explicit = [r.shard for r in recs]
            if explicit.count(None) == len(explicit):
                explicit = []
            for s in explicit:
                if s is not None:
                    self._check_shard(s)
        shard_col, offset_col = await self._append_routed(engine, batch, shard, explicit, leader_epoch)
        return AppendResult(shard_col, offset_col, batch.column("ts").to_numpy())

    async def append_arrow(
        self,
        data: pa.Table | pa.RecordBatch,
        *,
        shard: int | None = None,
        shards: np.ndarray[Any, Any] | pa.Array | None = None,
        leader_epoch: int = 0,
        producer: ProducerStamp | None = None,
    ) -> pa.Table:
        """Append columns ``ts, topic, key, value[, headers][, stream]`` durably.

        ``topic`` and ``value`` are required; ``ts`` (int64 µs, or any Arrow timestamp) and
        ``key`` may be missing or null; routing, ``ts`` stamping and ``leader_epoch`` are as
        in :meth:`append`. ``shards`` (one integer per row, instead of ``shard``) sends each
        row to its own shard, as a record's ``shard`` attribute does in :meth:`append`.

        ``producer`` makes the append idempotent (:mod:`seglog.segment.producer_state`):
        ``ProducerStamp(producer_id, producer_epoch, {shard: sequence of its first row})``
        naming every shard the rows go to. Rows a shard already holds from that producer
        (a retry) are not written again and get their first offsets back (``-1`` when too old
        to place); the rest are written in frames of their own.

        Returns:
            A table with columns ``shard`` (int32) and ``offset`` (int64), one row per input
            row, in input order.

        Raises:
            InvalidRecord: A row or column is invalid; nothing was written.
            OutOfOrderSequence: With ``producer``: a shard is missing records before the
                sequence given; nothing was written.
            ProducerFenced: With ``producer``: a newer epoch of the producer wrote since.
        """
        engine = self._check()
        _check_epoch(leader_epoch)
        if not isinstance(data, (pa.Table, pa.RecordBatch)):
            raise InvalidArgument("append_arrow takes a pyarrow Table or RecordBatch")
        if shard is not None:
            self._check_shard(shard)
        explicit = np.empty(0, np.int32) if shards is None else self._row_shards(shards, data.num_rows, shard)
        cfg = self.config
        batch = table_to_batch(
            data, max_record_bytes=cfg.max_record_bytes, min_ts_us=cfg.min_ts_us, max_ts_us=cfg.max_ts_us
        )
        if producer is not None:
            if not isinstance(producer, ProducerStamp):
                raise InvalidArgument(f"producer must be a ProducerStamp, not {type(producer).__name__}")
            if shard is None and self.config.shards == 1 and not len(explicit):
                shard = 0
            routes = (
                np.full(batch.num_rows, shard, np.int32)
                if shard is not None
                else self._routes(batch, explicit)
            )
            if not batch.num_rows:
                offset_col = np.empty(0, np.int64)
            else:
                offset_col = await self._producers.append(
                    engine, batch, routes, producer, self._quota, leader_epoch
                )
            return pa.table({"shard": pa.array(routes), "offset": pa.array(offset_col)})
        shard_col, offset_col = await self._append_routed(engine, batch, shard, explicit, leader_epoch)
        return pa.table({"shard": pa.array(shard_col), "offset": pa.array(offset_col)})

    def _row_shards(
        self, shards: np.ndarray[Any, Any] | pa.Array, rows: int, shard: int | None
    ) -> np.ndarray[Any, np.dtype[np.int32]]:
        """``append_arrow(shards=)`` checked: one shard number per row, each in range."""
        if shard is not None:
            raise InvalidArgument("pass shard= or shards=, not both")
        if isinstance(shards, pa.Array | pa.ChunkedArray):
            if shards.null_count:
                raise InvalidArgument("shards must not hold nulls")
            shards = shards.to_numpy()
        if not isinstance(shards, np.ndarray) or shards.ndim != 1 or shards.dtype.kind not in "iu":
            raise InvalidArgument("shards must be a 1-D integer numpy or Arrow array")
        if len(shards) != rows:
            raise InvalidArgument(f"shards has {len(shards)} entries for {rows} rows")
        if rows and (int(shards.min()) < 0 or int(shards.max()) >= self.config.shards):
            bad = int(shards.min()) if int(shards.min()) < 0 else int(shards.max())
            raise InvalidArgument(f"shard must be an int in 0..{self.config.shards - 1}, not {bad}")
        return shards.astype(np.int32, copy=False)

    async def _append_routed(
        self,
        engine: Engine,
        batch: pa.RecordBatch,
        shard: int | None,
        explicit: list[int | None] | np.ndarray[Any, np.dtype[np.int32]],
        leader_epoch: int = 0,
    ) -> tuple[np.ndarray[Any, np.dtype[np.int32]], np.ndarray[Any, np.dtype[np.int64]]]:
        """Split a validated batch by shard, append the parts concurrently, return positions."""
        n = batch.num_rows
        if n == 0:
            return np.empty(0, np.int32), np.empty(0, np.int64)
        if shard is None and self.config.shards == 1 and not len(explicit):
            shard = 0
        if shard is not None:
            (base,) = await engine.append_many([(shard, batch)], self._quota, leader_epoch=leader_epoch)
            return np.full(n, shard, np.int32), np.arange(base, base + n, dtype=np.int64)
        routes = self._routes(batch, explicit)
        return routes, await engine.append_routed(batch, routes, self._quota, leader_epoch=leader_epoch)

    def shard_for(self, key_or_topic: bytes | str) -> int:
        """The shard a record routes to: pass its key (``bytes``), or its topic (``str``) when
        it has no key. The same stable hash :meth:`append` uses (see :mod:`seglog._routing`).

        Raises:
            InvalidArgument: Neither bytes nor str.
        """
        if isinstance(key_or_topic, str):
            data = key_or_topic.encode()
        elif isinstance(key_or_topic, bytes | bytearray | memoryview):
            data = bytes(key_or_topic)
        else:
            raise InvalidArgument(
                f"shard_for takes a key (bytes) or a topic (str), not {type(key_or_topic).__name__}"
            )
        return shard_for(data, self.config.shards)

    def _routes(
        self, batch: pa.RecordBatch, explicit: list[int | None] | np.ndarray[Any, np.dtype[np.int32]]
    ) -> np.ndarray[Any, np.dtype[np.int32]]:
        """Shard of every row: explicit, else the routing hash of the key, else of the topic."""
        if isinstance(explicit, np.ndarray):
            if len(explicit):
                return explicit
            explicit = []
        out = route_rows(batch.column("topic"), batch.column("key"), self.config.shards)
        if explicit:
            forced = np.array([-1 if s is None else s for s in explicit], np.int32)
            out = np.where(forced >= 0, forced, out).astype(np.int32)
        return out

    # --- reads -------------------------------------------------------------------------

    async def read(
        self, shard: int, offset: int, max_records: int = 1000, *, upper: int | None = None
    ) -> list[Record]:
        """Records from ``offset`` (at most ``max_records``, none at or past ``upper``); empty at the end.

        Raises:
            OffsetOutOfRange: ``offset`` is below the start or past the end.
        """
        engine, max_records = self._read_bounds(shard, offset, max_records, upper)
        if max_records == 0:
            return []
        if self._tier is not None:
            table = await self._tier.read_arrow(shard, offset, max_records)
            return await self._to_records(table, shard)
        # The engine converts on the thread that read the table: one hand-off per read, not two
        # (on a busy machine each wake-up of another thread costs up to milliseconds).
        return await engine.read_arrow_then(
            shard, offset, max_records, functools.partial(records_from_table, shard=shard)
        )

    async def read_arrow(
        self, shard: int, offset: int, max_records: int = 100_000, *, upper: int | None = None
    ) -> pa.Table:
        """Records from ``offset`` as a table with an ``offset`` column (zero-copy bodies).

        ``upper`` caps the offsets returned (below it): a server passes the high watermark so
        consumers never see what replication may still take back.
        """
        engine, max_records = self._read_bounds(shard, offset, max_records, upper)
        if max_records == 0:
            return empty_read_table()
        if self._tier is not None:
            return await self._tier.read_arrow(shard, offset, max_records)
        return await engine.read_arrow(shard, offset, max_records)

    def _read_bounds(
        self, shard: int, offset: int, max_records: int, upper: int | None
    ) -> tuple[Engine, int]:
        """Check a read's arguments; return the engine and ``max_records`` capped by ``upper``
        (0: nothing to read below ``upper``, and ``offset`` is in range)."""
        engine = self._check()
        self._check_shard(shard)
        _check_int("offset", offset)
        _check_int("max_records", max_records, minimum=1)
        if upper is not None:
            _check_int("upper", upper)
            if upper <= offset:
                end = engine.end_offset(shard)
                if not self.start_offset(shard) <= offset <= end:
                    raise OffsetOutOfRange(offset, self.start_offset(shard), end, shard=shard)
                return engine, 0
            max_records = min(max_records, upper - offset)
        return engine, max_records

    async def offset_for_time(self, shard: int, ts: int | dt.datetime) -> int:
        """First offset whose record has ``ts >=`` the given time; the end offset if none.

        Args:
            shard: The shard.
            ts: µs since 1970, or a datetime (naive means UTC).
        """
        engine = self._check()
        self._check_shard(shard)
        ts = timestamp_us(ts)
        _check_int("ts", ts, minimum=-(1 << 63))
        if self._tier is not None:
            return await self._tier.offset_for_time(shard, ts)
        return await engine.offset_for_time(shard, ts)

    def _key_shard(self, a: bytes | int, b: bytes | None, shard: int | None) -> tuple[int, bytes]:
        if type(a) is int:  # read_key(shard, key)
            if b is None or shard is not None:
                raise InvalidArgument("call read_key(key), read_key(key, shard=n) or read_key(shard, key)")
            shard, a = a, b
        elif b is not None:
            raise InvalidArgument("call read_key(key), read_key(key, shard=n) or read_key(shard, key)")
        key = a
        if not isinstance(key, bytes):
            raise InvalidArgument(f"key must be bytes, not {type(key).__name__}")
        if shard is None:
            shard = self.shard_for(key)
        return self._check_shard(shard), key

    @overload
    async def read_key(self, key: bytes, /, *, shard: int | None = None) -> list[Record]: ...

    @overload
    async def read_key(self, shard: int, key: bytes, /) -> list[Record]: ...

    async def read_key(
        self, a: bytes | int, b: bytes | None = None, /, *, shard: int | None = None
    ) -> list[Record]:
        """Every record with a key, in offset order: ``read_key(key)`` looks in the shard the
        key routes to (:meth:`shard_for`); pass ``shard=`` (or ``read_key(shard, key)``) if
        the records were appended to a chosen shard."""
        s, key = self._key_shard(a, b, shard)
        return await self._to_records(await self.read_key_arrow(key, shard=s), s)

    @overload
    async def read_key_arrow(self, key: bytes, /, *, shard: int | None = None) -> pa.Table: ...

    @overload
    async def read_key_arrow(self, shard: int, key: bytes, /) -> pa.Table: ...

    async def read_key_arrow(
        self, a: bytes | int, b: bytes | None = None, /, *, shard: int | None = None
    ) -> pa.Table:
        """Like :meth:`read_key`, as a table with the columns of :meth:`read_arrow`
        (``offset, ts, topic, key, value, headers, stream``)."""
        engine = self._check()
        shard, key = self._key_shard(a, b, shard)
        if self._tier is not None:
            return await self._tier.read_key(shard, key)
        return await engine.read_key(shard, key)

    async def _to_records(self, table: pa.Table, shard: int) -> list[Record]:
        if table.num_rows <= _INLINE_RECORDS_MAX:
            return records_from_table(table, shard)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, records_from_table, table, shard)

    def start_offset(self, shard: int) -> int:
        """First readable offset of ``shard`` (with a tier: the first tiered offset that runs
        contiguously into the local log)."""
        self._check_shard(shard)
        local_start = self._check().start_offset(shard)
        if self._tier is None:
            return local_start
        return self._tier.logical_start(shard, local_start)

    def local_start_offset(self, shard: int) -> int:
        """First offset of ``shard`` held on local disk (equals :meth:`start_offset` untiered)."""
        self._check_shard(shard)
        return self._check().start_offset(shard)

    def end_offset(self, shard: int) -> int:
        """Offset the next record of ``shard`` will get (all below it are durable)."""
        self._check_shard(shard)
        return self._check().end_offset(shard)

    def stats(self) -> list[ShardStats]:
        """Per shard: ``ShardStats(shard, start_offset, end_offset, segments, bytes)`` -- the
        first readable offset (with a tier, tiered offsets count), the next offset to be
        assigned, the number of local segment files and their bytes (0 segments for the
        ``memory`` and ``lmdb`` engines)."""
        engine = self._check()
        out = [engine.stats(s) for s in range(self.config.shards)]
        if self._tier is not None:
            tier = self._tier
            out = [replace(st, start_offset=tier.logical_start(st.shard, st.start_offset)) for st in out]
        return out

    # --- streams -----------------------------------------------------------------------

    @property
    def streams_enabled(self) -> bool:
        """Whether appends stamp streams (``DbConfig.lts_thresholds`` is set)."""
        engine = self._stream_engine
        return engine is not None and engine.streams_enabled

    def _streams(self) -> StreamEngine:
        self._check()
        engine = self._stream_engine
        if engine is None or not engine.streams_enabled:
            raise InvalidArgument(
                f"database {self.name!r} has no streams (created with lts_thresholds=None, "
                "or before streams existed)"
            )
        return engine

    def get_streams(self, topic_filter: str, start_time_us: int | dt.datetime = 0) -> list[Stream]:
        """The streams that may hold records whose topic matches an MQTT filter.

        A stream is one learned topic structure of one shard in one generation (see
        :class:`~seglog.Stream`); read each with :meth:`make_iterator` and :meth:`next`
        (streams of different shards, or of one shard and generation, may be read in
        parallel; within a shard, read generation G to ``end_of_stream`` before G+1). MQTT
        semantics: ``+`` is one level, ``#`` the rest including none (``a/#`` matches ``a``),
        and topics starting with ``$`` only match filters whose first level names them. A
        stream may hold topics the filter does not match; the iterator filters them out.

        Args:
            topic_filter: An MQTT topic filter.
            start_time_us: µs or a datetime: generations closed before it (see
                :meth:`list_slabs`, ``until_us``) are left out, as EMQX does (records are
                assumed to carry timestamps no later than their append).

        Returns:
            The streams of every live generation, in generation order, then by shard and id.

        Raises:
            InvalidTopicFilter: A malformed filter.
            InvalidArgument: The database has no streams.
        """
        engine = self._streams()
        validate_topic_filter(topic_filter)
        start = timestamp_us(start_time_us, "start_time_us")
        gen_engine = self._generations()
        out: list[Stream] = []
        if gen_engine is None:
            for shard in range(self.config.shards):
                for sid, _vf in engine.match_streams(shard, topic_filter):
                    found = engine.stream_structure(shard, sid)
                    if found is not None:
                        out.append(Stream(shard, sid, found[0], found[1], self.id))
            return out
        gens = gen_engine.list_generations()
        for i, gen in enumerate(gens):
            nxt = gens[i + 1] if i + 1 < len(gens) else None
            if gen.dropped or (nxt is not None and nxt.created_us < start):
                continue
            for shard in range(self.config.shards):
                if nxt is not None and nxt.starts[shard] <= gen.starts[shard]:
                    continue  # the generation holds no record of this shard
                for sid, structure, special in gen_engine.generation_streams(gen.id, shard, topic_filter):
                    out.append(Stream(shard, sid, structure, special, self.id, gen.id))
        return out

    def _generations(self) -> GenerationEngine | None:
        """The engine's generations (``None``: an engine without them has one, 1)."""
        engine = self._gen_engine
        return engine if engine is not None and engine.generations_enabled else None

    def _generation(
        self, generation: int, shard: int | None = None, offset: int = 0
    ) -> GenerationInfo | None:
        """A live generation and the one after it, checked (``None``: no generations).

        Raises:
            UnknownStream: No such generation.
            GenerationDropped: It was dropped.
        """
        engine = self._generations()
        if engine is None:
            if generation != 1:
                raise UnknownStream(f"database {self.name!r} has no generation {generation!r}")
            return None
        gens = engine.list_generations()
        first = gens[0].id
        if type(generation) is not int or not first <= generation < first + len(gens):
            raise UnknownStream(f"database {self.name!r} has no generation {generation!r}")
        info = gens[generation - first]
        if info.dropped:
            raise GenerationDropped(generation, shard=shard, offset=offset)
        return info

    def _generation_end(self, generation: int, shard: int) -> int | None:
        """Where ``generation`` ends in ``shard``; ``None`` while it is current."""
        engine = self._generations()
        if engine is None:
            return None
        gens = engine.list_generations()
        i = generation - gens[0].id + 1
        return gens[i].starts[shard] if i < len(gens) else None

    def _owned_stream(
        self, db_id: int, shard: int, stream: int, check: int, generation: int = 1, offset: int = 0
    ) -> tuple[tuple[str, ...], bool]:
        """The structure of a stream an iterator or Stream names, after checking it is ours.

        Raises:
            GenerationDropped: Its generation was dropped.
        """
        engine = self._streams()
        if db_id != self.id:
            raise ForeignIterator(
                f"this stream or iterator belongs to another database (id {db_id:016x}, "
                f"not {self.name!r}'s {self.id:016x})"
            )
        if type(shard) is not int or not 0 <= shard < self.config.shards:
            raise UnknownStream(f"database {self.name!r} has no shard {shard!r}")
        gen_engine = self._generations()
        if self._generation(generation, shard, offset) is None or gen_engine is None:
            found = engine.stream_structure(shard, stream)
        else:
            found = gen_engine.generation_stream_structure(generation, shard, stream)
        if found is None or structure_check(*found) != check:
            raise UnknownStream(
                f"shard {shard} of database {self.name!r} has no stream {stream} of that structure"
            )
        return found

    def make_iterator(
        self, stream: Stream, topic_filter: str, start_time_us: int | dt.datetime = 0
    ) -> StreamIterator:
        """An iterator at the start of ``stream`` for the records matching ``topic_filter``.

        Args:
            stream: One of :meth:`get_streams`.
            topic_filter: The MQTT filter the records must match (usually the one given to
                :meth:`get_streams`; only its varying levels are kept in the iterator).
            start_time_us: Records with an earlier ``ts`` (µs, or a datetime) are skipped.

        Raises:
            ForeignIterator: ``stream`` is another database's.
            UnknownStream: This database has no such stream (any more).
            StreamFilterMismatch: The filter can match no topic of the stream.
            InvalidTopicFilter: A malformed filter.
        """
        if not isinstance(stream, Stream):
            raise InvalidArgument(f"make_iterator takes a Stream, not {type(stream).__name__}")
        structure, special = self._owned_stream(
            stream.db_id, stream.shard, stream.id, stream.check, stream.generation
        )
        vf = varying_filter_for(structure, special, topic_filter)
        if vf is None:
            raise StreamFilterMismatch(
                f"topic filter {topic_filter!r} matches no topic of stream {stream.pattern!r}"
            )
        start = timestamp_us(start_time_us, "start_time_us")
        _check_int("start_time_us", start, minimum=-(1 << 63))
        info = self._generation(stream.generation, stream.shard)
        position = 0 if info is None else info.starts[stream.shard]
        return StreamIterator(
            self.id,
            stream.shard,
            stream.id,
            stream.check,
            position,
            start,
            tuple(vf),
            generation=stream.generation,
        )

    async def next_arrow(
        self, iterator: StreamIterator, n: int = 1000, *, upper: int | None = None
    ) -> tuple[StreamIterator, pa.Table]:
        """The next records (at most ``n``) of an iterator's stream that match its filter.

        Records come in offset (append) order, only those at or after the iterator's
        position, with ``ts`` at or after its start time and a topic matching its filter
        (the varying levels are checked). An empty table means nothing more yet: the stream
        may grow, unless the iterator returned has ``end_of_stream`` set: its generation is
        closed (a newer one exists) and all of its records were read. The iterator returned
        goes on after the records returned (or after everything read, which may be further
        on when a call read many frames without a match).

        With a tier, records that are only in the tier (below the local start) are read
        from it, through the store's tier read cache. ``upper`` caps the offsets returned
        (below it), as in :meth:`read_arrow`: a server passes the high watermark, and the
        iterator returned stops there.

        Returns:
            ``(next iterator, table)``; the table has :meth:`read_arrow`'s columns.

        Raises:
            ForeignIterator: The iterator is another database's.
            UnknownStream: This database has no such stream (any more).
            GenerationDropped: The iterator's generation was dropped (also when that
                happens during the call).
            InvalidArgument: ``n`` is not a positive int, or ``upper`` not an int.
        """
        engine = self._streams()
        if not isinstance(iterator, StreamIterator):
            raise InvalidArgument(f"next takes an Iterator, not {type(iterator).__name__}")
        _check_int("n", n, minimum=1)
        if upper is not None:
            _check_int("upper", upper)
        shard, generation = iterator.shard, iterator.generation
        structure, _special = self._owned_stream(
            iterator.db_id, shard, iterator.stream, iterator.check, generation, iterator.position
        )
        if len(iterator.varying_filter) != structure.count("+"):
            raise InvalidIterator("the iterator's filter does not fit its stream")
        if iterator.end_of_stream:
            return iterator, empty_read_table()
        info = self._generation(generation, shard, iterator.position)
        position = self._undiverged(shard, iterator.position, iterator.epoch)
        position = position if info is None else max(position, info.starts[shard])
        end = self._generation_end(generation, shard)
        if end is not None and position >= end:
            return replace(iterator, position=end, end_of_stream=True), empty_read_table()
        if upper is not None and position >= upper:
            if position != iterator.position:
                iterator = iterator.advanced(position, self._epoch_before(shard, position))
            return iterator, empty_read_table()
        want = StreamRead(
            iterator.stream, iterator.start_time_us, structure_regex(structure, iterator.varying_filter)
        )
        if self._tier is not None:
            batch = await self._tier.read_stream(shard, position, want, n, _NEXT_MAX_FRAMES)
        else:
            batch = await engine.read_stream(shard, position, want, n, _NEXT_MAX_FRAMES)
        self._generation(generation, shard, position)  # dropped while it was read
        table, next_offset = batch.table, batch.next_offset
        if upper is not None and next_offset > upper:
            # Rows come in offset order: those below ``upper`` are all the matches there.
            if table.num_rows and table.column("offset")[-1].as_py() >= upper:
                table = table.filter(pc.less(table.column("offset"), upper))
            next_offset = upper
        if end is not None and next_offset >= end:
            # The read ran into the next generation, whose ids name other streams.
            if table.num_rows and table.column("offset")[-1].as_py() >= end:
                table = table.filter(pc.less(table.column("offset"), end))
            if not table.num_rows:
                return replace(iterator, position=end, end_of_stream=True), table
            next_offset = end
        return iterator.advanced(next_offset, self._epoch_before(shard, next_offset)), table

    def _undiverged(self, shard: int, position: int, epoch: int) -> int:
        """Where an iterator goes on: ``position``, or where the log diverged from what it read.

        ``epoch`` wrote the record before ``position`` when the iterator was returned. If this
        log now ends that epoch below ``position`` (a replica cut its log back to its new
        leader's and took newer records there), the records from that point are not the ones
        the iterator read: it goes on from there (Kafka's KIP-320 check for consumers).
        """
        if epoch < 0 or position == 0:
            return position
        found, epoch_end = self._replica_engine().end_offset_for_epoch(shard, epoch)
        if found < 0 or epoch_end < 0 or epoch_end >= position:
            return position
        return max(epoch_end, self.start_offset(shard))

    def _epoch_before(self, shard: int, offset: int) -> int:
        """The leader epoch that wrote ``offset - 1`` (-1: no epochs recorded, or none)."""
        if offset == 0:
            return -1
        epoch = epoch_for_offset(self._replica_engine().leader_epochs(shard), offset - 1)
        return -1 if epoch is None else epoch

    async def next(
        self, iterator: StreamIterator, n: int = 1000, *, upper: int | None = None
    ) -> tuple[StreamIterator, list[Record]]:
        """Like :meth:`next_arrow`, as :class:`~seglog.Record` objects (``shard`` and ``offset`` set)."""
        it, table = await self.next_arrow(iterator, n, upper=upper)
        return it, await self._to_records(table, iterator.shard)

    def _watch_stream(self, shard: int, stream: int, watch: bool) -> None:
        """Have the engine note (or stop noting) where appends stamp a stream (subscriptions)."""
        self._streams().watch_stream(shard, stream, watch)

    def _stream_stamped_since(self, shard: int, stream: int, offset: int, generation: int = 1) -> bool:
        """Whether a watched stream may have records at ``offset`` or later (see the engine's).

        ``True`` for a generation that is not the current one: a read then finds its end
        (``end_of_stream``) or that it was dropped.
        """
        if generation != self._current_generation():
            return True
        return self._streams().stream_stamped_since(shard, stream, offset)

    def _current_generation(self) -> int:
        """The current generation's id (1 for an engine without generations)."""
        gens = self._generations()
        return 1 if gens is None else gens.list_generations()[-1].id

    def subscribe(self, iterator: StreamIterator, *, max_unacked: int) -> Subscription:
        """Deliver an iterator's records as they become durable: EMQX's ``subscribe``.

        ``async for batch in sub`` yields :class:`~seglog.SubscriptionBatch` es (records as
        ``batch.table`` or ``batch.records``, a cumulative ``batch.seqno`` counting records,
        and ``batch.iterator`` to resume from), first what the stream holds from the
        iterator's position, then new records as appends complete (woken, never polled).
        At most ``max_unacked`` records are delivered and not acknowledged with
        ``sub.suback(seqno)``; delivery waits for a suback. Subscriptions of one stream share
        its reads (see :mod:`seglog.subscriptions`). The iteration ends on ``sub.close()``,
        at the database's close, or at ``end_of_stream``; a failed read is raised from it.

        Raises:
            InvalidArgument: Not an iterator, or ``max_unacked`` is not an int >= 1; the
                database has no streams.
            ForeignIterator: The iterator is another database's.
            UnknownStream: This database has no such stream (any more).
            ClosedResourceError: The database is closed.
        """
        from seglog.subscriptions import SubscriptionManager

        self._streams()
        if self._subscriptions is None:
            self._subscriptions = SubscriptionManager(self)
        return self._subscriptions.subscribe(iterator, max_unacked)

    def subscription_stats(self) -> SubscriptionStats:
        """Open subscriptions and beams, and what they cost so far (reads shared and not)."""
        from seglog.subscriptions import SubscriptionManager

        self._check()
        if self._subscriptions is None:
            self._subscriptions = SubscriptionManager(self)
        return self._subscriptions.stats()

    # --- generations ---------------------------------------------------------------------

    def _generation_engine(self) -> GenerationEngine:
        self._streams()
        engine = self._generations()
        if engine is None:
            raise InvalidArgument(f"the {self.config.engine!r} engine has no generations (use 'segment')")
        return engine

    async def add_generation(self) -> Slab:
        """Close the current generation and start a new one on every shard (EMQX's
        ``add_generation``).

        A generation is a run of every shard's log learned with one LTS: the new one's
        tries inherit only the wildcard structure of the old ones (a topic that went
        through a ``+`` keeps going through it; static topics are learned afresh), so its
        stream ids are its own. Appends from now on go to it; each shard's active segment
        is sealed, so it starts a segment of its own. Iterators of the old generation read
        its records to their end, then return ``end_of_stream``; :meth:`get_streams` lists
        the new generation's streams after the old ones'. Crash-safe: an open after a crash
        finds either the old or the new generation current.

        Returns:
            The new generation.

        Raises:
            InvalidArgument: The database has no streams, or its engine no generations.
            StorageError: The generation files could not be written (nothing changed).
        """
        engine = self._generation_engine()
        async with self._gen_lock:
            self._check()
            await engine.add_generation(self._clock_us())
        self._wake_subscriptions()  # those of the old generation read to its end
        return self.list_slabs()[-1]

    def _wake_subscriptions(self) -> None:
        if self._subscriptions is not None:
            for shard in range(self.config.shards):
                self._subscriptions.notify(shard)

    def list_slabs(self) -> list[Slab]:
        """Every generation of the database, dropped ones too, oldest first (the last one
        is current): EMQX's ``list_slabs``, one :class:`~seglog.Slab` for all shards.

        Raises:
            InvalidArgument: The database has no streams, or its engine no generations.
        """
        gens = self._generation_engine().list_generations()
        out = []
        for i, g in enumerate(gens):
            nxt = gens[i + 1] if i + 1 < len(gens) else None
            out.append(
                Slab(
                    g.id,
                    g.created_us,
                    None if nxt is None else nxt.created_us,
                    g.starts,
                    None if nxt is None else nxt.starts,
                    g.dropped,
                    nxt is None,
                )
            )
        return out

    async def drop_slab(self, slab: Slab | int) -> int:
        """Drop a closed generation: its records are gone, and reads of it (iterators, also
        ones made before, and subscriptions) raise :class:`~seglog.errors.GenerationDropped`.

        The segments of dropped generations are deleted once every older generation is
        dropped too (a shard's log is cut at its start: the oldest live generation's first
        offset); dropping the oldest generation first, as retention by generation does,
        frees its space at once. Dropping a generation twice does nothing.

        Args:
            slab: One of :meth:`list_slabs`, or a generation number.

        Returns:
            Bytes of segment files deleted.

        Raises:
            UnknownGeneration: The database never had this generation.
            CurrentGeneration: It is the current generation (add one first).
            InvalidArgument: The database has no streams, or its engine no generations.
            StorageError: The manifest could not be written (nothing was dropped).
        """
        engine = self._generation_engine()
        generation = slab.generation if isinstance(slab, Slab) else slab
        async with self._gen_lock:
            self._check()
            gens = engine.list_generations()
            first = gens[0].id
            if type(generation) is not int or not first <= generation < first + len(gens):
                raise UnknownGeneration(f"database {self.name!r} has no generation {generation!r}")
            if generation == gens[-1].id:
                raise CurrentGeneration(
                    f"generation {generation} of {self.name!r} is the current one: add a generation first"
                )
            await engine.mark_generation_dropped(generation)
            self._wake_subscriptions()  # their reads of it now fail
            live = next(g for g in engine.list_generations() if not g.dropped)
            freed = 0
            for shard in range(self.config.shards):
                if live.starts[shard] > self._engine.start_offset(shard):
                    freed += await self.truncate_before(shard, live.starts[shard])
            return freed

    # --- tiering -----------------------------------------------------------------------

    @property
    def tiered(self) -> bool:
        """Whether this database tiers (a ``segment`` DB in a store opened with ``tier=``)."""
        return self._tier is not None

    def _tiered_storage(self) -> TieredStorage:
        self._check()
        if self._tier is None:
            raise InvalidArgument(
                f"database {self.name!r} has no tier: open the store with tier=... (segment engine only)"
            )
        return self._tier

    def set_replicated(self) -> None:
        """This database is a replica of a replicated database (a cluster node sets it):
        retention then never deletes a segment holding offsets at or above a shard's high
        watermark, as Kafka's does not, whatever ``retention_overrides_groups`` says."""
        self._replicated = True

    def tier_leads(self, leads: Callable[[], Mapping[int, int]] | None) -> None:
        """In a store opened with ``tier_shared=True`` (a cluster node): ``leads()`` names the
        shards this node leads, ``{shard: leader epoch}``; :meth:`tier_now` uploads only
        those, each up to its high watermark. Without a tier this does nothing."""
        if self._tier is not None:
            self._tier.follow_leads(leads)

    async def tier_committed_end(self, shard: int) -> int:
        """Offset after the last record of ``shard`` committed in the tier, as the tier holds
        it now (a replicated database's shared manifest is read again): 0 when none is.

        Raises:
            InvalidArgument: The database does not tier, or no such shard.
            TierError: The tier could not be read.
        """
        tier = self._tiered_storage()
        self._check_shard(shard)
        return await tier.committed_end(shard)

    async def tier_now(self) -> list[ManifestEntry]:
        """Upload every sealed, not yet committed local segment, then apply local retention.

        Segments are read as Arrow tables and uploaded in a worker thread; appends go on
        meanwhile. A local segment is only deleted once its records are committed in the
        tier, and only as ``local_retention_bytes``/``local_retention_ms`` allow.

        Returns:
            The manifest entries committed by this call.

        Raises:
            InvalidArgument: The database does not tier.
            TierError: The tier failed (nothing local is lost; call again later).
        """
        tier = self._tiered_storage()
        return await tier.tier_now(self.config, self._after_delete)

    async def seal(self, shard: int | None = None) -> int:
        """Seal the active segment of ``shard`` (or of every shard) so it can be tiered.

        Only the ``segment`` engine has segments to seal.

        Returns:
            How many segments were sealed.

        Raises:
            InvalidArgument: The database's engine has no segments.
        """
        self._check()
        engine = self._segmented
        if engine is None:
            raise InvalidArgument(f"the {self.config.engine!r} engine has no segments to seal")
        shards = range(self.config.shards) if shard is None else [self._check_shard(shard)]
        sealed = 0
        for s in shards:
            sealed += int(await engine.seal(s))
        return sealed

    def tier_stats(self) -> list[TierShardStats]:
        """Per shard: hot (active segment), warm (sealed local) and cold (committed in the
        tier) bytes, plus logical and local start offsets. Without a tier (or for other
        engines) everything local counts as hot and cold is 0."""
        engine = self._check()
        segmented = self._segmented
        out = []
        for shard in range(self.config.shards):
            end = engine.end_offset(shard)
            local_start = engine.start_offset(shard)
            if segmented is None:
                st = engine.stats(shard)
                out.append(TierShardStats(shard, st.bytes, 0, 0, local_start, local_start, end, 0))
                continue
            segs = segmented.segment_ranges(shard)
            hot = segs[-1].size if segs else 0
            warm = sum(seg.size for seg in segs[:-1])
            tier = self._tier
            if tier is None:
                out.append(TierShardStats(shard, hot, warm, 0, local_start, local_start, end, 0))
                continue
            cold = tier.cold_stats(shard)
            start = tier.logical_start(shard, local_start)
            out.append(TierShardStats(shard, hot, warm, cold.bytes, start, local_start, end, cold.objects))
        return out

    # --- settings ----------------------------------------------------------------------

    async def configure(self, **settings: Any) -> DbConfig:
        """Change mutable settings durably; new segment sizes apply to segments rolled from now.

        Mutable: ``segment_bytes``, ``segment_ms``, ``max_record_bytes``, ``retention_bytes``,
        ``retention_ms``, ``retention_overrides_groups``, ``local_retention_bytes``,
        ``local_retention_ms`` (the last two: ``segment`` engine only).

        Returns:
            The new configuration.

        Raises:
            ConfigMismatch: A setting fixed at creation (``shards``, ``engine``,
                ``compression``, ``index_interval_bytes``) differs from the current value.
            InvalidArgument: Unknown setting or value out of range; nothing changed.
        """
        engine = self._check()
        known = {f.name for f in fields(DbConfig)}
        unknown = set(settings) - known
        if unknown:
            raise InvalidArgument(f"unknown database settings: {sorted(unknown)}")
        for name, value in settings.items():
            if name not in DbConfig.MUTABLE and value != getattr(self.config, name):
                raise ConfigMismatch(
                    f"{name} cannot be changed after creation (it is {getattr(self.config, name)!r})"
                )
        async with self._config_lock:
            new = replace(self.config, **settings).validate()
            if self._persist_config is not None:
                await asyncio.to_thread(self._persist_config, new)
            self.config = new
            engine.reconfigure(segment_bytes=new.segment_bytes, segment_ms=new.segment_ms)
        return new

    # --- retention ---------------------------------------------------------------------

    # --- replica log ---------------------------------------------------------------------

    def _replica_engine(self) -> Engine:
        # Every engine stores the same frames and implements the replica-log operations.
        return self._check()

    async def read_frames(self, shard: int, offset: int, max_bytes: int = 1 << 20) -> bytes:
        """The stored frames of ``shard`` from the one holding ``offset``, byte for byte.

        What replication ships: at least one whole frame when any lies at or after
        ``offset`` (its first record may be below ``offset``), else up to ``max_bytes``.
        Empty at the end offset.

        Every frame's CRC is checked before it leaves: a frame that rotted on disk (a
        flipped bit, a cut file) is never shipped to a follower or a consumer. The frames
        before it are returned; when the first frame itself is bad this raises.

        Raises:
            OffsetOutOfRange: ``offset`` is outside ``[start, end]`` (local segments only).
            InvalidArgument: Bad shard or ``max_bytes``.
            CorruptFrame: The first frame from ``offset`` (the one holding it) fails its checks.
        """
        engine = self._replica_engine()
        self._check_shard(shard)
        _check_int("offset", offset)
        _check_int("max_bytes", max_bytes, minimum=1)
        data = await engine.read_frames(shard, offset, max_bytes)
        if len(data) <= _INLINE_VERIFY_BYTES:
            return _verified_prefix(data, shard, offset)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, _verified_prefix, data, shard, offset)

    async def append_frames(
        self, shard: int, frames: bytes | bytearray | memoryview, *, expected_base: int
    ) -> int:
        """Store frames read from another log (:meth:`read_frames`) at the end of ``shard``, byte for byte.

        Every frame is checked (magic, lengths, CRC) and must continue the log exactly from
        ``expected_base``, the shard's end offset; the leader epoch inside each frame is
        kept. Durable and indexed like :meth:`append`; nothing is written when a check fails.

        Returns:
            The shard's new end offset.

        Raises:
            OffsetMismatch: ``expected_base`` is not the end offset, or the frames leave a gap
                or overlap.
            CorruptFrame: A frame fails its checks.
            StorageError: The write failed; nothing of it is in the log.
        """
        engine = self._replica_engine()
        self._check_shard(shard)
        _check_int("expected_base", expected_base)
        if not isinstance(frames, bytes | bytearray | memoryview):
            raise InvalidArgument(f"frames must be bytes, not {type(frames).__name__}")
        try:
            return await engine.append_frames(shard, frames, expected_base=expected_base)
        finally:
            self._producers.forget(shard)  # a leader's frames: rebuilt from the log if this node leads

    async def truncate_to(self, shard: int, offset: int, *, force: bool = False) -> int:
        """Remove every record of ``shard`` at or after ``offset`` (a replica that diverged).

        The cut is at a frame boundary: the new end is ``offset``, or the base offset of the
        frame holding it. It is durable and crash-safe at every step (an interrupted cut is
        finished by the next open). Records already tiered are never cut (in a shared tier, a
        replica may cut its own records that diverged from what the leaders tiered).

        Returns:
            The shard's new end offset.

        Raises:
            OffsetOutOfRange: ``offset`` is below the start or past the end offset.
            InvalidArgument: ``offset`` is below what was tiered, or below the high
                watermark without ``force`` (the leader-epoch cache and a high watermark
                above the cut are cut with the log).
            BusyResourceError: The shard is already being truncated.
        """
        engine = self._replica_engine()
        self._check_shard(shard)
        _check_int("offset", offset)
        try:
            if self._tier is not None:
                end = await self._tier.truncate_to(shard, offset, force=force)
            else:
                end = await engine.truncate_to(shard, offset, force=force)
        finally:
            self._producers.forget(shard)
        if self._subscriptions is not None:
            self._subscriptions.truncated(shard, end)
        return end

    async def restart_at(self, shard: int, offset: int) -> int:
        """Empty ``shard`` and start it over at ``offset``, at or past its end offset (Kafka's
        ``truncateFullyAndStartAt``): a follower whose log ends below its leader's start
        (retention, or local copies dropped after tiering) cannot fetch what it misses, and
        takes the leader's start instead. Crash-safe; the shard's epoch cache, index and
        producer state go; its high watermark becomes ``offset``. With a tier, offsets below
        ``offset`` stay readable from the tier when its objects cover them.

        Returns:
            ``offset``.

        Raises:
            InvalidArgument: ``offset`` is below the end offset, or the engine has no segments.
            BusyResourceError: The shard is being truncated.
            StorageError: A step failed (the next open finds the shard empty).
        """
        self._check()
        engine = self._segmented
        if engine is None:
            raise InvalidArgument(f"the {self.config.engine!r} engine cannot restart a shard")
        self._check_shard(shard)
        _check_int("offset", offset)
        try:
            return await engine.restart_at(shard, offset)
        finally:
            self._producers.forget(shard)

    def end_offset_for_epoch(self, shard: int, epoch: int) -> tuple[int, int]:
        """Kafka's OffsetsForLeaderEpoch: ``(largest known epoch <= epoch, the offset it ends at)``.

        The latest epoch ends at the end offset; ``(-1, -1)`` when no epoch qualifies. A
        standalone store's frames all have epoch 0.
        """
        engine = self._replica_engine()
        self._check_shard(shard)
        _check_int("epoch", epoch)
        return engine.end_offset_for_epoch(shard, epoch)

    def leader_epochs(self, shard: int) -> list[tuple[int, int]]:
        """The shard's leader-epoch cache, ``(epoch, start offset)`` oldest first (empty: all epoch 0)."""
        engine = self._replica_engine()
        self._check_shard(shard)
        return engine.leader_epochs(shard)

    def high_watermark(self, shard: int) -> int:
        """The shard's high watermark (0 until replication or the caller moves it)."""
        engine = self._replica_engine()
        self._check_shard(shard)
        return engine.high_watermark(shard)

    def update_high_watermark(self, shard: int, hw: int) -> bool:
        """Move the shard's high watermark up to ``hw`` (never down, at most the end offset).

        Persisted lazily (idle time, close): after a crash it may be older, never newer.

        Returns:
            Whether it moved.
        """
        engine = self._replica_engine()
        self._check_shard(shard)
        _check_int("hw", hw)
        return engine.update_high_watermark(shard, hw)

    async def truncate_before(self, shard: int, offset: int) -> int:
        """Make ``offset`` the first readable offset of ``shard`` and delete sealed segments below it.

        Ignores consumer groups. The start never moves backwards (a lower ``offset`` is a no-op).
        Only whole sealed segments are deleted; the one holding ``offset`` stays on disk but
        serves nothing below it.

        Returns:
            Bytes of local segment files removed (0 when none was wholly below ``offset``;
            tier objects deleted are not counted).

        Raises:
            OffsetOutOfRange: ``offset`` is past the end offset.
        """
        engine = self._check()
        self._check_shard(shard)
        _check_int("offset", offset)
        if self._tier is not None:
            return await self._tier.truncate_before(shard, offset, self._after_delete)
        freed = await engine.truncate_before(shard, offset)
        self._after_delete(freed)
        return freed

    async def enforce_retention(self) -> int:
        """Apply ``retention_bytes``/``retention_ms`` now (the store also runs it periodically).

        Only whole sealed segments go, oldest first; the active segment never does. A segment
        goes by bytes if the shard stays at or above ``retention_bytes`` without it, and by time
        if its largest record timestamp is older than ``retention_ms`` on the store clock.
        Unless ``retention_overrides_groups``, a segment holding offsets at or above the
        smallest offset any group committed on the shard is kept.

        Returns:
            Bytes of local segment files removed; 0 when nothing expired (tier objects
            deleted by retention are not counted).
        """
        engine = self._check()
        cfg = self.config
        if cfg.retention_bytes is None and cfg.retention_ms is None:
            return 0
        floors: list[int | None] = [None] * cfg.shards
        if not cfg.retention_overrides_groups and self._groups is not None:
            groups = self._groups
            floors = await asyncio.to_thread(lambda: [groups.min_committed(s) for s in range(cfg.shards)])
        if self._replicated:
            # Never past what every in-sync replica holds: a follower still fetching must find
            # it (and records above the high watermark are not acknowledged to acks=all yet).
            hws = [engine.high_watermark(s) for s in range(cfg.shards)]
            floors = [hw if f is None else min(f, hw) for f, hw in zip(floors, hws, strict=True)]
        if self._tier is not None:
            return await self._tier.enforce_retention(cfg, floors, self._after_delete)
        freed = await engine.enforce_retention(
            cfg.retention_bytes, cfg.retention_ms, self._clock_us(), floors
        )
        self._after_delete(freed)
        return freed

    def _after_delete(self, freed: int) -> None:
        """Tell the store's space accounting that ``freed`` bytes of files are gone."""
        if freed and self._quota is not None:
            self._quota.release(freed)

    # --- live tail -----------------------------------------------------------------------

    def _wake(self, shard: int) -> None:
        if self._subscriptions is not None:
            self._subscriptions.notify(shard)
        if not self._wakeups:
            return  # nobody tails: the common case, called once per shard an append touched
        for key in (shard, _ANY_SHARD):
            event = self._wakeups.pop(key, None)
            if event is not None:
                event.set()

    def _wake_many(self, shards: np.ndarray[Any, Any]) -> None:
        """:meth:`_wake` for every shard of one append, without a call per shard when nobody waits."""
        if self._subscriptions is not None:
            for shard in shards.tolist():
                self._subscriptions.notify(shard)
        if not self._wakeups:
            return
        event = self._wakeups.pop(_ANY_SHARD, None)
        if event is not None:
            event.set()
        waiting = [k for k in self._wakeups if k != _ANY_SHARD]
        if waiting:
            for key in np.asarray(waiting)[np.isin(waiting, shards)].tolist():
                event = self._wakeups.pop(key, None)
                if event is not None:
                    event.set()

    def _wakeup(self, shard: int) -> asyncio.Event:
        """An event set by the next completed append to ``shard`` (``_ANY_SHARD``: to any)."""
        event = self._wakeups.get(shard)
        if event is None:
            event = self._wakeups[shard] = asyncio.Event()
        return event

    async def tail_arrow(
        self, shard: int, offset: int, *, max_records: int = 100_000
    ) -> AsyncGenerator[pa.Table, None]:
        """Tables of records from ``offset`` on: what exists, then new records as they become durable.

        Waits on an event set when an append to ``shard`` completes (no polling). The
        iteration ends when the database is closed; closing or cancelling it releases
        everything.

        Raises:
            OffsetOutOfRange: ``offset`` is outside the shard (or retention passed it).
        """
        self._check()
        self._check_shard(shard)
        _check_int("offset", offset)
        _check_int("max_records", max_records, minimum=1)
        self._active_tails += 1
        try:
            while not self._closed:
                event = self._wakeup(shard)  # taken before reading: no lost wake-up
                if offset < self._engine.end_offset(shard):
                    table = await self.read_arrow(shard, offset, max_records)
                    if table.num_rows:
                        offset += table.num_rows
                        yield table
                        continue
                await event.wait()
        finally:
            self._active_tails -= 1

    async def tail(
        self, shard: int, offset: int, *, batch_records: int = 1000
    ) -> AsyncGenerator[Record, None]:
        """Records from ``offset`` on, then new ones as they become durable (see :meth:`tail_arrow`)."""
        tables = self.tail_arrow(shard, offset, max_records=batch_records)
        try:
            async for table in tables:
                for rec in await self._to_records(table, shard):
                    yield rec
        finally:
            await tables.aclose()

    def consumer(
        self,
        group: str | None = None,
        *,
        from_: StartFrom = None,
        batch_records: int = 1000,
    ) -> Consumer:
        """An async iterator over every shard, with a position per shard (see :class:`~seglog.Consumer`).

        Args:
            group: A consumer group: positions start at its commits and
                :meth:`Consumer.commit` stores them.
            from_: Where shards without a commit (or every shard, if not ``None``) start:
                ``"earliest"`` (default), ``"latest"``, a datetime, or ``{shard: offset}``.
            batch_records: Most records read from one shard at a time.
        """
        from seglog.consumer import Consumer

        self._check()
        return Consumer(self, group, from_=from_, batch_records=batch_records)

    # --- consumer groups ---------------------------------------------------------------

    def _group_store(self) -> GroupStore:
        self._check()
        if self._groups is None:
            raise InvalidArgument(f"database {self.name!r} has no group store")
        return self._groups

    async def commit(self, group: str, shard: int, offset: int) -> None:
        """Commit ``offset`` (the next one to consume) for ``group`` on ``shard``, durably.

        A commit may move backwards (rewind, as in Kafka); it is not checked against the
        shard's end offset.

        Raises:
            InvalidName: Bad group name.
            InvalidArgument: Bad shard or offset.
        """
        groups = self._group_store()
        validate_group_name(group)
        self._check_shard(shard)
        _check_int("offset", offset)
        await asyncio.to_thread(groups.commit, group, shard, offset)

    async def committed(self, group: str, shard: int) -> int | None:
        """The offset ``group`` last committed on ``shard``, or ``None``."""
        groups = self._group_store()
        validate_group_name(group)
        self._check_shard(shard)
        return await asyncio.to_thread(groups.committed, group, shard)

    async def close(self) -> None:
        """Close the database (the store closes its databases itself)."""
        if self._closed:
            return
        self._closed = True
        for event in self._wakeups.values():
            event.set()
        self._wakeups.clear()
        if self._subscriptions is not None:
            await self._subscriptions.close()  # its reads in flight end before the engine closes
        if self._tier is not None:
            await self._tier.close()  # let a running upload or tier retention finish
        try:
            await self._engine.drain()
            await self._engine.close()
        finally:
            if self._groups is not None:
                await asyncio.to_thread(self._groups.close)

    def __repr__(self) -> str:
        return f"<Database {self.name!r} shards={self.config.shards} engine={self.config.engine}>"


@dataclass(frozen=True)
class TierShardStats:
    """Where a shard's bytes live (see :meth:`Database.tier_stats`)."""

    shard: int
    hot_bytes: int
    warm_bytes: int
    cold_bytes: int
    start_offset: int
    local_start_offset: int
    end_offset: int
    tier_objects: int


_ANY_SHARD: Final = -1


def _check_epoch(leader_epoch: object) -> None:
    if type(leader_epoch) is not int or not 0 <= leader_epoch <= MAX_LEADER_EPOCH:
        raise InvalidArgument(f"leader_epoch must be an int in 0..{MAX_LEADER_EPOCH}, not {leader_epoch!r}")


def _verified_prefix(data: bytes, shard: int, offset: int) -> bytes:
    """The frames of ``data`` up to the first that fails its checks (raise if that is the first)."""
    pos = 0
    expected = offset
    while pos < len(data):
        try:
            header = parse_header(data, pos)
            verify_frame(data, pos, header)
            if pos + header.size > len(data):
                raise CorruptFrame(f"frame at byte {pos} runs past the data read")
        except CorruptFrame as exc:
            if pos:
                log.error("%s; serving the %d bytes before it", exc, pos)
                return data[:pos]
            raise CorruptFrame(
                f"shard {shard}: the stored frame holding offset {expected} is damaged ({exc}); "
                "it is not served"
            ) from exc
        expected = header.next_offset
        pos += header.size
    return data


def _check_int(name: str, value: object, *, minimum: int = 0) -> None:
    if type(value) is not int or value < minimum:
        raise InvalidArgument(f"{name} must be an int >= {minimum}, not {value!r}")
