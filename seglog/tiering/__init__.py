"""Tiering: sealed segments -> Parquet objects on S3/MinIO or a local directory.

The DB layer sees only the seam (:mod:`seglog.tiering.seam`): :class:`TierService` /
:class:`TieredStorage`, built by :func:`open_tier_service`; behind it,
:class:`~seglog.tiering.orchestrator.TierOrchestrator` wires these building blocks together
(see :mod:`seglog.tiering.manifest` for the crash-safe protocol):

* :func:`open_target` / :class:`TierTarget` -- where objects go;
* :func:`segment_table_to_parquet` / :func:`parquet_to_segment_table` / :func:`object_key`
  -- what an object is and where it lives;
* :class:`Manifest` / :class:`ManifestEntry` / :class:`ObjectPart` -- what the tier holds,
  in which state, and the checked byte spans ranged reads fetch;
* :func:`upload_segment` / :func:`read_tiered` / :func:`delete_tiered` /
  :func:`recover_manifest` -- the protocol steps, ready to call from a worker thread.
"""

from __future__ import annotations

from seglog.tiering.manifest import (
    MANIFEST_VERSION,
    EntryState,
    Manifest,
    ManifestEntry,
    ObjectPart,
    manifest_key,
)
from seglog.tiering.ops import delete_tiered, read_tiered, recover_manifest, upload_segment
from seglog.tiering.orchestrator import TierOrchestrator
from seglog.tiering.parquet import (
    SEGMENT_SCHEMA,
    TIER_SCHEMA,
    SegmentStats,
    object_key,
    parquet_to_segment_table,
    parse_object_key,
    segment_stats,
    segment_table_to_parquet,
)
from seglog.tiering.seam import ColdStats, TierCacheStats, TieredStorage, TierService
from seglog.tiering.service import TargetTierService, open_tier_service
from seglog.tiering.targets import (
    LocalTarget,
    ObjectInfo,
    ObjectMismatch,
    ObjectNotFound,
    PreconditionFailed,
    S3Target,
    S3Tuning,
    TierTarget,
    open_target,
    verify_bytes,
)

__all__ = [
    "MANIFEST_VERSION",
    "SEGMENT_SCHEMA",
    "TIER_SCHEMA",
    "ColdStats",
    "EntryState",
    "LocalTarget",
    "Manifest",
    "ManifestEntry",
    "ObjectInfo",
    "ObjectMismatch",
    "ObjectNotFound",
    "ObjectPart",
    "PreconditionFailed",
    "S3Target",
    "S3Tuning",
    "SegmentStats",
    "TargetTierService",
    "TierCacheStats",
    "TierOrchestrator",
    "TierService",
    "TierTarget",
    "TieredStorage",
    "delete_tiered",
    "manifest_key",
    "object_key",
    "open_target",
    "open_tier_service",
    "parquet_to_segment_table",
    "parse_object_key",
    "read_tiered",
    "recover_manifest",
    "segment_stats",
    "segment_table_to_parquet",
    "upload_segment",
    "verify_bytes",
]
