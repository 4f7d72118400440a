"""Read-only, lock-free views of a data directory: what ``seglog stats`` and ``seglog groups`` show.

Nothing here creates, locks or writes a file, so it works beside the process that owns the
store (and on a store nobody has open). Figures come from the files: segment names and
sizes, each shard's checkpoint (start offset) and durable-end marker (end offset, as the
owner last acknowledged it), the tier manifest and the consumer-group LMDB environment
(opened read-only; LMDB's own lock file makes that safe beside the owner's writes).

A ``memory`` database has nothing on disk (its shards show as empty); an ``lmdb`` database is
read from its environment, opened read-only. The shard figures come from each engine's
``shard_files`` in the engine registry, so this module never learns an engine's file layout.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from seglog.db_config import DbConfig
from seglog.engines import get_engine
from seglog.errors import StorageError, StoreNotFound
from seglog.groups import GROUPS_DIR, GroupStore
from seglog.store import DB_CONFIG_FILE, DBS_DIR, STORE_FILE, db_directory, read_db_config
from seglog.tiering.db_tier import LOCAL_MANIFEST_FILE, logical_start
from seglog.tiering.manifest import Manifest
from seglog.tiering.targets import TierTarget

__all__ = ["GroupLag", "ShardView", "check_store", "db_view", "group_lags", "list_dbs"]


@dataclass(frozen=True)
class ShardView:
    """One shard as its files show it.

    Attributes:
        start_offset: First readable offset (with a tier manifest: tiered offsets count).
        end_offset: The owner's acknowledged end (the next offset to be assigned).
        segments: Local segment files.
        bytes: Bytes of the local segment files (``lmdb``: 0, see ``hot_bytes``).
        hot_bytes: The active segment (``lmdb``: the environment's data file, on shard 0).
        warm_bytes: Sealed local segments.
        cold_bytes: Objects committed in the tier (per the manifest).
        tier_objects: How many.
    """

    shard: int
    start_offset: int
    end_offset: int
    segments: int
    bytes: int
    hot_bytes: int
    warm_bytes: int
    cold_bytes: int
    tier_objects: int


@dataclass(frozen=True)
class GroupLag:
    """A group's position on one shard: ``lag`` records between its commit and the end."""

    group: str
    shard: int
    committed: int | None
    end_offset: int
    lag: int


def check_store(path: str | os.PathLike[str]) -> Path:
    """The data directory ``path`` as an absolute path.

    Raises:
        StoreNotFound: ``path`` is not a seglog data directory (nothing is created).
    """
    p = Path(path).absolute()
    if not (p / STORE_FILE).is_file():
        what = "does not exist" if not p.exists() else "is not a seglog data directory (no seglog.json)"
        raise StoreNotFound(f"{p} {what}")
    return p


def list_dbs(path: str | os.PathLike[str]) -> list[str]:
    """Names of the databases in the data directory, sorted."""
    root = check_store(path) / DBS_DIR
    try:
        return sorted(p.name for p in root.iterdir() if (p / DB_CONFIG_FILE).is_file())
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise StorageError(f"cannot list {root}") from exc


def db_view(
    path: str | os.PathLike[str], name: str, *, tier: TierTarget | None = None
) -> tuple[DbConfig, list[ShardView]]:
    """The configuration and every shard of database ``name``, read-only and lock-free.

    Args:
        path: The data directory.
        name: The database.
        tier: The tier, for cold bytes and the logical start (its manifest is read, never
            written). Without it the local manifest copy is used when there is one.

    Raises:
        StoreNotFound: No data directory at ``path``.
        DatabaseNotFound: No such database.
        TierError: The tier cannot be read.
    """
    root = check_store(path)
    config = read_db_config(root, name)
    db_dir = db_directory(root, name)
    manifest: Manifest | None = None
    local_manifest = db_dir / LOCAL_MANIFEST_FILE
    if tier is not None:
        manifest = Manifest.load(tier, name, local_path=local_manifest)
    elif local_manifest.is_file():
        manifest = Manifest.load_local(local_manifest, name)
    factory = get_engine(config.engine)
    views = []
    for n, files in enumerate(factory.shard_files(db_dir, config.shards)):
        sizes = files.segment_bytes
        start, cold, objects = files.start_offset, 0, 0
        # Only a tiering engine's shards have a tiered part (a manifest of another engine's
        # database is ignored, as the store never tiers it).
        if manifest is not None and factory.tiering:
            committed = manifest.committed(n)
            cold, objects = sum(e.bytes for e in committed), len(committed)
            start = logical_start(manifest, n, files.start_offset)
        hot = (sizes[-1] if sizes else 0) + files.other_bytes
        views.append(
            ShardView(n, start, files.end_offset, len(sizes), sum(sizes), hot, sum(sizes[:-1]), cold, objects)
        )
    return config, views


def group_lags(path: str | os.PathLike[str], name: str) -> list[GroupLag]:
    """Every consumer group of database ``name`` with its commit and lag on every shard.

    A shard the group never committed on shows ``committed=None`` and the whole shard as lag.

    Raises:
        StoreNotFound: No data directory at ``path``.
        DatabaseNotFound: No such database.
    """
    root = check_store(path)
    _config, views = db_view(root, name)
    db_dir = db_directory(root, name)
    if not (db_dir / GROUPS_DIR / "data.mdb").is_file():
        return []
    groups = GroupStore(db_dir, read_only=True)
    try:
        out = []
        for group in groups.groups():
            for v in views:
                committed = groups.committed(group, v.shard)
                position = v.start_offset if committed is None else max(committed, v.start_offset)
                out.append(GroupLag(group, v.shard, committed, v.end_offset, max(0, v.end_offset - position)))
        return out
    finally:
        groups.close()
