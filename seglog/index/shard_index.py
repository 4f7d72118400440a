"""Sparse LMDB indexes of one shard: offset, time, key and tag.

All four live in one LMDB environment per shard (``<shard>/index/``) as named databases:

* ``offset``: frame base offset -> (segment base, file position); an entry for the first
  frame of every segment and then one every ``index_interval_bytes``. Lookup is a floor
  search followed by a forward scan of frame headers.
* ``time``: (running max ts, offset after that frame) -> empty. Written when the shard's
  running maximum timestamp grew and ``index_interval_bytes`` passed. The last entry whose
  max is below ``ts`` proves that every record before its offset is older than ``ts``.
* ``key``: (key, record offset) -> empty, for every keyed record. Keys longer than
  :data:`MAX_INLINE_KEY_BYTES` are stored as a 16-byte BLAKE2b digest and the caller filters.
* ``tag``: (tag, frame base offset) -> (segment base, file position), one entry per distinct
  tag (the stream id) of a frame.
* ``meta``: ``indexed_end`` -- every frame below this offset is indexed.

The index is derived data: the environment is opened without fsync per transaction, so a
machine crash can tear it. Each index therefore records the boot that has it open in
``OPEN`` (fsynced, removed after the final sync at close); an index found open by another
boot is rebuilt from the segments, one index at a time, whenever it is next opened. An
environment that cannot be opened is rebuilt too (logged). Entries are written only after
the frames they point to are durable, in one write transaction per I/O batch.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import struct
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Final, NamedTuple, ParamSpec, TypeVar

import lmdb

from seglog._fs import boot_id, fsync_dir
from seglog.errors import StorageError

log = logging.getLogger("seglog.index")

__all__ = [
    "DEFAULT_INDEX_INTERVAL_BYTES",
    "MAX_INLINE_KEY_BYTES",
    "FrameEntry",
    "IndexPosition",
    "ShardIndex",
]

DEFAULT_INDEX_INTERVAL_BYTES: Final = 4096
# LMDB keys are at most 511 bytes; the 2-byte length and 8-byte offset leave room for this.
MAX_INLINE_KEY_BYTES: Final = 400
_MAP_SIZE_BYTES: Final = 1 << 36  # address space only; the file grows as needed
_U64: Final = struct.Struct(">Q")
_U64_PAIR: Final = struct.Struct(">QQ")
_U32_U64: Final = struct.Struct(">IQ")
_TS_BIAS: Final = 1 << 63
_LONG_KEY_MARK: Final = 0xFFFF
_INDEXED_END: Final = b"indexed_end"
_OPEN_FILE: Final = "OPEN"


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _lookup(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Turn LMDB failures of a lookup into :class:`StorageError`."""

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return fn(*args, **kwargs)
        except lmdb.Error as exc:
            raise StorageError(f"index lookup failed: {exc}") from exc

    return wrapper


class IndexPosition(NamedTuple):
    """A frame's place on disk: segment base offset and byte position in that file."""

    segment_base: int
    pos: int


class FrameEntry(NamedTuple):
    """What the index needs to know about one durable frame."""

    base_offset: int
    next_offset: int
    max_ts: int
    segment_base: int
    pos: int
    size: int
    keys: Sequence[tuple[bytes, int]]  # (key, record offset) of keyed records
    tags: Iterable[int]


def _key_prefix(key: bytes) -> bytes:
    if len(key) <= MAX_INLINE_KEY_BYTES:
        return len(key).to_bytes(2, "big") + key
    return _LONG_KEY_MARK.to_bytes(2, "big") + hashlib.blake2b(key, digest_size=16).digest()


