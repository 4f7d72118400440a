"""The tier of a store: its target, and the factory the store calls (:func:`open_tier_service`).

The store knows the tier only as a URI plus S3 credentials; this module turns them into a
:class:`~seglog.tiering.seam.TierService` that builds each database's
:class:`~seglog.tiering.orchestrator.TierOrchestrator`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from pathlib import Path

from seglog.engines.base import Engine, SegmentedEngine
from seglog.errors import ConfigMismatch
from seglog.tiering.db_tier import DbTier
from seglog.tiering.orchestrator import TierOrchestrator
from seglog.tiering.read_cache import DEFAULT_TIER_CACHE_BYTES, TierReadCache
from seglog.tiering.seam import TierCacheStats, TieredStorage, TierService
from seglog.tiering.targets import TierTarget, open_target

__all__ = ["TargetTierService", "open_tier_service"]

log = logging.getLogger("seglog.tiering")


class TargetTierService:
    """A :class:`~seglog.tiering.seam.TierService` over one :class:`TierTarget`.

    Args:
        target: Where every database of the store tiers (each under its own prefix).
        cache_bytes: Capacity of the read cache the store's databases share.
    """

    def __init__(self, target: TierTarget, cache_bytes: int = DEFAULT_TIER_CACHE_BYTES) -> None:
        self.target = target
        self.cache = TierReadCache(cache_bytes)

    async def open_db(
        self, name: str, directory: Path, engine: Engine, clock_us: Callable[[], int], *, shared: bool = False
    ) -> TieredStorage:
        """Open (and recover) the tier of database ``name`` stored in ``directory``.

        If the tier is unreachable, the database opens on its local manifest copy and the
        first upload retries recovery (see :meth:`DbTier.open_blocking`).

        Raises:
            ConfigMismatch: The engine has no segments to tier.
        """
        if not isinstance(engine, SegmentedEngine):
            raise ConfigMismatch(f"database {name!r}: tiering needs an engine with segments")
        tier = await asyncio.to_thread(
            functools.partial(DbTier.open_blocking, self.target, name, directory, self.cache, shared=shared)
        )
        return TierOrchestrator(tier, engine, clock_us)

    async def drop_db(self, name: str, directory: Path, *, shared: bool = False) -> int:
        """Delete every object and the manifest of database ``name`` from the tier.

        Returns:
            How many objects were deleted.

        Raises:
            TierError: The tier failed; call again (it is idempotent).
        """
        return await asyncio.to_thread(self._drop_blocking, name, directory, shared)

    def _drop_blocking(self, name: str, directory: Path, shared: bool) -> int:
        tier = DbTier(self.target, name, directory, shared=shared)
        tier.recover()  # the newest manifest; raises TierError when the tier is down
        count = tier.drop_all()
        log.info("dropped %d tier objects of database %r", count, name)
        return count

    def cache_stats(self) -> TierCacheStats:
        """The read cache's counters (see :class:`~seglog.tiering.seam.TierCacheStats`)."""
        return self.cache.stats()

    def close(self) -> None:
        """Release the target (connections)."""
        self.target.close()


async def open_tier_service(
    uri: str,
    *,
    s3_endpoint: str | None = None,
    access_key: str | None = None,
    secret_key: str | None = None,
    region: str | None = None,
    cache_bytes: int = DEFAULT_TIER_CACHE_BYTES,
) -> TierService:
    """Open the tier at ``uri`` for a store (the target is opened in a worker thread).

    Args:
        uri: ``file:///abs/dir`` or ``s3://bucket[/prefix]`` (see
            :func:`~seglog.tiering.targets.open_target`).
        s3_endpoint: e.g. ``http://127.0.0.1:9000`` for MinIO; default: the environment, else AWS.
        access_key: Default: boto3's credential chain.
        secret_key: Must be given together with ``access_key``.
        region: Default: the environment, else ``us-east-1``.
        cache_bytes: Capacity of the store's tier read cache (see
            :class:`~seglog.tiering.read_cache.TierReadCache`).

    Returns:
        The store's tier service.

    Raises:
        InvalidArgument: For an unsupported or malformed URI or half-given credentials.
    """
    target = await asyncio.to_thread(
        functools.partial(
            open_target,
            uri,
            s3_endpoint=s3_endpoint,
            access_key=access_key,
            secret_key=secret_key,
            region=region,
        )
    )
    return TargetTierService(target, cache_bytes)
