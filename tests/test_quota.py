from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

import seglog
from seglog import errors
from tests.helpers import T0, make_records, read_all


def test_quota_rejects_then_recovers_after_freeing(run, data_dir: Path) -> None:
    async def main() -> None:
        async with seglog.open(data_dir, quota_bytes=200_000) as store:
            db = await store.create_db("q", shards=2, segment_bytes=8192)
            written = 0
            with pytest.raises(errors.QuotaExceeded):
                for i in range(10_000):
                    await db.append(make_records(20, start=i * 20))
                    written += 20
            assert written > 0
            ends = [db.end_offset(s) for s in range(2)]
            assert sum(ends) == written  # the rejected append wrote nothing, on no shard
            assert store.used_bytes <= 200_000
            # Reads keep working.
            assert len(await read_all(db, 0)) == ends[0]
            with pytest.raises(errors.QuotaExceeded):
                await db.append_arrow(
                    pa.table(
                        {
                            "ts": pa.array([T0] * 100, pa.int64()),
                            "topic": ["a/b"] * 100,
                            "key": pa.array([None] * 100, pa.binary()),
                            "value": [b"v" * 1000] * 100,
                        }
                    )
                )
            assert [db.end_offset(s) for s in range(2)] == ends
            # Free space: truncate one shard, retention on the other; writes resume.
            await db.truncate_before(0, ends[0])
            await db.configure(retention_bytes=0)
            await db.enforce_retention()
            m = await db.append(make_records(20, start=10**6))
            assert len(m) == 20
        async with seglog.open(data_dir, quota_bytes=200_000) as store:
            assert 0 < store.used_bytes <= 200_000  # re-measured from the files
            db = await store.open_db("q")
            await db.append(make_records(5))

    run(main())


def test_drop_db_frees_quota(run, data_dir: Path) -> None:
    async def main() -> None:
        async with seglog.open(data_dir, quota_bytes=150_000) as store:
            big = await store.create_db("big", segment_bytes=8192)
            with pytest.raises(errors.QuotaExceeded):
                for i in range(10_000):
                    await big.append(make_records(50, start=i * 50))
            other = await store.create_db("other")
            with pytest.raises(errors.QuotaExceeded):
                await other.append(make_records(50))
            await store.drop_db("big")
            assert len(await other.append(make_records(50))) == 50

    run(main())
