"""``seglog.cluster.shared_reads``: concurrent stream reads at one position share one read,
on a real embedded database; a reader that goes away does not cancel it for the others, and
a failed read fails every reader that shared it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import seglog
from seglog.cluster.shared_reads import SharedReads
from seglog.errors import ForeignIterator

TS0 = 1_700_000_000_000_000


def test_concurrent_reads_share_and_failures_reach_every_reader(tmp_path: Path) -> None:
    async def main() -> None:
        started: list[tuple[str, bool]] = []
        all_in = asyncio.Event()

        def on_read(db: str, joined: bool) -> None:
            started.append((db, joined))
            if len(started) == 4:
                all_in.set()

        shared = SharedReads(on_read)
        async with seglog.open(tmp_path / "data") as store:
            db = await store.create_db("d", 1, lts_thresholds=[100, 10])
            other = await store.create_db("e", 1, lts_thresholds=[100, 10])
            await db.append([seglog.Record(f"site/{i}/t", b"v%d" % i, ts=TS0 + i) for i in range(5)])
            (stream,) = db.get_streams("site/1/t", 0)
            it = db.make_iterator(stream, "site/1/t", 0)
            reads = [asyncio.ensure_future(shared.next_arrow(db, it, 10, 5)) for _ in range(4)]
            await asyncio.wait_for(all_in.wait(), 10)  # every reader has joined the one read
            reads[0].cancel()  # its reader went away: the read goes on for the others
            results = await asyncio.gather(*reads[1:])
            assert reads[0].cancelled()
            for moved, table in results:
                assert table.column("value").to_pylist() == [b"v1"] and moved.position == 5
            assert [j for _, j in started] == [False, True, True, True]
            assert shared.in_flight == 0
            # Another database's iterator: the one read fails, and so does every reader of it.
            bad = [asyncio.ensure_future(shared.next_arrow(other, it, 10, 0)) for _ in range(3)]
            for outcome in await asyncio.gather(*bad, return_exceptions=True):
                assert isinstance(outcome, ForeignIterator)
            assert shared.in_flight == 0
            # Not in flight any more: the next read is a read of its own.
            await shared.next_arrow(db, it, 10, 5)
            assert started[-1] == ("d", False)

    asyncio.run(main())


def test_different_budgets_or_bounds_do_not_share(tmp_path: Path) -> None:
    async def main() -> None:
        shared = SharedReads()
        async with seglog.open(tmp_path / "data") as store:
            db = await store.create_db("d", 1, lts_thresholds=[100, 10])
            await db.append([seglog.Record("a/b", b"%d" % i, ts=TS0 + i) for i in range(6)])
            (stream,) = db.get_streams("a/b", 0)
            it = db.make_iterator(stream, "a/b", 0)
            a, b, c = await asyncio.gather(
                shared.next_arrow(db, it, 2, 6),
                shared.next_arrow(db, it, 10, 6),
                shared.next_arrow(db, it, 10, 3),
            )
            assert [len(t) for _, t in (a, b, c)] == [2, 6, 3]

    asyncio.run(main())


def test_readers_one_after_another_read_for_themselves(tmp_path: Path) -> None:
    async def main() -> None:
        seen: list[bool] = []
        shared = SharedReads(lambda _db, joined: seen.append(joined))
        async with seglog.open(tmp_path / "data") as store:
            db = await store.create_db("d", 1, lts_thresholds=[100, 10])
            await db.append([seglog.Record("a/b", b"x", ts=TS0)])
            (stream,) = db.get_streams("a/b", 0)
            for _ in range(2):
                await shared.next_arrow(db, db.make_iterator(stream, "a/b", 0), 10, 1)
            assert seen == [False, False]

    asyncio.run(main())
