"""Following a shard from another process: read-only, no lock, new records as they land.

A store is owned by one process (:class:`~seglog.errors.StoreLocked` for a second opener), so
that process's ``db.tail`` cannot serve a consumer elsewhere. :func:`follow` reads the shard's
files directly instead, through the engine's cross-process reader
(:class:`~seglog.engines.base.EngineReader`, opened by name from the engine registry; for
``segment`` see :mod:`seglog.engines.segment_reader`), and waits for new frames by checking
every ``poll_interval_ms``: for ``segment`` one ``pread`` and one directory listing per check,
so an idle follower costs next to nothing.

With ``group=...`` a follower also reads and commits that consumer group's position; that
commit is its only write.

Limits: only engines with a cross-process reader can be followed, ``segment`` today
(``memory`` keeps its frames in the owner's RAM; ``lmdb`` is not supported yet); offsets
below the local start (retention, tiering) are not read through to the tier; a follower sees a frame as soon as the owner has written it,
which under ``fsync="interval"``/``"never"`` can be before it is durable against power loss.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from types import TracebackType
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from seglog.db_config import validate_db_name
from seglog.engines import get_engine
from seglog.engines.base import READ_SCHEMA, EngineReader, ShardCursor, empty_read_table, with_offsets
from seglog.errors import (
    BusyResourceError,
    ClosedResourceError,
    CorruptFrame,
    DatabaseNotFound,
    InvalidArgument,
    StorageError,
)
from seglog.groups import GroupStore, validate_group_name
from seglog.record import decode_body, timestamp_us
from seglog.store import STORE_FILE, db_directory, is_open_in_this_process, read_db_config

__all__ = ["DEFAULT_POLL_INTERVAL_MS", "Follower", "follow"]

DEFAULT_POLL_INTERVAL_MS: Final = 50
_READ_BYTES: Final = 4 << 20
# LMDB allows one handle per environment per process: followers of several shards of one
# database share its group store (reference-counted).
_GROUP_STORES: dict[Path, tuple[GroupStore, int]] = {}


def _acquire_groups(db_dir: Path) -> GroupStore:
    store, refs = _GROUP_STORES.get(db_dir, (None, 0))
    if store is None:
        store = GroupStore(db_dir)
    _GROUP_STORES[db_dir] = (store, refs + 1)
    return store


def _release_groups(db_dir: Path) -> None:
    store, refs = _GROUP_STORES[db_dir]
    if refs > 1:
        _GROUP_STORES[db_dir] = (store, refs - 1)
        return
    del _GROUP_STORES[db_dir]
    store.close()


class Follower:
    """A read-only position in one shard; iterate it for :class:`pyarrow.Table` batches.

    Create with :func:`follow`; use as ``async with`` (or call :meth:`close`).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        db: str,
        shard: int,
        *,
        offset: int | None = None,
        from_time_us: int | dt.datetime | None = None,
        poll_interval_ms: int = DEFAULT_POLL_INTERVAL_MS,
        group: str | None = None,
    ) -> None:
        validate_db_name(db)
        if group is not None:
            validate_group_name(group)
        if type(shard) is not int or shard < 0:
            raise InvalidArgument("shard must be an int >= 0")
        if offset is not None and (type(offset) is not int or offset < 0):
            raise InvalidArgument("offset must be None or an int >= 0")
        if from_time_us is not None:
            from_time_us = timestamp_us(from_time_us, "from_time_us")
        if offset is not None and from_time_us is not None:
            raise InvalidArgument("give offset or from_time_us, not both")
        if type(poll_interval_ms) is not int or poll_interval_ms < 1:
            raise InvalidArgument("poll_interval_ms must be an int >= 1")
        self.path = Path(path).absolute()
        self.db = db
        self.shard = shard
        self.poll_interval_ms = poll_interval_ms
        self._offset = offset
        self._from_time_us = from_time_us
        self.group = group
        self._groups: GroupStore | None = None
        self._groups_dir = Path()
        self._engine_reader: EngineReader | None = None
        self._reader: ShardCursor | None = None
        self._state = "new"
        self.position = -1  # the next offset to deliver, once open

    async def __aenter__(self) -> Follower:
        await self.open()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def open(self) -> None:
        """Check the database and position the follower.

        Raises:
            DatabaseNotFound: No such database (or no seglog store at ``path``).
            InvalidArgument: The shard does not exist or the engine cannot be followed.
            OffsetOutOfRange: ``offset`` is outside the shard's local range.
        """
        if self._state != "new":
            raise ClosedResourceError("the follower was already opened")
        self._state = "opening"
        try:
            await asyncio.to_thread(self._open_blocking)
        except BaseException:
            await self.close()
            raise
        self._state = "open"

    def _open_blocking(self) -> None:
        if not (self.path / STORE_FILE).is_file():
            raise DatabaseNotFound(f"{self.path} is not a seglog data directory")
        db_dir = db_directory(self.path, self.db)
        config = read_db_config(self.path, self.db)
        # Raises InvalidArgument for an engine that cannot be followed, or a shard it lacks.
        self._engine_reader = get_engine(config.engine).reader(db_dir, config.shards)
        reader = self._reader = self._engine_reader.open_shard(self.shard)
        committed = None
        if self.group is not None:
            if is_open_in_this_process(self.path):
                raise BusyResourceError(
                    f"{self.path} is open in this process: use Database.committed/commit there, "
                    "or follow without group=..."
                )
            # LMDB's own lock file makes this safe next to the owner's handle on it.
            self._groups = _acquire_groups(db_dir)
            self._groups_dir = db_dir
            committed = self._groups.committed(self.group, self.shard)
        if committed is not None and self._offset is None and self._from_time_us is None:
            start = max(committed, reader.start_offset())
            reader.seek(start)
            self.position = start
        elif self._from_time_us is not None:
            reader.seek_time(self._from_time_us)
            self.position = reader.next_offset  # refined by the first frame's timestamps
        else:
            start = reader.start_offset() if self._offset is None else self._offset
            reader.seek(start)
            self.position = start

    async def close(self) -> None:
        """Release the open files; idempotent."""
        self._state = "closed"
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._engine_reader is not None:
            self._engine_reader.close()
            self._engine_reader = None
        if self._groups is not None:
            self._groups = None
            _release_groups(self._groups_dir)

    async def commit(self, offset: int) -> None:
        """Commit ``offset`` (the next one to consume) for the follower's group, durably.

        This is the only write a follower makes: one LMDB transaction in the database's group
        store, which LMDB's lock file serialises with the owning process.

        Raises:
            InvalidArgument: The follower has no group, or ``offset`` is negative.
        """
        self._check_open()
        if self._groups is None or self.group is None:
            raise InvalidArgument("this follower has no group (follow(..., group=...))")
        if type(offset) is not int or offset < 0:
            raise InvalidArgument("offset must be an int >= 0")
        await asyncio.to_thread(self._groups.commit, self.group, self.shard, offset)

    def _check_open(self) -> ShardCursor:
        if self._state != "open" or self._reader is None:
            raise ClosedResourceError(f"the follower of {self.db!r} shard {self.shard} is {self._state}")
        return self._reader

    def _read_blocking(self) -> pa.Table:
        reader = self._check_open()
        batches: list[pa.RecordBatch] = []
        try:
            for frame in reader.read(_READ_BYTES):
                h = frame.header
                batch = decode_body(frame.data, 0, h)
                first = max(self.position, h.base_offset) - h.base_offset
                if self._from_time_us is not None:
                    # The first frame at/after the time may start with older records.
                    mask = pc.greater_equal(batch.column("ts").slice(first), self._from_time_us)
                    idx = int(pc.index(mask, True).as_py())
                    if idx < 0:
                        self.position = h.next_offset
                        continue
                    first += idx
                    self._from_time_us = None
                if first < h.record_count:
                    batches.append(with_offsets(batch, h.base_offset, first, h.record_count))
                self.position = h.next_offset
        except CorruptFrame as exc:
            raise StorageError(
                f"{self.db!r} shard {self.shard}: corrupt frame at offset {self.position}"
            ) from exc
        if not batches:
            return empty_read_table()
        return pa.Table.from_batches(batches, schema=READ_SCHEMA)

    async def read_available(self) -> pa.Table:
        """The records written since the last call (possibly none); never waits for more."""
        self._check_open()
        return await asyncio.to_thread(self._read_blocking)

    async def batches(self, *, stop_at_end: bool = False) -> AsyncGenerator[pa.Table, None]:
        """Yield non-empty tables in offset order; wait for new ones unless ``stop_at_end``."""
        while True:
            table = await self.read_available()
            if table.num_rows:
                yield table
            elif stop_at_end:
                return
            else:
                await asyncio.sleep(self.poll_interval_ms / 1000)

    def __aiter__(self) -> AsyncIterator[pa.Table]:
        return self.batches()

    def __repr__(self) -> str:
        return f"<Follower {self.db!r} shard {self.shard} at {self.position} {self._state}>"


def follow(
    path: str | os.PathLike[str],
    db: str,
    shard: int,
    *,
    offset: int | None = None,
    from_time_us: int | dt.datetime | None = None,
    poll_interval_ms: int = DEFAULT_POLL_INTERVAL_MS,
    group: str | None = None,
) -> Follower:
    """Follow ``shard`` of database ``db`` in the data directory ``path`` without owning it.

    Works while another process has the store open (and when none has). Takes no lock and
    writes nothing except ``group`` commits. Use as ``async with seglog.follow(...) as f: async for table in f: ...``.

    Args:
        path: The data directory.
        db: Database name.
        shard: Shard number.
        offset: First offset to deliver (default: the shard's local start).
        from_time_us: Start at the first record with ``ts >= from_time_us`` instead (µs
            since 1970, or a datetime; naive means UTC).
        poll_interval_ms: How often the files are checked for new frames while caught up.
        group: A consumer group: start at its committed offset (unless ``offset`` or
            ``from_time_us`` is given) and allow :meth:`Follower.commit`.
    """
    return Follower(
        path,
        db,
        shard,
        offset=offset,
        from_time_us=from_time_us,
        poll_interval_ms=poll_interval_ms,
        group=group,
    )
