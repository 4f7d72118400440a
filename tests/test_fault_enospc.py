"""A full disk (real ENOSPC on a small ext4): a failed write leaves no trace, writes resume by themselves."""

from __future__ import annotations

import asyncio
import logging
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import seglog
from seglog.errors import AppendFailed, StorageError
from tests.faults import ext4_fs
from tests.helpers import read_all


def _records(n: int, *, start: int = 0, value_bytes: int = 1000) -> list[seglog.Record]:
    return [
        seglog.Record(
            topic=f"t/{i % 5}",
            value=(b"%09d" % i) * (value_bytes // 9),
            ts=1_700_000_000_000_000 + i,
            key=b"k%d" % (i % 20),
        )
        for i in range(start, start + n)
    ]


def _values(recs: list[seglog.Record]) -> list[bytes]:
    return [r.value for r in recs]


async def _reopened_values(data: Path) -> list[bytes]:
    """The values of shard 0 of database ``t`` after reopening the store (end offset checked)."""
    async with seglog.open(data) as store:
        db = await store.open_db("t")
        values = _values(await read_all(db, 0))
        assert db.end_offset(0) == len(values)
        return values


def test_failed_append_across_a_roll_leaves_no_trace_and_writes_resume(run, tmp_path: Path) -> None:
    """The 20,000-record append of the issue: it fails after a roll; nothing of it survives."""
    with ext4_fs(tmp_path, size_mib=48) as fs:
        data = fs.mount / "data"

        async def main() -> None:
            async with seglog.open(data, quota_bytes=1 << 30) as store:
                db = await store.create_db("t", segment_bytes=1 << 20)
                await db.append(_records(100), shard=0)
                used_before = store.used_bytes
                # ~20 MB in frames of 8,000 records (8 MB each): the first fits, the second runs out.
                fs.fill(leave_bytes=12 << 20)
                with pytest.raises(AppendFailed) as err:
                    await db.append(_records(20_000, start=100), shard=0)
                assert isinstance(err.value.__cause__, StorageError)
                assert err.value.failed.keys() == {0}
                assert db.end_offset(0) == 100
                assert store.used_bytes == used_before, "quota bytes of the failed append are given back"
                assert _values(await read_all(db, 0)) == _values(_records(100))
                # Space comes back: the same shard takes writes again, no reopen needed.
                fs.unfill()
                res = await db.append(_records(20_000, start=100), shard=0)
                assert res[0].offset == 100
                assert db.end_offset(0) == 20_100

        run(main())

        assert run(_reopened_values(data)) == _values(_records(20_100))


def test_failed_append_is_gone_after_reopen_without_a_retry(run, tmp_path: Path) -> None:
    with ext4_fs(tmp_path, size_mib=48) as fs:
        data = fs.mount / "data"

        async def main() -> None:
            async with seglog.open(data) as store:
                db = await store.create_db("t", segment_bytes=1 << 20)
                await db.append(_records(50), shard=0)
                fs.fill(leave_bytes=12 << 20)
                with pytest.raises(StorageError):
                    await db.append(_records(20_000, start=50), shard=0)

        run(main())
        fs.unfill()

        async def reopen() -> None:
            async with seglog.open(data) as store:
                db = await store.open_db("t")
                assert db.end_offset(0) == 50, "a reported failure must not come back after reopen"
                # A retry does not duplicate: offsets continue at 50.
                res = await db.append(_records(10, start=50), shard=0)
                assert res[0].offset == 50
                assert _values(await read_all(db, 0)) == _values(_records(60))

        run(reopen())


def test_partial_write_in_one_segment_and_queued_appends_behind_it(run, tmp_path: Path) -> None:
    """A short pwritev mid-frame; appends queued behind the failure fail too, later ones continue."""
    with ext4_fs(tmp_path, size_mib=24) as fs:
        data = fs.mount / "data"

        async def main() -> None:
            async with seglog.open(data, io_workers=1) as store:
                db = await store.create_db("t", segment_bytes=64 << 20)
                await db.append(_records(10), shard=0)
                fs.fill(leave_bytes=2 << 20)
                big = db.append(_records(5_000, start=10, value_bytes=900), shard=0)  # ~4.5 MB
                small = db.append(_records(3, start=99_000), shard=0)  # offsets assigned behind it
                results = await asyncio.gather(big, small, return_exceptions=True)
                assert all(isinstance(r, StorageError) for r in results), results
                assert db.end_offset(0) == 10
                fs.unfill()
                res = await db.append(_records(5, start=10), shard=0)
                assert res[0].offset == 10, "offsets continue at the durable end"
                assert _values(await read_all(db, 0)) == _values(_records(15))

        run(main())

        assert run(_reopened_values(data)) == _values(_records(15))


def test_multi_shard_append_reports_which_parts_failed(run, tmp_path: Path) -> None:
    """Routed appends are atomic per shard: the error says what was written, the rest is gone."""
    with ext4_fs(tmp_path, size_mib=48) as fs:
        data = fs.mount / "data"

        async def main() -> tuple[dict[int, int], list[int]]:
            async with seglog.open(data) as store:
                db = await store.create_db("t", shards=4, segment_bytes=1 << 20)
                fs.fill(leave_bytes=6 << 20)
                with pytest.raises(AppendFailed) as err:
                    await db.append(_records(20_000, value_bytes=1000))  # ~5 MB per shard
                assert err.value.failed
                for shard in err.value.failed:
                    assert db.end_offset(shard) == 0
                for shard, base in err.value.written.items():
                    assert base == 0 and db.end_offset(shard) > 0
                return err.value.written, [db.end_offset(s) for s in range(4)]

        written, ends = run(main())
        fs.unfill()

        async def reopen() -> None:
            async with seglog.open(data) as store:
                db = await store.open_db("t")
                assert [db.end_offset(s) for s in range(4)] == ends
                assert {s for s in range(4) if db.end_offset(s)} == set(written)

        run(reopen())


def test_full_index_filesystem_loses_no_read_key_results(run, tmp_path: Path, caplog) -> None:
    """The index lives on its own full disk: appends succeed, ``read_key`` stays exact."""
    data = tmp_path / "data"

    async def create() -> None:
        async with seglog.open(data) as store:
            await store.create_db("t", index_interval_bytes=256)

    run(create())
    index_dir = data / "dbs" / "t" / "index"
    for f in index_dir.iterdir():
        f.unlink()
    with ext4_fs(tmp_path, size_mib=8) as fs:
        subprocess.run(["mount", "--bind", str(fs.mount), str(index_dir)], check=True)
        try:

            async def main() -> None:
                async with seglog.open(data) as store:
                    db = await store.open_db("t")
                    await db.append(_records(200, value_bytes=20))
                    fs.fill(leave_bytes=0)
                    caplog.set_level(logging.WARNING)
                    for i in range(200, 20_200, 1000):
                        await db.append(_records(1000, start=i, value_bytes=20))
                    # Index entries wait in the worker's backlog for a few drains: write them.
                    await db._engine.drain()
                    assert any("index write failed" in r.getMessage() for r in caplog.records), (
                        "the index filesystem did not fill up: the test proves nothing"
                    )
                    want = [r.offset for r in await read_all(db, 0) if r.key == b"k7"]
                    got = [r.offset for r in await db.read_key(0, b"k7")]
                    assert got == want and len(want) == 1010
                    fs.unfill()
                    await db.append(_records(10, start=20_200, value_bytes=20))  # the index catches up
                    got = [r.offset for r in await db.read_key(0, b"k7")]
                    assert got == [*want, 20_207]

            run(main())

            async def reopen() -> None:
                async with seglog.open(data) as store:
                    db = await store.open_db("t")
                    got = [r.offset for r in await db.read_key(0, b"k7")]
                    assert len(got) == 1011 and got[-1] == 20_207

            run(reopen())
        finally:
            subprocess.run(["umount", str(index_dir)], check=False)


def test_group_commit_on_a_full_disk_fails_cleanly(run, tmp_path: Path) -> None:
    with ext4_fs(tmp_path, size_mib=16) as fs:
        data = fs.mount / "data"

        async def main() -> None:
            async with seglog.open(data) as store:
                db = await store.create_db("t")
                await db.append(_records(10, value_bytes=10))
                await db.commit("g", 0, 3)
                fs.fill(leave_bytes=0)
                failed = 0
                for i in range(5000):  # LMDB grows its file in pages: fill them until one fails
                    try:
                        await db.commit(f"g{i:05d}-{'x' * 100}", 0, 5)
                    except StorageError:
                        failed += 1
                        break
                assert failed, "the group store never hit ENOSPC: the test proves nothing"
                assert await db.committed("g", 0) == 3
                fs.unfill()
                await db.commit("g", 0, 7)
                assert await db.committed("g", 0) == 7

        run(main())


def test_local_tier_on_a_full_disk_keeps_local_segments_and_resumes(run, tmp_path: Path) -> None:
    """Tiering to a full local tier fails with TierError; nothing local is deleted; it resumes."""
    from seglog.errors import TierError

    with ext4_fs(tmp_path, size_mib=16) as fs:
        tier = fs.mount / "tier"
        data = tmp_path / "data"

        async def main() -> None:
            async with seglog.open(data, tier=tier.as_uri(), retention_interval_ms=None) as store:
                db = await store.create_db("t", segment_bytes=64 << 10, local_retention_bytes=0)
                await db.append(_records(2_000, value_bytes=200), shard=0)
                await db.seal(0)
                fs.fill(leave_bytes=0)
                with pytest.raises(TierError):
                    await db.tier_now()
                assert db.local_start_offset(0) == 0, "no local segment may go before its upload is verified"
                assert _values(await read_all(db, 0)) == _values(_records(2_000, value_bytes=200))
                fs.unfill()
                assert await db.tier_now()
                assert db.local_start_offset(0) > 0
                assert _values(await read_all(db, 0)) == _values(_records(2_000, value_bytes=200))

        run(main())


def test_a_deadline_flush_failing_on_a_full_disk_is_retried_while_appends_go_on(
    run, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Rows of appends to several shards are durable in the journal; their deadline flush into
    the segments fails while the disk is full. The worker keeps serving appends between the
    retries (it used to retry in a loop that never returned to its queue: every later request
    hung, and close), and once space is back the rows reach their segments."""
    shards = np.array([0, 1], np.int32)

    def table(i: int) -> pa.Table:
        return pa.table(
            {
                "ts": pa.array([1_700_000_000_000_000 + i] * 2, pa.int64()),
                "topic": pa.array(["a/b", "a/c"]),
                "value": pa.array([b"%06d" % i + b"x" * 1000] * 2, pa.binary()),
            }
        )

    with ext4_fs(tmp_path, size_mib=48) as fs:
        data = fs.mount / "data"

        async def main() -> None:
            async with seglog.open(data, buffer_ms=20) as store:
                db = await store.create_db("t", shards=2)
                await db.append_arrow(table(0), shards=shards)
                fs.fill(leave_bytes=0)
                with caplog.at_level(logging.WARNING, logger="seglog.engines.segment"):
                    for i in range(1, 150):  # into the journal; each waits for the worker
                        await asyncio.wait_for(db.append_arrow(table(i), shards=shards), 30)
                    assert [db.end_offset(s) for s in (0, 1)] == [150, 150]
                assert "writing buffered rows into a segment failed" in caplog.text
                fs.unfill()

        run(main())

        async def reopen() -> None:
            async with seglog.open(data) as store:
                db = await store.open_db("t")
                for s in (0, 1):
                    assert [v[:6] for v in _values(await read_all(db, s))] == [
                        b"%06d" % i for i in range(150)
                    ]

        run(reopen())
