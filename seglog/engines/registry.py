"""The engines a database can name, and how the store opens one without knowing which.

``seglog.engines`` registers ``segment``, ``memory`` and ``lmdb`` when it is imported; the
DB layer (``DbConfig``, ``Store``) looks engines up here by the name a database's config
holds, so it never imports a concrete engine (DESIGN: "the DB layer never knows which
engine it drives").
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

from seglog.engines.base import Engine, EngineConfig, EngineReader, ShardFiles
from seglog.errors import InvalidArgument
from seglog.io_pool import IoPool

__all__ = [
    "EngineFactory",
    "MeasureBytes",
    "OpenBlocking",
    "OpenReader",
    "ReadShardFiles",
    "engine_names",
    "followable_engines",
    "get_engine",
    "register_engine",
    "tiering_engines",
]

OpenBlocking = Callable[[EngineConfig, IoPool, Executor], Engine]
"""Open (or create) an engine's data for one database; blocking, run off the event loop.

Every engine gets the store's shared :class:`IoPool` and read executor; one that does not
write through the pool (``memory``) ignores it.
"""

MeasureBytes = Callable[[Path], int]
"""Bytes of a database directory's data files that count against the store quota.

Runs without opening the database (the store measures at open, and after a drop) and is
blocking. Only files that shrink when data is freed may count: otherwise a store could
stay over quota after retention freed space.
"""

OpenReader = Callable[[Path, int], EngineReader]
"""Open a cross-process read-only reader of a database directory with this many shards.

Takes no lock and writes nothing, so it works beside the owning process; blocking.
"""

ReadShardFiles = Callable[[Path, int], list[ShardFiles]]
"""Every shard of a database directory with this many shards as its files show it.

Read-only and lock-free like :data:`OpenReader`, but for every engine: a database whose
data is not on disk (``memory``) shows empty shards. Blocking.
"""


@dataclass(frozen=True)
class EngineFactory:
    """How to open one kind of engine.

    Attributes:
        name: The name a database's config uses (``DbConfig.engine``).
        open_blocking: Opens the engine (see :data:`OpenBlocking`).
        measure_bytes: The quota measure of a closed database (see :data:`MeasureBytes`).
        shard_files: Offsets and file sizes of a database's shards (see :data:`ReadShardFiles`).
        open_reader: Opens a reader another process can follow the database with (see
            :data:`OpenReader`); ``None``: its data cannot be read from outside the owner.
        tiering: Whether its databases can tier (the engine is a
            :class:`~seglog.engines.base.SegmentedEngine`); the store checks this before
            opening one, the database checks the engine itself.
    """

    name: str
    open_blocking: OpenBlocking
    measure_bytes: MeasureBytes
    shard_files: ReadShardFiles
    open_reader: OpenReader | None = None
    tiering: bool = False

    def reader(self, directory: Path, shards: int) -> EngineReader:
        """A cross-process read-only reader of the database in ``directory`` (blocking).

        Raises:
            InvalidArgument: This engine's databases cannot be followed from another process.
        """
        if self.open_reader is None:
            # The directory is named after the database (the store's layout).
            raise InvalidArgument(
                f"database {directory.name!r} uses the {self.name!r} engine; only {followable_engines()} "
                "databases can be followed from another process"
            )
        return self.open_reader(directory, shards)


# Registration order is the order names are listed in (error messages name them all).
_FACTORIES: dict[str, EngineFactory] = {}


def register_engine(factory: EngineFactory) -> None:
    """Make ``factory`` available under ``factory.name``.

    Raises:
        InvalidArgument: Another factory already has that name (two engines must never
            answer to one persisted name).
    """
    existing = _FACTORIES.get(factory.name)
    if existing is not None and existing != factory:
        raise InvalidArgument(f"engine {factory.name!r} is already registered")
    _FACTORIES[factory.name] = factory


def engine_names() -> tuple[str, ...]:
    """Names of the registered engines, in registration order."""
    return tuple(_FACTORIES)


def tiering_engines() -> str:
    """The names of the engines that can tier, for messages: ``'segment'`` (or ``'a' or 'b'``)."""
    return " or ".join(repr(f.name) for f in _FACTORIES.values() if f.tiering)


def followable_engines() -> str:
    """The names of the engines another process can follow, for messages (like :func:`tiering_engines`)."""
    return " or ".join(repr(f.name) for f in _FACTORIES.values() if f.open_reader is not None)


def get_engine(name: object) -> EngineFactory:
    """The factory registered as ``name``.

    ``name`` may be anything a persisted config held (validation calls this), so a value
    that is not even a string is "unknown", not a ``TypeError``.

    Raises:
        InvalidArgument: No engine has that name.
    """
    factory = _FACTORIES.get(name) if isinstance(name, str) else None
    if factory is None:
        raise InvalidArgument(f"unknown engine {name!r} (known: {', '.join(map(repr, _FACTORIES))})")
    return factory
