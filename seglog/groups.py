"""Durable consumer-group positions: one LMDB environment per database, fsynced per commit.

Every LMDB failure, reads included, surfaces as :class:`~seglog.errors.StorageError` with the
``lmdb.Error`` chained as ``__cause__``.
"""

from __future__ import annotations

import re
import struct
import threading
from pathlib import Path
from typing import Final

import lmdb

from seglog._fs import fsync_dir
from seglog.errors import ClosedResourceError, InvalidName, StorageError

__all__ = ["GROUPS_DIR", "GroupStore", "validate_group_name"]

GROUPS_DIR: Final = "groups"
# Always ``fullmatch``: ``$`` with ``match`` also accepts a trailing "\n".
_NAME_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_MAP_SIZE_BYTES: Final = 1 << 30
_SHARD: Final = struct.Struct(">I")
_OFFSET: Final = struct.Struct(">Q")


def validate_group_name(name: object) -> str:
    """Check a group name (same rules as database names).

    Raises:
        InvalidName: The name is empty, too long or has unusable characters.
    """
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or ".." in name:
        raise InvalidName(
            f"invalid group name {name!r}: use 1-128 characters of letters, digits, '_', '.', '-', "
            "starting with a letter or digit, without '..'"
        )
    return name


def _key(group: str, shard: int) -> bytes:
    return group.encode() + b"\x00" + _SHARD.pack(shard)


class GroupStore:
    """Committed offsets per (group, shard); a commit is durable when :meth:`commit` returns.

    Commits may move backwards (rewind), like Kafka's. Thread-safe.

    Raises:
        StorageError: From the constructor and every method when the directory or LMDB fails.
    """

    def __init__(self, directory: Path, *, read_only: bool = False) -> None:
        """Open (creating unless ``read_only``) the group store of the database in ``directory``.

        ``read_only`` opens an existing environment for reads only, without creating or
        syncing anything (safe beside a writer in another process: LMDB's lock file).
        """
        self.path = directory / GROUPS_DIR
        self._lock = threading.Lock()
        self._env: lmdb.Environment | None
        if read_only:
            try:
                self._env = lmdb.open(str(self.path), max_dbs=1, readonly=True, lock=True, create=False)
            except lmdb.Error as exc:
                raise StorageError(f"cannot open group store at {self.path} read-only") from exc
            return
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self._env = lmdb.open(
                str(self.path), map_size=_MAP_SIZE_BYTES, max_dbs=1, sync=True, metasync=True, lock=True
            )
            # LMDB fsyncs its data file but never a directory: make the entries of its files in
            # groups/, and of groups/ in its parent, survive a power loss. Done on every open,
            # not only on creation, so a crash between mkdir and these fsyncs cannot leave an
            # unsynced directory that later acknowledged commits depend on.
            fsync_dir(self.path)
            fsync_dir(directory)
        except (OSError, lmdb.Error) as exc:
            raise StorageError(f"cannot open group store at {self.path}") from exc

    def _env_or_raise(self) -> lmdb.Environment:
        env = self._env
        if env is None:
            raise ClosedResourceError("the group store is closed")
        return env

    def commit(self, group: str, shard: int, offset: int) -> None:
        """Store ``offset`` for ``(group, shard)`` durably (fsync before returning)."""
        env = self._env_or_raise()
        try:
            with env.begin(write=True) as txn:
                txn.put(_key(group, shard), _OFFSET.pack(offset))
        except lmdb.Error as exc:
            raise StorageError(f"commit of group {group!r} failed") from exc

    def committed(self, group: str, shard: int) -> int | None:
        """The committed offset of ``(group, shard)``, or ``None``."""
        env = self._env_or_raise()
        try:
            with env.begin() as txn:
                raw = txn.get(_key(group, shard))
        except lmdb.Error as exc:
            raise StorageError(f"cannot read the commit of group {group!r} on shard {shard}") from exc
        return None if raw is None else int(_OFFSET.unpack(raw)[0])

    def min_committed(self, shard: int) -> int | None:
        """The smallest offset any group committed for ``shard`` (``None``: no group did)."""
        env = self._env_or_raise()
        best: int | None = None
        suffix = b"\x00" + _SHARD.pack(shard)
        try:
            with env.begin() as txn:
                for k, v in txn.cursor().iternext():
                    if k.endswith(suffix):
                        off = int(_OFFSET.unpack(v)[0])
                        best = off if best is None else min(best, off)
        except lmdb.Error as exc:
            raise StorageError(f"cannot read the group commits of shard {shard}") from exc
        return best

    def groups(self) -> list[str]:
        """Names of every group with a commit, sorted."""
        env = self._env_or_raise()
        try:
            with env.begin() as txn:
                names = {bytes(k[:-5]).decode() for k in txn.cursor().iternext(values=False)}
        except lmdb.Error as exc:
            raise StorageError("cannot list the consumer groups") from exc
        return sorted(names)

    def close(self) -> None:
        """Close the environment; idempotent."""
        with self._lock:
            env, self._env = self._env, None
        if env is not None:
            try:
                env.close()
            except lmdb.Error as exc:
                raise StorageError(f"cannot close the group store at {self.path}") from exc
