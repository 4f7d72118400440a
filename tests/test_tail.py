from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import seglog
from seglog import errors
from tests.helpers import make_records


def test_tail_yields_existing_then_new_records(run, data_dir: Path) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", shards=2)
            await db.append(make_records(5), shard=1)
            got: list[seglog.Record] = []
            seen_five = asyncio.Event()
            seen_all = asyncio.Event()

            async def consume() -> None:
                async for rec in db.tail(1, 2):
                    got.append(rec)
                    if len(got) == 3:
                        seen_five.set()
                    if len(got) == 5:
                        seen_all.set()
                        return

            task = asyncio.create_task(consume())
            await asyncio.wait_for(seen_five.wait(), 10)
            assert [r.offset for r in got] == [2, 3, 4]
            assert db._active_tails == 1  # waiting for new records
            await db.append(make_records(3), shard=0)  # another shard: no record for us
            await db.append(make_records(2, start=100), shard=1)
            await asyncio.wait_for(seen_all.wait(), 10)
            await asyncio.wait_for(task, 10)
            assert [r.offset for r in got] == [2, 3, 4, 5, 6]
            assert got[-1].value == make_records(2, start=100)[1].value
            assert db._active_tails == 0

    run(main())


def test_tail_cancellation_and_close_clean_up(run, data_dir: Path) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t")
            waiting = asyncio.Event()

            async def consume() -> list[int]:
                out = []
                async for table in db.tail_arrow(0, 0, max_records=10):
                    out.extend(table.column("offset").to_pylist())
                    waiting.set()
                return out

            await db.append(make_records(3))
            task = asyncio.create_task(consume())
            await asyncio.wait_for(waiting.wait(), 10)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert db._active_tails == 0
            assert all(not e._waiters for e in db._wakeups.values())  # no leaked waiters
            # Closing the database ends a waiting tail.
            waiting.clear()
            task = asyncio.create_task(consume())
            await asyncio.wait_for(waiting.wait(), 10)
            await db.close()
            assert await asyncio.wait_for(task, 10) == [0, 1, 2]
            assert db._active_tails == 0
            with pytest.raises(errors.ClosedResourceError):
                db.tail_arrow(0, 0).__aiter__().__anext__().send(None)

    run(main())


def test_tail_below_start_raises(run, data_dir: Path) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t")
            await db.append(make_records(10))
            await db.truncate_before(0, 5)
            with pytest.raises(errors.OffsetOutOfRange):
                async for _ in db.tail(0, 1):
                    pass

    run(main())
