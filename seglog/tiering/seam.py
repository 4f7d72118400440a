"""The tier seam: everything the DB layer knows about tiering.

Like Kafka's split between ``RemoteLogManager`` (the orchestration the broker calls) and
``RemoteStorageManager`` (the plugin that moves bytes), :class:`~seglog.db.Database` and
:class:`~seglog.store.Store` drive tiering only through the two protocols here:

* :class:`TierService` -- the tier of a whole store (one target): opens the
  :class:`TieredStorage` of each database and deletes a dropped database's objects;
* :class:`TieredStorage` -- the tier of one database: uploads sealed segments, reads offsets
  below the local start, and applies truncation and retention over the whole log (tier
  objects, then local segments).

The concrete classes (:mod:`seglog.tiering.orchestrator`, :mod:`seglog.tiering.service`,
the manifest and the targets) stay behind this module, so the DB layer can be changed
without them and they without it. :class:`ManifestEntry` is re-exported as the one value
type that crosses the seam: ``Database.tier_now`` returns the entries it committed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

import pyarrow as pa

from seglog.db_config import DbConfig
from seglog.engines.base import Engine, StreamBatch, StreamRead
from seglog.tiering.manifest import ManifestEntry

__all__ = [
    "DEFAULT_TIER_CACHE_BYTES",
    "ColdStats",
    "ManifestEntry",
    "Release",
    "TierService",
    "TieredStorage",
]

DEFAULT_TIER_CACHE_BYTES: Final = 256 << 20
"""Default memory a store's reads of tiered records keep (``seglog.open(tier_cache_bytes=)``):
about one 256 MiB segment's object and its decoded row groups."""

Release = Callable[[int], None]
"""Called with the bytes of local segment files a tier operation deleted (store space accounting)."""


@dataclass(frozen=True)
class ColdStats:
    """What one shard holds in the tier: committed objects and their bytes."""

    bytes: int
    objects: int


@dataclass(frozen=True)
class TierCacheStats:
    """The store's tier read cache (see ``Store.tier_cache_stats``).

    Attributes:
        downloads: Requests by reads that fetched object bytes from the tier: ranged GETs of
            a row group or footer (checked against its CRC32C), or whole objects tiered
            before ranged reads (checked against their sha256).
        row_groups_decoded: Parquet row groups decoded by reads.
        cached_bytes: Bytes kept now (fetched bytes, decoded row groups, bookkeeping).
        capacity_bytes: The most it keeps (``tier_cache_bytes``).
        downloaded_bytes: Bytes those requests fetched.
    """

    downloads: int
    row_groups_decoded: int
    cached_bytes: int
    capacity_bytes: int
    downloaded_bytes: int = 0


class TieredStorage(Protocol):
    """The tier of one database, wrapped around its (segmented) engine.

    Operations that touch both the tier and local segments are serialised among themselves
    (uploads, truncation, retention); reads are not, and retry when the local start moves
    under them. Blocking tier I/O runs in worker threads.
    """

    def logical_start(self, shard: int, local_start: int) -> int:
        """First readable offset of ``shard`` whose local log starts at ``local_start``:
        the start of the committed objects that run contiguously into it, never below the
        tier's retention floor."""

    def tiered_end(self, shard: int) -> int:
        """Offset after the last record of ``shard`` committed in the tier (0: none)."""

    async def committed_end(self, shard: int) -> int:
        """:meth:`tiered_end` as the tier holds it now: a shared manifest is read again first.

        Raises:
            TierError: The tier could not be read.
        """

    def cold_stats(self, shard: int) -> ColdStats:
        """Committed objects of ``shard`` and their bytes."""

    async def tier_now(self, config: DbConfig, release: Release) -> list[ManifestEntry]:
        """Upload every sealed, not yet committed local segment, then apply local retention
        (``config.local_retention_bytes``/``local_retention_ms``) to committed segments.

        Returns:
            The manifest entries committed by this call.

        Raises:
            TierError: The tier failed (nothing local is lost; call again later).
        """

    def follow_leads(self, leads: Callable[[], Mapping[int, int]] | None) -> None:
        """Shared tiers (a replicated database): ``leads()`` names the shards this node leads
        and their leader epochs; only those are uploaded, each up to its high watermark."""

    async def read_arrow(self, shard: int, offset: int, max_records: int) -> pa.Table:
        """Records from ``offset``: from the tier below the local start, else from the engine.

        Raises:
            OffsetOutOfRange: ``offset`` is below the logical start or past the end.
        """

    async def read_stream(
        self, shard: int, offset: int, want: StreamRead, max_records: int, max_frames: int
    ) -> StreamBatch:
        """Records of one stream from ``offset``, through the tier below the local start
        (the engine's :meth:`~seglog.engines.base.StreamEngine.read_stream` otherwise)."""

    async def offset_for_time(self, shard: int, ts: int) -> int:
        """First offset whose record has ``ts >=`` the given one, tier first; the end offset if none."""

    async def read_key(self, shard: int, key: bytes) -> pa.Table:
        """Every record of ``shard`` with ``key``, tiered ones first, in offset order."""

    async def truncate_before(self, shard: int, offset: int, release: Release) -> int:
        """Make ``offset`` the first readable offset: local segments and tier objects below it go.

        Returns:
            Bytes of local segment files removed (also passed to ``release``).

        Raises:
            OffsetOutOfRange: ``offset`` is past the end offset.
        """

    async def truncate_to(self, shard: int, offset: int, *, force: bool) -> int:
        """The engine's ``truncate_to``, refused below :meth:`tiered_end` (tiered records stay).

        Raises:
            InvalidArgument: ``offset`` is below what was tiered (or the engine's reasons).
        """

    async def enforce_retention(self, config: DbConfig, floors: list[int | None], release: Release) -> int:
        """``retention_bytes``/``retention_ms`` over each shard's whole log: tier objects, then
        local sealed segments, oldest first, never past ``floors[shard]`` (a group's commit).

        Returns:
            Bytes of local segment files removed (each shard's also passed to ``release``).
        """

    async def close(self) -> None:
        """Wait out a running upload, truncation or retention (the engine is closed apart)."""


class TierService(Protocol):
    """The tier of a store: one target shared by the store's tiered databases."""

    async def open_db(
        self, name: str, directory: Path, engine: Engine, clock_us: Callable[[], int], *, shared: bool = False
    ) -> TieredStorage:
        """Open (and recover) the tier of database ``name`` stored in ``directory``.

        Args:
            name: The database name (its prefix in the tier).
            directory: The database directory (the local manifest copy lives there).
            engine: The database's engine; it must be able to seal segments.
            clock_us: The store clock, for time-based retention.
            shared: Its shards are tiered by their leaders on several nodes
                (:meth:`TieredStorage.follow_leads`).

        Raises:
            ConfigMismatch: The engine has no segments to tier.
        """

    async def drop_db(self, name: str, directory: Path, *, shared: bool = False) -> int:
        """Delete every object and the manifest of database ``name`` from the tier.

        Returns:
            How many objects were deleted.

        Raises:
            TierError: The tier failed; call again (it is idempotent).
        """

    def cache_stats(self) -> TierCacheStats:
        """What the read cache the store's databases share holds and has done."""

    def close(self) -> None:
        """Release the target (connections); the databases' tiers must be closed first."""
