"""The store: a data directory holding databases, the I/O pool and the process lock."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import json
import logging
import os
import shutil
import uuid
from collections.abc import Awaitable, Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from enum import Enum
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from seglog._fs import atomic_write, boot_id, fsync_dir
from seglog._memory import ThpPolicy, apply_thp_policy
from seglog.db import Database
from seglog.db_config import DbConfig, validate_db_name
from seglog.engines.base import Engine, EngineConfig, FsyncPolicy
from seglog.engines.registry import EngineFactory, get_engine, tiering_engines
from seglog.errors import (
    ClosedResourceError,
    ConfigMismatch,
    CorruptCheckpoint,
    DatabaseExists,
    DatabaseNotFound,
    InvalidArgument,
    QuotaExceeded,
    StorageError,
    StoreLocked,
)
from seglog.groups import GroupStore
from seglog.io_pool import DEFAULT_IO_WORKERS, IoPool
from seglog.record import COMPRESSION_NONE, COMPRESSION_ZSTD, now_us
from seglog.store_config import (
    DEFAULT_BUFFER_MS,
    DEFAULT_JOURNAL_BYTES,
    DEFAULT_RETENTION_INTERVAL_MS,
    DEFAULT_TIER_CACHE_BYTES,
    StoreConfig,
)
from seglog.tiering import open_tier_service
from seglog.tiering.seam import TierCacheStats, TieredStorage, TierService

__all__ = ["Shutdown", "Store", "open"]

log = logging.getLogger("seglog.store")

STORE_FORMAT: Final = 1
_LOCK_FILE: Final = "LOCK"
_RUNNING_FILE: Final = "RUNNING"
_PRODUCER_IDS_FILE: Final = "producer-ids"  # the next producer id, decimal
STORE_FILE: Final = "seglog.json"
DBS_DIR: Final = "dbs"
DB_CONFIG_FILE: Final = "config.json"
# A database's random 64-bit id (16 hex digits): stream iterators carry it, so one of another
# database, or of a dropped database recreated under the same name, is refused.
DB_ID_FILE: Final = "id"
_READ_THREADS: Final = 4
# Data directories open in this process: LMDB allows one handle per environment per process.
_OPEN_HERE: set[Path] = set()


def is_open_in_this_process(path: str | os.PathLike[str]) -> bool:
    """Whether a :class:`Store` of this process has the data directory ``path`` open."""
    return Path(path).absolute() in _OPEN_HERE


async def _every(interval_s: float, job: Callable[[], Awaitable[object]]) -> None:
    """Run ``job`` every ``interval_s`` seconds until cancelled (the store's background work).

    The jobs (:meth:`Store.enforce_retention`, :meth:`Store.tier_now`) log each database's
    failure themselves and never raise, so one failure does not end them.
    """
    while True:
        await asyncio.sleep(interval_s)
        await job()


def db_id(directory: Path) -> int:
    """The database's id (see :data:`DB_ID_FILE`), created on first use (blocking).

    Raises:
        StorageError: The id file is unreadable or cannot be written.
    """
    path = directory / DB_ID_FILE
    try:
        return int(path.read_text().strip(), 16)
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as exc:
        raise StorageError(f"unreadable database id {path}") from exc
    value = int.from_bytes(os.urandom(8), "big")
    try:
        atomic_write(path, f"{value:016x}\n".encode())
    except OSError as exc:
        raise StorageError(f"cannot write database id {path}") from exc
    return value


def db_directory(data_dir: Path, name: str) -> Path:
    """Directory of database ``name`` in the data directory ``data_dir``."""
    return data_dir / DBS_DIR / name


def read_db_config(data_dir: Path, name: str) -> DbConfig:
    """The persisted config of database ``name`` (blocking; no lock needed).

    Raises:
        DatabaseNotFound: No such database.
        StorageError: The config cannot be read.
    """
    try:
        return DbConfig.from_json(json.loads((db_directory(data_dir, name) / DB_CONFIG_FILE).read_text()))
    except FileNotFoundError:
        raise DatabaseNotFound(f"database {name!r} does not exist in {data_dir}") from None
    except (OSError, ValueError) as exc:
        raise StorageError(f"cannot read the config of database {name!r}") from exc


def _measured_engine(directory: Path) -> EngineFactory:
    """The engine whose files the database ``directory`` holds, for the quota measure.

    Read from the config without validating it. A directory whose config cannot be read (a
    crashed create, a corrupt config) is measured as the default engine's: whatever it
    holds still takes space, and that is how such a directory was always counted.
    """
    name: object = DbConfig.engine
    with contextlib.suppress(OSError, ValueError):
        data = json.loads((directory / DB_CONFIG_FILE).read_text())
        if isinstance(data, dict):
            name = data.get("engine", name)
    try:
        return get_engine(name)
    except InvalidArgument:  # a name this version does not know
        return get_engine(DbConfig.engine)


class _StoreQuota:
    """The store's soft quota as a database's appends see it."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def admit(self, nbytes: int) -> None:
        self._store._admit(nbytes)

    def release(self, nbytes: int) -> None:
        self._store._freed(nbytes)


class Shutdown(Enum):
    """How the previous owner of a data directory stopped."""

    # close() ran (or the directory is new).
    CLEAN = "clean"
    # The process died (SIGKILL, crash): the page cache survived, fsync'd or not.
    PROCESS_CRASH = "process_crash"
    # The machine restarted while it was open: writes that were not fsync'd may be gone.
    MACHINE_RESTART = "machine_restart"


class Store:
    """An open data directory. Use ``async with seglog.open(path) as store`` (or ``await``)."""

    def __init__(self, path: str | os.PathLike[str], config: StoreConfig | None = None) -> None:
        """A store for ``path``, not yet opened (``await`` it or use ``async with``).

        Args:
            path: The data directory.
            config: The store options (validated when built); ``None``: every default.
        """
        config = StoreConfig() if config is None else config
        self.config = config
        # The options stay readable as attributes, as they always were.
        self.buffer_ms = config.buffer_ms
        self.journal_bytes = config.journal_bytes
        self.thp: ThpPolicy = config.thp
        self.thp_disabled = False  # whether THP is off for the process once open (see open(thp=))
        self.path = Path(path).absolute()
        self.fsync: FsyncPolicy = config.fsync
        self.fsync_interval_ms = config.fsync_interval_ms
        self.io_workers = config.io_workers
        self._flush_interval_ms = config.flush_interval_ms
        self._max_items = config.max_items
        self.clock_us = config.clock_us or now_us
        self._state = "new"
        # How the previous owner of the directory stopped (known once open).
        self.last_shutdown = Shutdown.CLEAN
        self._lock_fd = -1
        self._dbs: dict[str, Database] = {}
        self._db_lock = asyncio.Lock()
        self._producer_id_lock = asyncio.Lock()
        self._io_pool: IoPool | None = None
        self._executor: ThreadPoolExecutor | None = None
        self.quota_bytes = config.quota_bytes
        self.used_bytes = 0
        self.retention_interval_ms = config.retention_interval_ms
        self._retention_task: asyncio.Task[None] | None = None
        self.tier = config.tier
        self._s3 = (config.s3_endpoint, config.s3_access_key, config.s3_secret_key, config.s3_region)
        self.tier_interval_ms = config.tier_interval_ms
        self._tier_cache_bytes = config.tier_cache_bytes
        self.tier_shared = config.tier_shared
        self._tier_service: TierService | None = None
        self._tier_task: asyncio.Task[None] | None = None

    # --- lifecycle ---------------------------------------------------------------------

    def __await__(self) -> Generator[Any, None, Store]:
        return self._open().__await__()

    async def __aenter__(self) -> Store:
        return await self._open()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def _open(self) -> Store:
        if self._state != "new":
            raise ClosedResourceError(f"store at {self.path} was already opened")
        self._state = "opening"
        if self.tier is not None:
            uri = self.tier
            try:
                endpoint, access_key, secret_key, region = self._s3
                self._tier_service = await open_tier_service(
                    uri,
                    s3_endpoint=endpoint,
                    access_key=access_key,
                    secret_key=secret_key,
                    region=region,
                    cache_bytes=self._tier_cache_bytes,
                )
            except BaseException:
                self._state = "closed"
                raise
        await asyncio.to_thread(self._open_blocking)
        self.thp_disabled = await asyncio.to_thread(apply_thp_policy, self.thp)
        self._io_pool = IoPool(
            self.io_workers, max_items=self._max_items, flush_interval_ms=self._flush_interval_ms
        )
        self._executor = ThreadPoolExecutor(_READ_THREADS, thread_name_prefix="seglog-read")
        self.used_bytes = await asyncio.to_thread(self._measure_blocking)
        self._state = "open"
        if self.retention_interval_ms is not None:
            self._retention_task = asyncio.create_task(
                _every(self.retention_interval_ms / 1000, self.enforce_retention)
            )
        if self.tier_interval_ms is not None:
            self._tier_task = asyncio.create_task(_every(self.tier_interval_ms / 1000, self.tier_now))
        return self

    # --- tiering -------------------------------------------------------------------------

    def tier_cache_stats(self) -> TierCacheStats | None:
        """The tier read cache's downloads, decodes and bytes held (``None``: no tier)."""
        return None if self._tier_service is None else self._tier_service.cache_stats()

    async def tier_now(self) -> int:
        """Run ``tier_now`` on every open tiered database; failures are logged, not raised.

        Returns:
            How many segments were committed.
        """
        count = 0
        for db in list(self._dbs.values()):
            if not db.tiered:
                continue
            try:
                count += len(await db.tier_now())
            except Exception:
                log.exception("tiering database %r failed; retrying next time", db.name)
        return count

    # --- retention and space -------------------------------------------------------------

    async def enforce_retention(self) -> int:
        """Run retention on every open database now; failures are logged, not raised (as
        :meth:`tier_now`): one database's failure neither skips the others nor ends the
        periodic run.

        Returns:
            The bytes freed.
        """
        freed = 0
        for db in list(self._dbs.values()):
            try:
                freed += await db.enforce_retention()
            except Exception:
                log.exception("retention of database %r failed; retrying next time", db.name)
        return freed

    def _measure_blocking(self) -> int:
        """Data bytes of every database, as its engine measures them without opening it.

        Engines count only files that shrink when data is freed (the segment engine its
        segment files, not its LMDB indexes; groups are never counted).
        """
        total = 0
        try:
            entries = list(os.scandir(self.path / DBS_DIR))
        except OSError:
            return 0
        for entry in entries:
            with contextlib.suppress(OSError):  # removed while measuring
                if entry.is_dir(follow_symlinks=False):
                    directory = Path(entry.path)
                    total += _measured_engine(directory).measure_bytes(directory)
        return total

    async def _remeasure(self) -> None:
        self.used_bytes = await asyncio.to_thread(self._measure_blocking)

    def _admit(self, nbytes: int) -> None:
        quota = self.quota_bytes
        if quota is not None and self.used_bytes + nbytes > quota:
            raise QuotaExceeded(
                f"append of {nbytes} bytes would exceed the quota ({self.used_bytes} of {quota} bytes used)"
            )
        self.used_bytes += nbytes

    def _freed(self, nbytes: int) -> None:
        self.used_bytes = max(0, self.used_bytes - nbytes)

    def _open_blocking(self) -> None:
        if self.path in _OPEN_HERE:
            self._state = "closed"
            raise StoreLocked(f"{self.path} is already open in this process (share that Store)")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path / _LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            self._state = "closed"
            raise StorageError(f"cannot open data directory {self.path}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            self._state = "closed"
            raise StoreLocked(f"{self.path} is open in another process") from None
        self._lock_fd = fd
        _OPEN_HERE.add(self.path)
        try:
            self._prepare_directory()
        except BaseException:
            self._release_lock()
            self._state = "closed"
            raise

    def _prepare_directory(self) -> None:
        """Check the store file, clear leftovers, record this run (lock held)."""
        store_file = self.path / STORE_FILE
        try:
            if store_file.exists():
                try:
                    meta = json.loads(store_file.read_text())
                except (ValueError, UnicodeDecodeError) as exc:
                    raise StorageError(
                        f'{store_file} is corrupt; it should hold {{"format": {STORE_FORMAT}}}'
                    ) from exc
                if not isinstance(meta, dict) or meta.get("format") != STORE_FORMAT:
                    found = meta.get("format") if isinstance(meta, dict) else meta
                    raise StorageError(f"{self.path}: unknown store format {found!r}")
            else:
                (self.path / DBS_DIR).mkdir(exist_ok=True)
                fsync_dir(self.path)
                atomic_write(store_file, json.dumps({"format": STORE_FORMAT}).encode())
            stale = list((self.path / DBS_DIR).glob(".*.dropped-*"))
            for tomb in stale:
                shutil.rmtree(tomb, ignore_errors=True)  # a drop_db interrupted by a crash
            if stale:
                fsync_dir(self.path / DBS_DIR)
            running = self.path / _RUNNING_FILE
            boot = boot_id()
            if running.exists():
                # Indexes torn by a machine restart are found and rebuilt per index
                # (seglog.index.shard_index); this is only the log line.
                previous = running.read_text().strip()
                if previous != boot:
                    self.last_shutdown = Shutdown.MACHINE_RESTART
                    log.warning("%s was open when the machine restarted; recovering", self.path)
                else:
                    self.last_shutdown = Shutdown.PROCESS_CRASH
                    log.warning("%s was not closed cleanly (process crash); recovering", self.path)
            atomic_write(running, boot.encode())
        except OSError as exc:
            raise StorageError(f"cannot prepare data directory {self.path}") from exc

    async def close(self) -> None:
        """Drain writes, close every database and release the directory; idempotent."""
        if self._state in ("closed", "new"):
            self._state = "closed"
            return
        self._state = "closing"
        for task in (self._retention_task, self._tier_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._retention_task = self._tier_task = None
        try:
            if self._io_pool is not None:
                await asyncio.to_thread(self._io_pool.close)
            for db in list(self._dbs.values()):
                await db.close()
            self._dbs.clear()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
            if self._tier_service is not None:
                self._tier_service.close()
            await asyncio.to_thread(self._release)
            self._state = "closed"

    def _release(self) -> None:
        try:
            (self.path / _RUNNING_FILE).unlink(missing_ok=True)
            fsync_dir(self.path)
        except OSError as exc:
            raise StorageError(f"cannot mark {self.path} closed") from exc
        finally:
            self._release_lock()

    def _release_lock(self) -> None:
        if self._lock_fd >= 0:
            _OPEN_HERE.discard(self.path)
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _check_open(self) -> None:
        if self._state != "open":
            raise ClosedResourceError(f"store at {self.path} is {self._state}")

    # --- databases ---------------------------------------------------------------------

    async def allocate_producer_id(self) -> int:
        """A producer id no earlier call on this data directory returned (persisted before it
        is returned, so a restart never hands it out again)."""
        self._check_open()
        loop = asyncio.get_running_loop()
        async with self._producer_id_lock:
            return await loop.run_in_executor(self._executor, self._allocate_producer_id_blocking)

    def _allocate_producer_id_blocking(self) -> int:
        path = self.path / _PRODUCER_IDS_FILE
        try:
            current = int(path.read_bytes().decode("ascii").strip() or "0")
        except FileNotFoundError:
            current = 0
        except (UnicodeDecodeError, ValueError) as exc:
            raise CorruptCheckpoint(f"{path}: not a producer id counter") from exc
        atomic_write(path, b"%d\n" % (current + 1))
        return current

    def _db_dir(self, name: str) -> Path:
        return db_directory(self.path, name)

    def list_dbs(self) -> list[str]:
        """Names of the databases in the store, sorted."""
        self._check_open()
        root = self.path / DBS_DIR
        return sorted(p.name for p in root.iterdir() if (p / DB_CONFIG_FILE).is_file())

    async def create_db(
        self,
        name: str,
        shards: int | None = None,
        *,
        exist_ok: bool = False,
        **settings: Any,
    ) -> Database:
        """Create a database, or open it when it exists and ``exist_ok`` is true.

        Args:
            name: 1-128 characters of ``[A-Za-z0-9_.-]``.
            shards: Number of shards (default 1; immutable).
            exist_ok: Open an existing database instead of raising :class:`DatabaseExists`.
            **settings: ``engine``, ``segment_bytes``, ``segment_ms``, ``compression``,
                ``max_record_bytes``, ``index_interval_bytes``, ``retention_bytes``,
                ``retention_ms``, ``retention_overrides_groups``, ``min_ts_us``,
                ``max_ts_us`` (see :class:`~seglog.DbConfig`). ``engine`` (immutable) is
                ``"segment"`` (default: segment files + LMDB indexes), ``"memory"`` (frames
                in RAM; nothing survives a close) or ``"lmdb"`` (frames in one LMDB
                environment under ``<db>/frames/``); see :mod:`seglog.engines`.

        Raises:
            ConfigMismatch: The database exists with different immutable settings.
            StorageError: Its directory could not be made (e.g. a file holds its path).
        """
        self._check_open()
        validate_db_name(name)
        requested = dict(settings)
        if shards is not None:
            requested["shards"] = shards
        known = set(DbConfig.__dataclass_fields__)
        unknown = set(requested) - known
        if unknown:
            raise InvalidArgument(f"unknown database settings: {sorted(unknown)}")
        async with self._db_lock:
            directory = self._db_dir(name)
            if (directory / DB_CONFIG_FILE).is_file():
                if not exist_ok:
                    raise DatabaseExists(f"database {name!r} already exists")
                config = await asyncio.to_thread(self._read_config, name)
                config.check_compatible(requested)
                return await self._open_db_locked(name, config)
            config = DbConfig(**requested).validate()
            self._check_tier_engine(name, config)
            try:
                await asyncio.to_thread(self._create_blocking, name, config)
            except OSError as exc:
                raise StorageError(f"cannot create database {name!r} in {directory.parent}") from exc
            return await self._open_db_locked(name, config)

    def _create_blocking(self, name: str, config: DbConfig) -> None:
        final = self._db_dir(name)
        staging = final.with_name(f".{name}.creating")
        shutil.rmtree(staging, ignore_errors=True)
        if final.exists():  # a crashed earlier create that never got its config
            shutil.rmtree(final)
        try:
            staging.mkdir(parents=True)
            atomic_write(staging / DB_CONFIG_FILE, json.dumps(config.to_json(), indent=2).encode())
            db_id(staging)
            os.replace(staging, final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        fsync_dir(final.parent)

    def _write_config(self, name: str, config: DbConfig) -> None:
        try:
            atomic_write(self._db_dir(name) / DB_CONFIG_FILE, json.dumps(config.to_json(), indent=2).encode())
        except OSError as exc:
            raise StorageError(f"cannot write the config of database {name!r}") from exc

    def _read_config(self, name: str) -> DbConfig:
        return read_db_config(self.path, name)

    async def open_db(self, name: str) -> Database:
        """Open an existing database (the same :class:`Database` object on every call while
        the store is open); ``create_db(name, exist_ok=True)`` also creates it.

        Raises:
            DatabaseNotFound: No database of that name.
        """
        self._check_open()
        validate_db_name(name)
        db = self._dbs.get(name)
        if db is not None:
            return db  # open already: no config read (a cluster node asks per fetched shard)
        async with self._db_lock:
            config = await asyncio.to_thread(self._read_config, name)
            return await self._open_db_locked(name, config)

    def _check_tier_engine(self, name: str, config: DbConfig) -> None:
        if self._tier_service is not None and not get_engine(config.engine).tiering:
            raise ConfigMismatch(
                f"database {name!r} uses the {config.engine!r} engine: tiering (tier=...) needs {tiering_engines()}"
            )

    async def _open_db_locked(self, name: str, config: DbConfig) -> Database:
        db = self._dbs.get(name)
        if db is not None:
            return db
        self._check_tier_engine(name, config)
        assert self._io_pool is not None and self._executor is not None
        engine_config = EngineConfig(
            directory=self._db_dir(name),
            shards=config.shards,
            segment_bytes=config.segment_bytes,
            segment_ms=config.segment_ms,
            compression=COMPRESSION_ZSTD if config.compression == "zstd" else COMPRESSION_NONE,
            index_interval_bytes=config.index_interval_bytes,
            max_record_bytes=config.max_record_bytes,
            fsync=self.fsync,
            fsync_interval_ms=self.fsync_interval_ms,
            journal_bytes=self.journal_bytes,
            buffer_ms=self.buffer_ms,
            clock_us=self.clock_us,
            lts_thresholds=config.lts_thresholds,
        )
        factory = get_engine(config.engine)
        engine: Engine = await asyncio.to_thread(
            factory.open_blocking, engine_config, self._io_pool, self._executor
        )
        tier: TieredStorage | None = None
        try:
            uid = await asyncio.to_thread(db_id, self._db_dir(name))
            groups = await asyncio.to_thread(GroupStore, self._db_dir(name))
            if self._tier_service is not None:
                tier = await self._tier_service.open_db(
                    name, self._db_dir(name), engine, self.clock_us, shared=self.tier_shared
                )
        except BaseException:
            await engine.close()
            raise
        db = Database(
            name,
            config,
            engine,
            groups=groups,
            clock_us=self.clock_us,
            persist_config=functools.partial(self._write_config, name),
            quota=_StoreQuota(self),
            tier=tier,
            uid=uid,
        )
        self._dbs[name] = db
        return db

    async def drop_db(self, name: str) -> None:
        """Delete a database and all its data durably; its open handle is closed first.

        The directory is renamed to a tombstone (durable: directory fsync), then removed; a
        crash in between leaves a tombstone that the next open removes.

        With a tier, the database's objects and manifest are deleted from the tier first.

        Raises:
            DatabaseNotFound: No database of that name.
            TierError: The tier could not be cleaned; nothing local was dropped (call again).
        """
        self._check_open()
        validate_db_name(name)
        async with self._db_lock:
            if not (self._db_dir(name) / DB_CONFIG_FILE).is_file():
                raise DatabaseNotFound(f"database {name!r} does not exist")
            db = self._dbs.pop(name, None)
            if db is not None:
                await db.close()  # also waits out a running tier_now
            if self._tier_service is not None:
                # Tier first: a database created later under this name must not find these
                # objects. If the tier is down this raises and nothing local is touched.
                config = await asyncio.to_thread(self._read_config, name)
                if get_engine(config.engine).tiering:
                    await self._tier_service.drop_db(name, self._db_dir(name), shared=self.tier_shared)
            await asyncio.to_thread(self._drop_blocking, name)
        await self._remeasure()

    def _drop_blocking(self, name: str) -> None:
        directory = self._db_dir(name)
        tomb = directory.with_name(f".{name}.dropped-{uuid.uuid4().hex}")
        try:
            os.replace(directory, tomb)
            fsync_dir(directory.parent)
            shutil.rmtree(tomb)
        except OSError as exc:
            raise StorageError(f"cannot drop database {name!r}") from exc

    def __repr__(self) -> str:
        return f"<Store {str(self.path)!r} {self._state}>"


def open(
    path: str | os.PathLike[str],
    *,
    fsync: FsyncPolicy = "always",
    fsync_interval_ms: int = 1000,
    io_workers: int = DEFAULT_IO_WORKERS,
    flush_interval_ms: float = 0.0,
    max_items: int = 1024,
    clock_us: Callable[[], int] | None = None,
    quota_bytes: int | None = None,
    retention_interval_ms: int | None = DEFAULT_RETENTION_INTERVAL_MS,
    tier: str | None = None,
    s3_endpoint: str | None = None,
    s3_access_key: str | None = None,
    s3_secret_key: str | None = None,
    s3_region: str | None = None,
    tier_interval_ms: int | None = None,
    tier_cache_bytes: int = DEFAULT_TIER_CACHE_BYTES,
    tier_shared: bool = False,
    buffer_ms: int = DEFAULT_BUFFER_MS,
    journal_bytes: int = DEFAULT_JOURNAL_BYTES,
    thp: ThpPolicy = "disable",
) -> Store:
    """Open (creating if needed) the store at ``path``; use with ``async with`` or ``await``.

    Args:
        path: The data directory.
        fsync: ``"always"`` (default): a write is acknowledged after ``fdatasync``; survives
            power loss. ``"interval"``: acknowledged after ``write``; synced at most every
            ``fsync_interval_ms`` (and when idle): a power loss can lose that much
            acknowledged data, a process crash loses nothing. ``"never"``: synced only when a
            segment is sealed and at close: a power loss can lose any acknowledged write
            since then; a process crash loses nothing.
        fsync_interval_ms: The ``"interval"`` period.
        io_workers: I/O threads; shard ``n`` is written by worker ``n % io_workers``.
        flush_interval_ms: How long a worker waits to grow a group commit (0: no wait).
        max_items: Most requests one group commit takes.
        clock_us: Time source in µs (injectable for tests).
        quota_bytes: Soft cap on the bytes of every database's files (segments, indexes,
            groups; see below). An append that would pass it raises :class:`~seglog.errors.QuotaExceeded`
            before anything is written; reads, retention, ``truncate_before`` and
            ``drop_db`` keep working so space can be freed. Only segment files count: the
            LMDB index and group files are excluded because they never shrink.
        retention_interval_ms: How often retention runs on open databases (``None``: only
            when :meth:`Store.enforce_retention` or ``Database.enforce_retention`` is called).
        tier: Where sealed segments of ``segment``-engine databases are tiered as Parquet:
            ``file:///abs/dir`` or ``s3://bucket[/prefix]`` (objects under
            ``<root>/<db>/shard=<n>/``). Opening a ``memory``/``lmdb`` database in such a
            store raises :class:`~seglog.errors.ConfigMismatch`. Each tiered database runs
            manifest recovery when opened; see ``Database.tier_now``.
        s3_endpoint, s3_access_key, s3_secret_key, s3_region: S3/MinIO connection (defaults:
            the usual ``AWS_*`` environment / boto3 chain).
        tier_interval_ms: How often every open tiered database runs ``tier_now`` in the
            background (``None``: only when called). Failures are logged and retried.
        tier_cache_bytes: Memory the store's reads of tiered records may keep (verified
            objects and decoded row groups, least recently used out first): a reader going
            through a tiered segment downloads its object once, not once per call. 0 keeps
            nothing (every read below the local start downloads its object again).
        tier_shared: Other stores (the nodes of a cluster) tier into the same databases:
            each shard is uploaded only by the store that leads it
            (``Database.tier_leads``), and every manifest save is a conditional put merged
            with theirs. ``seglog serve --tier --etcd`` sets it.
        buffer_ms: ``segment`` engine: how long rows of an append that reached several
            shards of one I/O worker may wait (durable in the worker's journal, readable in
            this process) before they are written into their shards' segments, where
            followers in other processes see them. An idle worker writes them at once.
        journal_bytes: ``segment`` engine: size of each I/O worker's journal per database;
            when full, every segment is synced and the journal is reused (a checkpoint).
        thp: Transparent huge pages for this process (Linux): ``"disable"`` (default) turns
            them off when the kernel has them, ``"keep"`` leaves them as they are. Off means 4
            KiB pages for new faults of the whole process (``prctl(PR_SET_THP_DISABLE)``, as
            Redis's ``disable-thp``): with huge pages, every buffer PyArrow's allocator takes
            again costs the kernel a 2 MiB zero-fill (see the README's Performance notes). It
            is never turned back on.
    """
    return Store(
        path,
        StoreConfig(
            fsync=fsync,
            fsync_interval_ms=fsync_interval_ms,
            io_workers=io_workers,
            flush_interval_ms=flush_interval_ms,
            max_items=max_items,
            clock_us=clock_us,
            quota_bytes=quota_bytes,
            retention_interval_ms=retention_interval_ms,
            tier=tier,
            s3_endpoint=s3_endpoint,
            s3_access_key=s3_access_key,
            s3_secret_key=s3_secret_key,
            s3_region=s3_region,
            tier_interval_ms=tier_interval_ms,
            tier_cache_bytes=tier_cache_bytes,
            tier_shared=tier_shared,
            buffer_ms=buffer_ms,
            journal_bytes=journal_bytes,
            thp=thp,
        ),
    )
