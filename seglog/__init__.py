"""seglog: a durable, replicated, segmented message log for MQTT-style data."""

from __future__ import annotations

from seglog import errors
from seglog.db import AppendResult, Database, DbConfig
from seglog.errors import (
    AppendFailed,
    ClosedResourceError,
    ConfigMismatch,
    InvalidRecord,
    OffsetOutOfRange,
    SeglogError,
    StorageError,
    StoreLocked,
)
from seglog.follower import Follower, follow
from seglog.record import Record, RecordMeta
from seglog.store import Store, open

__version__ = "0.1.0"

__all__ = [
    "AppendFailed",
    "AppendResult",
    "ClosedResourceError",
    "ConfigMismatch",
    "Database",
    "DbConfig",
    "Follower",
    "InvalidRecord",
    "OffsetOutOfRange",
    "Record",
    "RecordMeta",
    "SeglogError",
    "StorageError",
    "Store",
    "StoreLocked",
    "__version__",
    "errors",
    "follow",
    "open",
]