class ShardIndex:
    """The sparse indexes of one shard (see the module docstring)."""

    def __init__(self, path: Path, *, index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES) -> None:
        self.path = path
        self.index_interval_bytes = index_interval_bytes
        #: Whether this open found the index unusable and started it empty (callers re-index).
        self.rebuilt = False
        torn = _opened_by_other_boot(path)
        if torn:
            log.warning("%s: open when the machine restarted (may be torn); rebuilding it", path)
            self._discard()
        try:
            self._open_env()
        except lmdb.Error as exc:
            log.warning("%s: cannot open the index (%s); rebuilding it from the segments", path, exc)
            self._discard()
            try:
                self._open_env()
            except lmdb.Error as exc2:
                raise StorageError(f"cannot open index at {path}") from exc2
        self.rebuilt = self.rebuilt or torn
        self._reset_sparse_state()

    def _discard(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        self.rebuilt = True

    def _open_env(self) -> None:
        path = self.path
        if not path.is_dir():
            path.mkdir(parents=True)
            fsync_dir(path.parent)
        self._env = lmdb.open(
            str(path),
            map_size=_MAP_SIZE_BYTES,
            max_dbs=8,
            sync=False,
            metasync=False,
            readahead=False,
            lock=True,
        )
        try:
            env = self._env
            self._offset = env.open_db(b"offset")
            self._time = env.open_db(b"time")
            self._key = env.open_db(b"key")
            self._tag = env.open_db(b"tag")
            self._meta = env.open_db(b"meta")
            with env.begin() as txn:
                raw = txn.get(_INDEXED_END, db=self._meta)
            self.indexed_end = _U64.unpack(raw)[0] if raw else 0
            _write_open_marker(path)
        except (lmdb.Error, struct.error, OSError) as exc:
            self._env.close()
            raise lmdb.Error(str(exc)) from exc

    def _reset_sparse_state(self) -> None:
        # Recomputed conservatively (the next frame gets entries) after open or a cut.
        self._bytes_since_offset_entry = self.index_interval_bytes
        self._bytes_since_time_entry = self.index_interval_bytes
        self._running_max_ts: int | None = None
        self._last_segment_base: int | None = None

    def reset(self) -> None:
        """Drop every entry (the index disagreed with the segments); the caller re-indexes.

        Raises:
            StorageError: The environment could not be cleared.
        """
        log.warning("%s: clearing the index to rebuild it from the segments", self.path)
        try:
            with self._env.begin(write=True) as txn:
                for db in (self._offset, self._time, self._key, self._tag):
                    txn.drop(db, delete=False)
                txn.put(_INDEXED_END, _U64.pack(0), db=self._meta)
        except lmdb.Error as exc:
            raise StorageError(f"cannot clear index at {self.path}") from exc
        self.indexed_end = 0
        self._reset_sparse_state()

    # --- writing -----------------------------------------------------------------------

    def add(self, frames: Sequence[FrameEntry]) -> None:
        """Index durable frames (in offset order) in one write transaction.

        Nothing changes, in memory or on disk, unless the transaction commits.

        Raises:
            StorageError: The transaction failed.
        """
        if not frames:
            return
        offset_items: list[tuple[bytes, bytes]] = []
        time_items: list[tuple[bytes, bytes]] = []
        key_items: list[tuple[bytes, bytes]] = []
        tag_items: list[tuple[bytes, bytes]] = []
        interval = self.index_interval_bytes
        since_offset = self._bytes_since_offset_entry
        since_time = self._bytes_since_time_entry
        running_max = self._running_max_ts
        last_segment = self._last_segment_base
        indexed_end = self.indexed_end
        for f in frames:
            if f.next_offset <= indexed_end:
                continue  # already indexed (rebuild overlapping a live tail)
            position = _U64_PAIR.pack(f.segment_base, f.pos)
            since_offset += f.size
            if last_segment != f.segment_base or since_offset >= interval:
                offset_items.append((_U64.pack(f.base_offset), position))
                since_offset = 0
                last_segment = f.segment_base
            since_time += f.size
            if running_max is None or f.max_ts > running_max:
                running_max = f.max_ts
                if since_time >= interval:
                    time_items.append((_U64_PAIR.pack(f.max_ts + _TS_BIAS, f.next_offset), b""))
                    since_time = 0
            for key, offset in f.keys:
                key_items.append((_key_prefix(key) + _U64.pack(offset), b""))
            for tag in f.tags:
                tag_items.append((_U32_U64.pack(tag, f.base_offset), position))
            indexed_end = f.next_offset
        try:
            with self._env.begin(write=True) as txn:
                if offset_items:
                    txn.cursor(self._offset).putmulti(offset_items)
                if time_items:
                    txn.cursor(self._time).putmulti(time_items)
                if key_items:
                    key_items.sort()
                    txn.cursor(self._key).putmulti(key_items)
                if tag_items:
                    txn.cursor(self._tag).putmulti(tag_items)
                txn.put(_INDEXED_END, _U64.pack(indexed_end), db=self._meta)
        except lmdb.Error as exc:
            raise StorageError(f"index write failed at {self.path}") from exc
        self.indexed_end = indexed_end
        self._bytes_since_offset_entry = since_offset
        self._bytes_since_time_entry = since_time
        self._running_max_ts = running_max
        self._last_segment_base = last_segment

    def truncate_from(self, offset: int) -> None:
        """Drop every entry that points at or past ``offset`` (the log was cut there).

        Raises:
            StorageError: The transaction failed.
        """
        end = min(self.indexed_end, offset)
        try:
            with self._env.begin(write=True) as txn:
                _delete_where(txn.cursor(self._offset), lambda k: _U64.unpack(k)[0] >= offset)
                _delete_where(txn.cursor(self._time), lambda k: _U64_PAIR.unpack(k)[1] > offset)
                _delete_where(txn.cursor(self._key), lambda k: _U64.unpack(k[-8:])[0] >= offset)
                _delete_where(txn.cursor(self._tag), lambda k: _U32_U64.unpack(k)[1] >= offset)
                txn.put(_INDEXED_END, _U64.pack(end), db=self._meta)
        except lmdb.Error as exc:
            raise StorageError(f"index cut failed at {self.path}") from exc
        self.indexed_end = end
        self._reset_sparse_state()

    def delete_below(self, offset: int) -> None:
        """Drop entries for data below ``offset`` (retention removed it).

        Raises:
            StorageError: The transaction failed.
        """
        try:
            with self._env.begin(write=True) as txn:
                cur = txn.cursor(self._offset)
                _delete_while(cur, lambda k: _U64.unpack(k)[0] < offset)
                _delete_where(txn.cursor(self._key), lambda k: _U64.unpack(k[-8:])[0] < offset)
                _delete_where(txn.cursor(self._tag), lambda k: _U32_U64.unpack(k)[1] < offset)
        except lmdb.Error as exc:
            raise StorageError(f"index cleanup failed at {self.path}") from exc

    def sync(self) -> None:
        """Flush the environment to disk."""
        self._env.sync(True)

    def close(self) -> None:
        """Sync and close the environment; a clean close clears the ``OPEN`` record.

        Raises:
            StorageError: The final sync failed (the index is rebuilt on a later boot).
        """
        try:
            self._env.sync(True)
            (self.path / _OPEN_FILE).unlink(missing_ok=True)
        except (lmdb.Error, OSError) as exc:
            raise StorageError(f"closing index at {self.path} failed") from exc
        finally:
            self._env.close()

    # --- lookups (microsecond-scale; safe from any thread) -----------------------------

    @_lookup
    def floor(self, offset: int) -> tuple[int, IndexPosition] | None:
        """The indexed frame with the greatest base offset ``<= offset``."""
        with self._env.begin(db=self._offset) as txn:
            cur = txn.cursor()
            if cur.set_range(_U64.pack(offset + 1)):
                if not cur.prev():
                    return None
            elif not cur.last():
                return None
            base = _U64.unpack(cur.key())[0]
            seg, pos = _U64_PAIR.unpack(cur.value())
            return base, IndexPosition(seg, pos)

    @_lookup
    def time_lower_bound(self, ts: int) -> int | None:
        """An offset before which every record has a timestamp below ``ts`` (``None``: no bound)."""
        with self._env.begin(db=self._time) as txn:
            cur = txn.cursor()
            if cur.set_range(_U64_PAIR.pack(ts + _TS_BIAS, 0)):
                if not cur.prev():
                    return None
            elif not cur.last():
                return None
            return int(_U64_PAIR.unpack(cur.key())[1])

    @_lookup
    def key_offsets(self, key: bytes, *, start: int = 0) -> list[int]:
        """Offsets (ascending) of records whose key is, or hashes like, ``key``."""
        prefix = _key_prefix(key)
        out: list[int] = []
        with self._env.begin(db=self._key) as txn:
            cur = txn.cursor()
            if not cur.set_range(prefix + _U64.pack(start)):
                return out
            for k in cur.iternext(keys=True, values=False):
                if not k.startswith(prefix) or len(k) != len(prefix) + 8:
                    break
                out.append(_U64.unpack(k[-8:])[0])
        return out

    @_lookup
    def tag_frames(self, tag: int, *, start: int = 0) -> list[tuple[int, IndexPosition]]:
        """(frame base offset, position) of frames holding records with ``tag``, ascending."""
        out: list[tuple[int, IndexPosition]] = []
        with self._env.begin(db=self._tag) as txn:
            cur = txn.cursor()
            if not cur.set_range(_U32_U64.pack(tag, start)):
                return out
            for k, v in cur.iternext():
                t, base = _U32_U64.unpack(k)
                if t != tag:
                    break
                out.append((base, IndexPosition(*_U64_PAIR.unpack(v))))
        return out


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


def _delete_where(cur: lmdb.Cursor, doomed: object) -> None:
    pred = doomed  # callable[[bytes], bool]
    if not cur.first():
        return
    while True:
        if pred(cur.key()):  # type: ignore[operator]
            if not cur.delete():
                break
            if not cur.key():
                break
        elif not cur.next():
            break


def _delete_while(cur: lmdb.Cursor, doomed: object) -> None:
    pred = doomed
    if not cur.first():
        return
    while cur.key() and pred(cur.key()):  # type: ignore[operator]
        if not cur.delete():
            break
