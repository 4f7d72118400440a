"""The options a :class:`~seglog.Store` is opened with, as one validated value.

``seglog.open(path, **options)`` builds a :class:`StoreConfig` from its keywords; the store
keeps it whole instead of threading each option through its constructor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from seglog._memory import ThpPolicy
from seglog.engines.base import FsyncPolicy
from seglog.engines.segment_writer import DEFAULT_BUFFER_MS
from seglog.errors import InvalidArgument
from seglog.io_pool import DEFAULT_IO_WORKERS
from seglog.segment.journal import DEFAULT_JOURNAL_BYTES
from seglog.tiering.seam import DEFAULT_TIER_CACHE_BYTES

# The segment engine's defaults are re-exported for ``seglog.open``'s signature.
__all__ = [
    "DEFAULT_BUFFER_MS",
    "DEFAULT_JOURNAL_BYTES",
    "DEFAULT_RETENTION_INTERVAL_MS",
    "DEFAULT_TIER_CACHE_BYTES",
    "StoreConfig",
]

DEFAULT_RETENTION_INTERVAL_MS: Final = 300_000


@dataclass(frozen=True, kw_only=True)
class StoreConfig:
    """Store options, checked when built (see :func:`seglog.open` for each one's meaning).

    Raises:
        InvalidArgument: An option is out of its domain (the first one found, in the order
            the store always checked them).
    """

    fsync: FsyncPolicy = "always"
    fsync_interval_ms: int = 1000
    io_workers: int = DEFAULT_IO_WORKERS
    flush_interval_ms: float = 0.0
    max_items: int = 1024
    clock_us: Callable[[], int] | None = None
    quota_bytes: int | None = None
    retention_interval_ms: int | None = DEFAULT_RETENTION_INTERVAL_MS
    tier: str | None = None
    s3_endpoint: str | None = None
    s3_access_key: str | None = None
    s3_secret_key: str | None = None
    s3_region: str | None = None
    tier_interval_ms: int | None = None
    tier_cache_bytes: int = DEFAULT_TIER_CACHE_BYTES
    tier_shared: bool = False
    buffer_ms: int = DEFAULT_BUFFER_MS
    journal_bytes: int = DEFAULT_JOURNAL_BYTES
    thp: ThpPolicy = "disable"

    def __post_init__(self) -> None:
        # ``type(x) is not int`` rather than isinstance: a bool is not a duration or a size.
        if type(self.buffer_ms) is not int or self.buffer_ms < 1:
            raise InvalidArgument("buffer_ms must be an int >= 1")
        if type(self.journal_bytes) is not int or self.journal_bytes < (1 << 20):
            raise InvalidArgument("journal_bytes must be an int >= 1 MiB (1048576)")
        if self.tier is not None and not isinstance(self.tier, str):
            raise InvalidArgument("tier must be None or a 'file:///abs/dir' or 's3://bucket/prefix' URI")
        if self.tier_interval_ms is not None and (
            type(self.tier_interval_ms) is not int or self.tier_interval_ms < 1
        ):
            raise InvalidArgument("tier_interval_ms must be None or an int >= 1")
        if self.tier is None and self.tier_interval_ms is not None:
            raise InvalidArgument("tier_interval_ms needs tier=...")
        if type(self.tier_cache_bytes) is not int or self.tier_cache_bytes < 0:
            raise InvalidArgument("tier_cache_bytes must be an int >= 0")
        if not isinstance(self.tier_shared, bool):
            raise InvalidArgument("tier_shared must be True or False")
        if self.quota_bytes is not None and (type(self.quota_bytes) is not int or self.quota_bytes < 0):
            raise InvalidArgument("quota_bytes must be None or an int >= 0")
        if self.retention_interval_ms is not None and (
            type(self.retention_interval_ms) is not int or self.retention_interval_ms < 1
        ):
            raise InvalidArgument("retention_interval_ms must be None or an int >= 1")
        if self.fsync not in ("always", "interval", "never"):
            raise InvalidArgument("fsync must be 'always', 'interval' or 'never'")
        if type(self.fsync_interval_ms) is not int or self.fsync_interval_ms < 1:
            raise InvalidArgument("fsync_interval_ms must be an int >= 1")
        if type(self.io_workers) is not int or self.io_workers < 1:
            raise InvalidArgument("io_workers must be an int >= 1")
        if self.thp not in ("disable", "keep"):
            raise InvalidArgument("thp must be 'disable' or 'keep'")
