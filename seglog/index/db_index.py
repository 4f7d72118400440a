"""The LMDB environment holding every shard's indexes of one database (``<db>/index/``).

One environment per database, not per shard: an environment costs two descriptors and an
address-space map, so per-shard environments made a node's cost grow with its shard count
(10,000 shards: 20,000 descriptors). :class:`DbIndex` owns the environment, hands out one
:class:`~seglog.index.shard_index.ShardIndex` view per shard and writes the entries of many
shards in one transaction (:meth:`DbIndex.add_many`).

The index is derived data: the environment is opened without fsync per transaction, so a
machine crash can tear it. The environment records the boot that has it open in ``OPEN``
(fsynced, removed after the final sync at close); an environment found open by another boot
is discarded whole and every shard is re-indexed from its segments when the database opens.
An environment that cannot be opened (or has an unknown format) is rebuilt too (logged).
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import lmdb

from seglog._fs import boot_id, fsync_dir
from seglog.errors import InvalidArgument, StorageError
from seglog.index.shard_index import (
    DEFAULT_INDEX_INTERVAL_BYTES,
    DEFAULT_MERGE_FRAMES,
    DEFAULT_MERGE_PAIRS,
    INDEXED_END_KEY,
    FrameEntry,
    IndexTables,
    ShardIndex,
    add_many,
)

log = logging.getLogger("seglog.index")

__all__ = ["INDEX_DIR", "DbIndex"]

#: The index directory's name inside a database directory.
INDEX_DIR: Final = "index"
# Address space only (the file grows as needed); one map per database now holds all shards.
_MAP_SIZE_BYTES: Final = 1 << 38
_FORMAT: Final = b"1"
_FORMAT_KEY: Final = b"format"  # not shard-prefixed: meta's shard keys are 4 + 11 bytes
_OPEN_FILE: Final = "OPEN"
_U64: Final = struct.Struct(">Q")
_META_KEY_BYTES: Final = 4 + len(INDEXED_END_KEY)


class DbIndex:
    """The sparse indexes of every shard of one database, in one LMDB environment.

    Args:
        path: The environment's directory (``<db>/index``); created if missing.
        index_interval_bytes: Bytes of frames between sparse offset/time entries.
        merge_frames: Frames of one segment whose key summaries are merged into postings.
        merge_pairs: (frame, distinct key) pairs of one segment that trigger a merge.

    Raises:
        StorageError: The environment could not be opened even after discarding it.
    """

    def __init__(
        self,
        path: Path,
        *,
        index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES,
        merge_frames: int = DEFAULT_MERGE_FRAMES,
        merge_pairs: int = DEFAULT_MERGE_PAIRS,
    ) -> None:
        self.path = path
        self.index_interval_bytes = index_interval_bytes
        self._merge_frames = merge_frames
        self._merge_pairs = merge_pairs
        self._views: dict[int, ShardIndex] = {}
        self._ends: dict[int, int] = {}
        #: Whether this open found the environment unusable and started it empty.
        self.rebuilt = False
        if _opened_by_other_boot(path):
            log.warning(
                "%s: open when the machine restarted (may be torn); rebuilding every shard's index "
                "from the segments",
                path,
            )
            self._discard()
        try:
            self._tables = self._open_env()
        except lmdb.Error as exc:
            log.warning("%s: cannot open the index (%s); rebuilding it from the segments", path, exc)
            self._discard()
            try:
                self._tables = self._open_env()
            except lmdb.Error as exc2:
                raise StorageError(f"cannot open index at {path}") from exc2

    def _discard(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        self.rebuilt = True

    def _open_env(self) -> IndexTables:
        path = self.path
        if not path.is_dir():
            path.mkdir(parents=True)
            fsync_dir(path.parent)
        env = lmdb.open(
            str(path),
            map_size=_MAP_SIZE_BYTES,
            max_dbs=8,
            sync=False,  # derived data: rebuilt after a machine crash instead of fsynced per write
            metasync=False,
            readahead=False,
            lock=True,
        )
        try:
            tables = IndexTables(
                path,
                env,
                env.open_db(b"offset"),
                env.open_db(b"time"),
                env.open_db(b"key"),
                env.open_db(b"keyframe"),
                env.open_db(b"tag"),
                env.open_db(b"meta"),
            )
            with env.begin(write=True) as txn:
                found = txn.get(_FORMAT_KEY, db=tables.meta)
                if found is None:
                    if txn.stat(tables.meta)["entries"]:
                        raise lmdb.Error("index without a format record")
                    txn.put(_FORMAT_KEY, _FORMAT, db=tables.meta)
                elif found != _FORMAT:
                    raise lmdb.Error(f"unknown index format {found!r}")
                cur = txn.cursor(tables.meta)
                for k, v in cur.iternext():
                    if len(k) == _META_KEY_BYTES and k.endswith(INDEXED_END_KEY):
                        self._ends[int.from_bytes(k[:4], "big")] = _U64.unpack(v)[0]
            _write_open_marker(path)
        except (lmdb.Error, struct.error, OSError) as exc:
            env.close()
            self._ends.clear()
            raise lmdb.Error(str(exc)) from exc
        return tables

    def shard(self, number: int, *, legacy_dir: Path | None = None) -> ShardIndex:
        """The view of shard ``number`` (the same object on every call).

        Args:
            number: The shard.
            legacy_dir: Where the shard's own environment lived before indexes were shared;
                if it exists it is removed and the shard's entries here are cleared, so the
                shard is re-indexed from its segments (whatever wrote that old index may have
                written segments this environment has not seen).

        Raises:
            StorageError: Clearing the shard's entries failed.
        """
        view = self._views.get(number)
        if view is None:
            view = ShardIndex(
                self._tables,
                number,
                indexed_end=self._ends.get(number, 0),
                rebuilt=self.rebuilt,
                index_interval_bytes=self.index_interval_bytes,
                merge_frames=self._merge_frames,
                merge_pairs=self._merge_pairs,
            )
            self._views[number] = view
        if legacy_dir is not None and legacy_dir.is_dir():
            log.info(
                "%s: removing the per-shard index of the old layout; shard %d is re-indexed in %s",
                legacy_dir,
                number,
                self.path,
            )
            shutil.rmtree(legacy_dir, ignore_errors=True)
            try:
                fsync_dir(legacy_dir.parent)
            except OSError:
                log.warning("%s: could not fsync after removing %s", legacy_dir.parent, legacy_dir.name)
            view.reset()
        return view

    def add_many(self, batches: Sequence[tuple[ShardIndex, Sequence[FrameEntry]]]) -> None:
        """Index durable frames of many shards in ONE write transaction.

        Args:
            batches: ``(view, frames in offset order)`` per shard; views come from :meth:`shard`.

        Each view's in-memory state moves only after the transaction committed.

        Raises:
            InvalidArgument: A view belongs to another database.
            StorageError: The transaction failed (nothing of it is kept).
        """
        for view, _ in batches:
            if self._views.get(view.number) is not view:
                raise InvalidArgument(f"{view!r} is not a view of {self.path}")
        add_many(self._tables, batches)

    def sync(self) -> None:
        """Flush the environment to disk.

        Raises:
            StorageError: The sync failed.
        """
        try:
            self._tables.env.sync(True)
        except lmdb.Error as exc:
            raise StorageError(f"syncing index at {self.path} failed") from exc

    def close(self) -> None:
        """Sync and close the environment; a clean close clears the ``OPEN`` record.

        Raises:
            StorageError: The final sync failed (the index is rebuilt on a later boot).
        """
        env = self._tables.env
        try:
            env.sync(True)
            (self.path / _OPEN_FILE).unlink(missing_ok=True)
        except (lmdb.Error, OSError) as exc:
            raise StorageError(f"closing index at {self.path} failed") from exc
        finally:
            env.close()


def _opened_by_other_boot(path: Path) -> bool:
    """Whether the index was left open (not closed cleanly) by an earlier boot of the machine."""
    try:
        return (path / _OPEN_FILE).read_text().strip() != boot_id()
    except FileNotFoundError:
        return False
    except (OSError, UnicodeDecodeError):
        return True


def _write_open_marker(path: Path) -> None:
    marker = path / _OPEN_FILE
    try:
        if marker.read_text().strip() == boot_id():
            return
    except (OSError, UnicodeDecodeError):
        pass
    tmp = path / (_OPEN_FILE + ".tmp")
    with open(tmp, "w") as f:
        f.write(boot_id())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, marker)
    fsync_dir(path)
