"""The tiering protocol as functions: upload a sealed segment, read through, delete, recover.

These follow the crash-safe steps documented in :mod:`seglog.tiering.manifest`. They block
(call them from a worker thread) and expect one writer per database manifest, or per shard
of a shared one (:meth:`~seglog.tiering.manifest.Manifest.load_shared`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import crc32c
import pyarrow as pa

from seglog.errors import InvalidArgument
from seglog.tiering.manifest import Manifest, ManifestEntry, ObjectPart
from seglog.tiering.parquet import (
    STREAMS_METADATA_KEY,
    StreamStructures,
    encode_stream_structures,
    object_key,
    parquet_part_spans,
    parquet_to_segment_table,
    segment_stats,
    segment_table_to_parquet,
)
from seglog.tiering.targets import ObjectInfo, TierTarget, verify_bytes

__all__ = ["delete_tiered", "read_tiered", "recover_manifest", "upload_segment"]


def upload_segment(
    target: TierTarget,
    manifest: Manifest,
    shard: int,
    table: pa.Table,
    *,
    local_manifest: Path | None = None,
    streams: StreamStructures | None = None,
) -> ManifestEntry:
    """Tiers one sealed segment: encode, record intent, put, verify, commit.

    Safe to call again for the same segment after a failure or crash (the ``uploading``
    entry is replaced and the put is idempotent). Delete the local segment only after this
    returns.

    Args:
        target: The tier.
        manifest: The database's manifest (saved twice by this call).
        shard: The segment's shard.
        table: The segment's records (:data:`~seglog.tiering.parquet.SEGMENT_SCHEMA`).
        local_manifest: Path of the local manifest copy.
        streams: The learned structure of the streams in ``table`` (databases that stamp
            streams), kept in the object's metadata under
            :data:`~seglog.tiering.parquet.STREAMS_METADATA_KEY`.

    Returns:
        The committed entry.

    Raises:
        InvalidArgument: Bad table, or its range overlaps an already tiered object.
        TierError: The tier failed or the upload did not verify; the entry stays
            ``uploading`` (retry, or :func:`recover_manifest` resolves it).
    """
    stats = segment_stats(table)
    key = object_key(manifest.db, shard, stats.base_offset, stats.end_offset)
    data = segment_table_to_parquet(
        table,
        metadata={
            "seglog.db": manifest.db,
            "seglog.shard": str(shard),
            "seglog.base_offset": str(stats.base_offset),
            "seglog.end_offset": str(stats.end_offset),
            **({} if streams is None else {STREAMS_METADATA_KEY: encode_stream_structures(streams)}),
        },
    )
    expected = ObjectInfo(key, len(data), hashlib.sha256(data).hexdigest())
    view = memoryview(data)
    parts = tuple(
        ObjectPart(start, end, crc32c.crc32c(view[start:end])) for start, end in parquet_part_spans(data)
    )
    manifest.begin_upload(ManifestEntry.for_upload(shard, stats, expected, parts))
    manifest.save(target, local_path=local_manifest)
    target.put(key, data)
    target.verify(key, expected)
    entry = manifest.mark_committed(key)
    manifest.save(target, local_path=local_manifest)
    return entry


def read_tiered(
    target: TierTarget,
    manifest: Manifest,
    shard: int,
    start_offset: int,
    *,
    end_offset: int | None = None,
    verify: bool = True,
) -> Iterator[pa.Table]:
    """Yields the tiered records of ``shard`` from ``start_offset``, one table per object.

    Tables follow :data:`~seglog.tiering.parquet.SEGMENT_SCHEMA` (``ts`` as int64 µs) and
    come in offset order; the first is cut at ``start_offset``, the last at ``end_offset``
    (inclusive). Objects are fetched lazily, one per iteration step; with ``verify`` each
    object's sha256 is checked against the manifest before decoding.

    Raises:
        TierError: The tier failed, or an object is missing or corrupt
            (:class:`~seglog.tiering.targets.ObjectMismatch`).
    """
    if start_offset < 0 or (end_offset is not None and end_offset < start_offset):
        raise InvalidArgument(f"invalid offset range [{start_offset}, {end_offset}]")
    for entry in manifest.committed(shard, start_offset=start_offset, end_offset=end_offset):
        data = target.get(entry.key)
        if verify:
            verify_bytes(entry.key, data, entry.object_info)
        table = parquet_to_segment_table(
            data,
            start_offset=start_offset if start_offset > entry.base_offset else None,
            end_offset=end_offset if end_offset is not None and end_offset < entry.end_offset else None,
        )
        if table.num_rows:
            yield table


def delete_tiered(
    target: TierTarget, manifest: Manifest, key: str, *, local_manifest: Path | None = None
) -> None:
    """Removes one committed object (remote retention): mark deleting, delete, drop entry."""
    manifest.mark_deleting(key)
    manifest.save(target, local_path=local_manifest)
    target.delete(key)
    manifest.remove(key)
    manifest.save(target, local_path=local_manifest)


def recover_manifest(
    target: TierTarget, db: str, *, local_manifest: Path | None = None
) -> tuple[Manifest, list[str]]:
    """Loads ``db``'s manifest and resolves what a crash left half-done.

    Returns:
        The manifest (saved if anything changed) and the actions taken.
    """
    manifest = Manifest.load(target, db, local_path=local_manifest)
    actions = manifest.recover(target)
    if actions:
        manifest.save(target, local_path=local_manifest)
    actions += [f"deleted old checkpoint {key}" for key in manifest.collect_checkpoints(target)]
    return manifest, actions
