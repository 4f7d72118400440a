"""seglog: a durable, segmented message log for MQTT-style data, embedded in asyncio services."""

from __future__ import annotations

from seglog import errors
from seglog.consumer import Consumer
from seglog.db import AppendResult, Database, DbConfig, TierShardStats
from seglog.engines.base import ShardStats
from seglog.errors import (
    AppendFailed,
    ClosedResourceError,
    ConfigMismatch,
    InvalidArgument,
    InvalidRecord,
    InvalidTimestamp,
    OffsetOutOfRange,
    SeglogError,
    StorageError,
    StoreLocked,
    SubackOutOfRange,
)
from seglog.follower import Follower, follow
from seglog.iterators import Iterator, Slab, Stream
from seglog.record import Record, RecordMeta, now_us, timestamp_us
from seglog.segment.producer_state import ProducerStamp
from seglog.store import Store, open
from seglog.subscriptions import Subscription, SubscriptionBatch, SubscriptionSelector, SubscriptionStats

__version__ = "0.1.0"

__all__ = [
    "AppendFailed",
    "AppendResult",
    "ClosedResourceError",
    "ConfigMismatch",
    "Consumer",
    "Database",
    "DbConfig",
    "Follower",
    "InvalidArgument",
    "InvalidRecord",
    "InvalidTimestamp",
    "Iterator",
    "OffsetOutOfRange",
    "ProducerStamp",
    "Record",
    "RecordMeta",
    "SeglogError",
    "ShardStats",
    "Slab",
    "StorageError",
    "Store",
    "StoreLocked",
    "Stream",
    "SubackOutOfRange",
    "Subscription",
    "SubscriptionBatch",
    "SubscriptionSelector",
    "SubscriptionStats",
    "TierShardStats",
    "__version__",
    "errors",
    "follow",
    "now_us",
    "open",
    "timestamp_us",
]
