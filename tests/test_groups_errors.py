"""The group store: LMDB failures surface as StorageError, and a new groups/ dir is fsynced."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import lmdb
import pytest

import seglog
import seglog._fs
import seglog.groups
from seglog import errors
from seglog.groups import GROUPS_DIR, GroupStore

_PAGE_BYTES = 4096  # LMDB's page size on Linux/x86-64 and arm64


def _zero_data_pages(store: GroupStore) -> None:
    """Zero every page after LMDB's two meta pages: the tree's pages now have no valid type."""
    data = store.path / "data.mdb"
    size = data.stat().st_size
    assert size > 2 * _PAGE_BYTES
    with open(data, "r+b") as f:
        f.seek(2 * _PAGE_BYTES)
        f.write(bytes(size - 2 * _PAGE_BYTES))


def _reads(store: GroupStore) -> dict[str, Callable[[], object]]:
    return {
        "committed": lambda: store.committed("g", 0),
        "min_committed": lambda: store.min_committed(0),
        "groups": store.groups,
    }


@pytest.mark.parametrize("method", ["committed", "min_committed", "groups"])
def test_reads_of_a_corrupt_environment_raise_storage_error(tmp_path: Path, method: str) -> None:
    store = GroupStore(tmp_path)
    try:
        for shard in range(3):
            store.commit("g", shard, 10 + shard)
        assert _reads(store)[method]() is not None
        _zero_data_pages(store)
        with pytest.raises(errors.StorageError) as ei:
            _reads(store)[method]()
        assert isinstance(ei.value.__cause__, lmdb.CorruptedError)
    finally:
        store.close()


@pytest.mark.parametrize("method", ["commit", "committed", "min_committed", "groups"])
def test_calls_on_an_environment_closed_underneath_raise_storage_error(tmp_path: Path, method: str) -> None:
    store = GroupStore(tmp_path)
    store.commit("g", 0, 1)
    env = store._env
    assert env is not None
    env.close()  # the handle is still installed, as after a failure inside LMDB
    calls = {**_reads(store), "commit": lambda: store.commit("g", 0, 2)}
    with pytest.raises(errors.StorageError) as ei:
        calls[method]()
    assert isinstance(ei.value.__cause__, lmdb.Error)
    store.close()


def test_database_committed_on_a_corrupt_group_store_raises_storage_error(run, data_dir: Path) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", shards=2, retention_bytes=1 << 20)
            await db.commit("g", 1, 5)
            _zero_data_pages(db._group_store())
            with pytest.raises(errors.StorageError):
                await db.committed("g", 1)
            with pytest.raises(errors.StorageError):
                await db.enforce_retention()  # reads every shard's min_committed

    run(main())


def test_new_groups_dir_is_fsynced_into_its_parent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[Path] = []
    real = seglog._fs.fsync_dir

    def spy(path: str | os.PathLike[str]) -> None:
        synced.append(Path(path))
        real(path)

    monkeypatch.setattr(seglog.groups, "fsync_dir", spy, raising=False)
    GroupStore(tmp_path).close()
    assert tmp_path in synced  # the new groups/ entry in its parent
    assert tmp_path / GROUPS_DIR in synced  # LMDB's new data.mdb/lock.mdb entries
    synced.clear()
    GroupStore(tmp_path).close()  # a reopen syncs again: a crash may have hit before the first sync
    assert tmp_path in synced and tmp_path / GROUPS_DIR in synced


def test_unusable_groups_path_raises_storage_error(tmp_path: Path) -> None:
    (tmp_path / GROUPS_DIR).write_bytes(b"not a directory")
    with pytest.raises(errors.StorageError):
        GroupStore(tmp_path)
