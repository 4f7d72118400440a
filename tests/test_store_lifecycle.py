from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import seglog
from seglog import errors
from tests.helpers import make_records, segment_files


def test_configure_mutable_durable_and_immutable_rejected(run, data_dir: Path) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("c", shards=2, segment_bytes=1 << 20)
            new = await db.configure(
                retention_bytes=10_000, retention_ms=5000, segment_bytes=4096, max_record_bytes=100
            )
            assert new.retention_bytes == 10_000 and db.config.segment_bytes == 4096
            with pytest.raises(errors.RecordTooLarge):
                await db.append([seglog.Record(topic="a", value=b"x" * 101)])
            for i in range(0, 400, 50):
                await db.append(make_records(50, start=i), shard=0)
            assert len(segment_files(data_dir, "c", 0)) > 1  # the new segment size applies
            with pytest.raises(errors.ConfigMismatch):
                await db.configure(shards=3)
            with pytest.raises(errors.ConfigMismatch):
                await db.configure(engine="lmdb", retention_ms=1)
            with pytest.raises(errors.InvalidArgument):
                await db.configure(bogus=1)
            with pytest.raises(errors.InvalidArgument):
                await db.configure(retention_ms=-1)
            assert db.config.retention_ms == 5000  # rejected calls changed nothing
            await db.configure(shards=2)  # same value: fine
        async with seglog.open(data_dir) as store:
            db = await store.open_db("c")
            assert (db.config.retention_bytes, db.config.retention_ms, db.config.segment_bytes) == (
                10_000,
                5000,
                4096,
            )
            assert db.config.max_record_bytes == 100

    run(main())


def test_drop_db_closes_and_removes(run, data_dir: Path) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("a")
            await store.create_db("b")
            await db.append(make_records(100))
            await db.commit("g", 0, 5)
            assert store.list_dbs() == ["a", "b"]
            await store.drop_db("a")
            assert store.list_dbs() == ["b"]
            assert not (data_dir / "dbs" / "a").exists()
            assert [p.name for p in (data_dir / "dbs").iterdir()] == ["b"]  # no tombstone left
            with pytest.raises(errors.ClosedResourceError):
                await db.append(make_records(1))
            with pytest.raises(errors.ClosedResourceError):
                await db.read(0, 0)
            with pytest.raises(errors.DatabaseNotFound):
                await store.drop_db("a")
            with pytest.raises(errors.DatabaseNotFound):
                await store.open_db("a")
            for bad in ("../b", "..", "b/../b", "/etc", ".b", "", "a\x00"):
                with pytest.raises(errors.InvalidName):
                    await store.drop_db(bad)
                with pytest.raises(errors.InvalidName):
                    await store.open_db(bad)
            assert store.list_dbs() == ["b"]
            a2 = await store.create_db("a")  # the name is free again, empty
            assert a2.end_offset(0) == 0 and await a2.committed("g", 0) is None
        async with seglog.open(data_dir) as store:
            assert store.list_dbs() == ["a", "b"]

    run(main())


def test_drop_db_waits_for_inflight_appends(run, data_dir: Path) -> None:
    import asyncio

    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("busy", shards=4)
            appends = [asyncio.ensure_future(db.append(make_records(200, start=i * 200))) for i in range(10)]
            await asyncio.sleep(0)  # let them queue their frames
            await store.drop_db("busy")
            results = await asyncio.gather(*appends, return_exceptions=True)
            for r in results:
                assert isinstance(r, (seglog.AppendResult, errors.ClosedResourceError)), r
            assert store.list_dbs() == []

    run(main())


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe", b"[1, 2]", b'{"format": 99}'])
def test_corrupt_store_file_is_a_storage_error_and_releases_the_lock(
    run, data_dir: Path, content: bytes
) -> None:
    async def create() -> None:
        async with seglog.open(data_dir):
            pass

    run(create())
    good = (data_dir / "seglog.json").read_bytes()
    (data_dir / "seglog.json").write_bytes(content)

    async def open_bad() -> None:
        with pytest.raises(errors.StorageError, match=r"seglog\.json|store format"):
            await seglog.open(data_dir)

    run(open_bad())
    (data_dir / "seglog.json").write_bytes(good)

    async def open_again() -> None:
        async with seglog.open(data_dir) as store:  # not StoreLocked: the failed open let go
            assert store.list_dbs() == []

    run(open_again())


def test_index_lookup_failures_are_storage_errors(tmp_path: Path) -> None:
    from seglog.index import DbIndex

    db_index = DbIndex(tmp_path / "index")
    index = db_index.shard(3)
    db_index.close()  # LMDB raises on a closed environment: it must come out as StorageError
    for call in (
        lambda: index.floor(0),
        lambda: index.key_frames(b"k"),
        lambda: index.time_lower_bound(0),
        lambda: index.tag_frames(1),
    ):
        with pytest.raises(errors.StorageError):
            call()


def test_create_db_over_a_file_is_a_storage_error_and_keeps_the_file(run, data_dir: Path) -> None:
    """A file where the database's directory goes: ``StorageError`` (not a raw ``OSError``),
    the file untouched, no staging directory left, and the name free once the file is gone."""

    async def main() -> None:
        async with seglog.open(data_dir) as store:
            blocker = data_dir / "dbs" / "blocked"
            blocker.write_bytes(b"not a database")
            with pytest.raises(errors.StorageError, match="cannot create database 'blocked'") as info:
                await store.create_db("blocked", shards=1, exist_ok=True)
            assert isinstance(info.value.__cause__, OSError)
            assert blocker.read_bytes() == b"not a database"
            assert sorted(p.name for p in (data_dir / "dbs").iterdir()) == ["blocked"]
            assert store.list_dbs() == []
            blocker.unlink()
            db = await store.create_db("blocked", shards=1)
            await db.append([seglog.Record(topic="t/1", value=b"v")], shard=0)
            assert store.list_dbs() == ["blocked"]

    run(main())


def test_a_failed_retention_run_does_not_end_retention(
    run, data_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The store runs retention every ``retention_interval_ms``: a run that raises something
    unexpected is logged, and the next run still comes (the task used to end for good)."""
    calls = 0
    second_run = asyncio.Event()

    async def flaky(self: seglog.Database) -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("injected retention failure")
        second_run.set()
        return 0

    monkeypatch.setattr(seglog.Database, "enforce_retention", flaky)

    async def main() -> None:
        async with seglog.open(data_dir, retention_interval_ms=10) as store:
            await store.create_db("t", shards=1)
            async with asyncio.timeout(10):
                await second_run.wait()

    with caplog.at_level("ERROR", logger="seglog.store"):
        run(main())
    assert calls >= 2
    assert any("injected retention failure" in str(r.exc_info[1]) for r in caplog.records if r.exc_info)
