"""Read-only, lock-free views of a data directory: what ``seglog stats`` and ``seglog groups`` show.

Nothing here creates, locks or writes a file, so it works beside the process that owns the
store (and on a store nobody has open). Figures come from the files: segment names and
sizes, each shard's checkpoint (start offset) and durable-end marker (end offset, as the
owner last acknowledged it), the tier manifest and the consumer-group LMDB environment
(opened read-only; LMDB's own lock file makes that safe beside the owner's writes).

A ``memory`` database has nothing on disk (its shards show as empty); an ``lmdb`` database is
read from its environment, opened read-only.
"""

from __future__ import annotations

import contextlib
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import lmdb

from seglog.db_config import DbConfig
from seglog.engines.lmdb_engine import FRAMES_DIR
from seglog.engines.segment import shard_dir_name
from seglog.errors import StorageError, StoreNotFound
from seglog.groups import GROUPS_DIR, GroupStore
from seglog.record import FRAME_HEADER_BYTES, parse_header
from seglog.segment.durable_end import read_durable_end
from seglog.segment.log_segment import segment_name
from seglog.segment.shard_reader import ShardReader, list_segment_bases
from seglog.store import DB_CONFIG_FILE, DBS_DIR, STORE_FILE, db_directory, read_db_config
from seglog.tiering.db_tier import LOCAL_MANIFEST_FILE, logical_start
from seglog.tiering.manifest import Manifest
from seglog.tiering.targets import TierTarget

__all__ = ["GroupLag", "ShardView", "check_store", "db_view", "group_lags", "list_dbs"]

_U64: Final = struct.Struct(">Q")


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


def _segment_end(directory: Path, base: int) -> int:
    """The end offset of a segment from its frame headers (no marker: an older store)."""
    path = directory / segment_name(base)
    end = base
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return end
    try:
        size = os.fstat(fd).st_size
        pos = 0
        while pos + FRAME_HEADER_BYTES <= size:
            try:
                header = parse_header(os.pread(fd, FRAME_HEADER_BYTES, pos), 0)
            except StorageError:
                break  # a torn tail: the owner's recovery cuts it
            if header.base_offset != end or pos + header.size > size:
                break
            pos += header.size
            end = header.next_offset
    finally:
        os.close(fd)
    return end


def _segment_shard(db_dir: Path, shard: int) -> tuple[int, int, list[int]]:
    """(start, end, segment sizes oldest first) of a ``segment``-engine shard."""
    directory = db_dir / shard_dir_name(shard)
    if not directory.is_dir():
        return 0, 0, []
    bases = list_segment_bases(directory)
    sizes = []
    for base in bases:
        with contextlib.suppress(FileNotFoundError):  # retention removed it meanwhile
            sizes.append((directory / segment_name(base)).stat().st_size)
    start = ShardReader(directory).start_offset()
    marker = read_durable_end(directory)
    end = marker.next_offset if marker is not None else start
    if marker is None and bases:  # a store written before the marker existed
        end = _segment_end(directory, bases[-1])
    return start, max(start, end), sizes


def _lmdb_shards(db_dir: Path, shards: int) -> list[tuple[int, int]]:
    """(start, end) per shard of an ``lmdb``-engine database, from its environment (read-only)."""
    path = db_dir / FRAMES_DIR
    if not path.is_dir():
        return [(0, 0)] * shards
    try:
        env = lmdb.open(str(path), readonly=True, lock=True, max_dbs=2 * shards + 1, subdir=True)
    except lmdb.Error as exc:
        raise StorageError(f"cannot open LMDB environment {path} read-only") from exc
    out = []
    try:
        with env.begin(buffers=True) as txn:
            meta = env.open_db(b"meta", txn=txn, create=False)
            for n in range(shards):
                raw = txn.get(b"start:%d" % n, db=meta)
                start = _U64.unpack(bytes(raw))[0] if raw is not None else 0
                end = start
                try:
                    frames = env.open_db(b"f%d" % n, txn=txn, create=False)
                except lmdb.NotFoundError:
                    frames = None
                if frames is not None:
                    cursor = txn.cursor(db=frames)
                    if cursor.last():
                        end = max(end, parse_header(bytes(cursor.value()), 0).next_offset)
                out.append((start, end))
    except lmdb.Error as exc:
        raise StorageError(f"cannot read LMDB environment {path}") from exc
    finally:
        env.close()
    return out


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
        manifest = Manifest.from_json(local_manifest.read_bytes(), db=name)
    views = []
    if config.engine == "lmdb":
        data_file = db_dir / FRAMES_DIR / "data.mdb"
        env_bytes = data_file.stat().st_size if data_file.is_file() else 0
        for n, (start, end) in enumerate(_lmdb_shards(db_dir, config.shards)):
            views.append(ShardView(n, start, end, 0, 0, env_bytes if n == 0 else 0, 0, 0, 0))
        return config, views
    for n in range(config.shards):
        if config.engine == "memory":
            views.append(ShardView(n, 0, 0, 0, 0, 0, 0, 0, 0))
            continue
        local_start, end, sizes = _segment_shard(db_dir, n)
        start, cold, objects = local_start, 0, 0
        if manifest is not None:
            committed = manifest.committed(n)
            cold, objects = sum(e.bytes for e in committed), len(committed)
            start = logical_start(manifest, n, local_start)
        views.append(ShardView(n, start, end, len(sizes), sum(sizes), sizes[-1] if sizes else 0,
                               sum(sizes[:-1]), cold, objects))
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
