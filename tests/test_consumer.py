"""db.consumer(): every shard, per-shard positions, group commits, live waiting without polling."""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path

import pytest

import seglog
from seglog import errors
from tests.helpers import T0


def recs(n: int, start: int = 0, ts0: int = T0) -> list[seglog.Record]:
    return [seglog.Record(topic=f"t/{i % 11}", value=b"%d" % i, ts=ts0 + i) for i in range(start, start + n)]


def test_reads_every_shard_and_resumes_from_group_commits(run, data_dir: Path) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", shards=4)
            metas = await db.append(recs(500))
            assert len(set(metas.shards.tolist())) > 1
            c = db.consumer("g")
            got = await c.getmany(max_records=300)
            assert sum(map(len, got.values())) == 300
            for shard, rs in got.items():
                assert [r.shard for r in rs] == [shard] * len(rs)
                assert [r.offset for r in rs] == list(range(len(rs)))
                assert c.position(shard) == len(rs)
            await c.commit()
            assert {s: await c.committed(s) for s in got} == {s: len(rs) for s, rs in got.items()}
            await c.close()
            again = db.consumer("g")
            rest = await again.getmany(max_records=10_000)
            values = sorted(int(r.value) for rs in (*got.values(), *rest.values()) for r in rs)
            assert values == list(range(500))
            assert await again.getmany(timeout_ms=10) == {}
            with pytest.raises(errors.InvalidArgument, match="no group"):
                await db.consumer().commit()

    run(main())


def test_iterates_live_across_shards_and_ends_when_the_db_closes(run, data_dir: Path) -> None:
    async def main() -> None:
        store = await seglog.open(data_dir)
        db = await store.create_db("t", shards=3)
        await db.append(recs(5))
        seen: list[int] = []
        got_all = asyncio.Event()
        consumer = db.consumer(from_="latest")
        await consumer.start()

        async def consume() -> None:
            async for rec in consumer:
                seen.append(int(rec.value))
                if len(seen) == 20:
                    got_all.set()

        task = asyncio.create_task(consume())
        await db.append(recs(20, start=100))  # woken by the append, not a poll
        await asyncio.wait_for(got_all.wait(), 10)
        assert sorted(seen) == list(range(100, 120))
        await store.close()
        await asyncio.wait_for(task, 10)  # the iteration ended

    run(main())


def test_start_positions_by_time_and_mapping_and_reset_below_start(run, data_dir: Path) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", shards=2, segment_bytes=4096)
            await db.append(recs(400), shard=0)
            await db.append(recs(10), shard=1)
            when = dt.datetime.fromtimestamp((T0 + 300) / 1e6, tz=dt.UTC)
            c = db.consumer(from_=when)
            got = await c.getmany()
            assert got[0][0].offset == 300 and 1 not in got
            c2 = db.consumer(from_={0: 398, 1: 9})
            got2 = await c2.getmany()
            assert [r.offset for r in got2[0]] == [398, 399] and [r.offset for r in got2[1]] == [9]
            c3 = db.consumer()
            await c3.start()
            await db.truncate_before(0, 200)
            first = await c3.getone()
            assert (first.shard, first.offset) in ((0, db.start_offset(0)), (1, 0))
            with pytest.raises(errors.InvalidArgument):
                db.consumer(from_=5)  # type: ignore[arg-type]

    run(main())
