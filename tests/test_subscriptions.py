"""Subscriptions: push delivery with flow control, one read for many subscribers (issue 14, item 5)."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import seglog
from seglog import Iterator, Record, Subscription, SubscriptionBatch
from seglog.errors import (
    ClosedResourceError,
    ForeignIterator,
    InvalidArgument,
    SubackOutOfRange,
    UnknownStream,
)
from seglog.topics import topic_matches

WAIT_S = 10.0


async def take(sub: Subscription) -> SubscriptionBatch:
    """The next batch, failing the test instead of hanging."""
    return await asyncio.wait_for(anext(sub), WAIT_S)


async def head_iterator(db: seglog.Database, topic_filter: str) -> Iterator:
    """An iterator past everything the (single) matching stream holds now."""
    (stream,) = db.get_streams(topic_filter)
    return await head_of(db, stream, topic_filter)


def values(batch: SubscriptionBatch) -> list[bytes]:
    return [r.value for r in batch.records]


# --- t_21_subscription ---------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["segment", "memory", "lmdb"])
def test_subscription_delivers_in_order_with_cumulative_seqnos(run, data_dir: Path, engine: str) -> None:
    """EMQX's t_21: `t/1` and `t/2` share a stream, `t` has its own; seqnos count records."""

    async def go() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t21", engine=engine, lts_thresholds=[1000, 0])
            await db.append([Record("t/1", b"0"), Record("t", b"x")])
            streams = db.get_streams("t/+")
            assert [s.pattern for s in streams] == ["t/+"]
            sub = db.subscribe(db.make_iterator(streams[0], "t/+"), max_unacked=100)
            async with sub:
                b = await take(sub)  # what the stream held already
                assert (b.seqno, values(b), b.lagging) == (1, [b"0"], True)
                await db.append(
                    [Record("t/2", b"1"), Record("t", b"y"), Record("t/1", b"2"), Record("t/3", b"3")]
                )
                b = await take(sub)
                assert (b.seqno, values(b)) == (4, [b"1", b"2", b"3"])
                assert [r.topic for r in b.records] == ["t/2", "t/1", "t/3"]
                assert b.iterator.position == 6 and len(b) == 3
                sub.suback(4)
                await db.append([Record("t/9", b"4")])
                await db.append([Record("t/8", b"5")])
                got = [await take(sub)]
                if got[0].seqno == 5:
                    got.append(await take(sub))
                assert got[-1].seqno == 6
                assert [v for x in got for v in values(x)] == [b"4", b"5"]
                assert (sub.seqno, sub.acked, sub.unacked, sub.lagging) == (6, 4, 2, False)
                # Offsets and shards are set, as db.next gives them.
                assert [(r.shard, r.offset) for x in got for r in x.records] == [(0, 6), (0, 7)]
            # Unsubscribed: the iteration is over and nothing more is read for it.
            assert sub.closed
            with pytest.raises(StopAsyncIteration):
                await anext(sub)
            stats = db.subscription_stats()
            assert (stats.subscriptions, stats.beams) == (0, 0)
            reads = stats.shared_reads + stats.catchup_reads
            await db.append([Record("t/1", b"after")])
            after = db.subscription_stats()
            assert after.shared_reads + after.catchup_reads == reads

    run(go())


def test_the_window_caps_unacked_records_across_many_appends(run, data_dir: Path) -> None:
    async def go() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("win", lts_thresholds=[1000, 0])
            await db.append([Record("w/0", b"start")])
            it = await head_iterator(db, "w/+")
            window = 7
            sub = db.subscribe(it, max_unacked=window)
            sizes = [1 + (i * 5) % 13 for i in range(60)]
            expected = [b"%d" % i for i in range(sum(sizes))]

            async def produce() -> None:
                n = 0
                for size in sizes:
                    await db.append([Record(f"w/{(n + j) % 4}", b"%d" % (n + j)) for j in range(size)])
                    n += size

            producer = asyncio.create_task(produce())
            got: list[bytes] = []
            last = 0
            while len(got) < len(expected):
                b = await take(sub)
                assert b.seqno == last + len(b) and len(b) >= 1
                last = b.seqno
                assert sub.unacked <= window and b.seqno - sub.acked <= window
                got.extend(values(b))
                if len(got) % 3 == 0 or sub.stuck:  # ack late, in varied steps
                    sub.suback(b.seqno)
            await producer
            assert got == expected, "every record exactly once, in order"
            assert db.subscription_stats().records_delivered == len(expected)
            await sub.close()

    run(go())


def test_a_full_window_parks_the_subscription_until_suback(run, data_dir: Path) -> None:
    """EMQX's t_sub_slow with window 3: seqno 1, then 3 (stuck), then 5 after suback(3)."""

    async def go() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("slow", lts_thresholds=[1000, 0])
            await db.append([Record("s/0", b"-")])
            async with db.subscribe(await head_iterator(db, "s/+"), max_unacked=3) as sub:
                await db.append([Record("s/1", b"a")])
                b = await take(sub)
                assert (b.seqno, values(b), sub.stuck) == (1, [b"a"], False)
                await db.append(
                    [Record("s/1", b"b"), Record("s/2", b"c"), Record("s/3", b"d"), Record("s/4", b"e")]
                )
                b = await take(sub)
                assert (b.seqno, values(b)) == (3, [b"b", b"c"])
                assert sub.stuck and sub.unacked == 3
                # Only a suback lets the rest through: its seqno says nothing more came before.
                sub.suback(3)
                b = await take(sub)
                assert (b.seqno, values(b), b.lagging) == (5, [b"d", b"e"], True)

    run(go())


# --- the shared read -----------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["segment", "memory", "lmdb"])
def test_subscribers_at_the_head_share_one_read_per_append(run, data_dir: Path, engine: str) -> None:
    async def go() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("beam", engine=engine, lts_thresholds=[1000, 0])
            await db.append([Record("m/0", b"-")])
            it = await head_iterator(db, "m/+")
            subs = [db.subscribe(it, max_unacked=1000) for _ in range(10)]
            appends = 30
            got: list[list[bytes]] = [[] for _ in subs]
            before = db.subscription_stats()
            for k in range(appends):
                await db.append([Record(f"m/{k % 5}", b"%d/%d" % (k, j)) for j in range(k % 4 + 1)])
                for i, sub in enumerate(subs):
                    b = await take(sub)
                    assert not b.lagging
                    got[i].extend(values(b))
                    sub.suback(b.seqno)
            after = db.subscription_stats()
            assert all(g == got[0] for g in got), "every subscriber got the same data"
            assert len(got[0]) == sum(k % 4 + 1 for k in range(appends))
            # One read per append for all ten (a read per subscriber would be 10 x 30).
            shared = after.shared_reads - before.shared_reads
            catchup = after.catchup_reads - before.catchup_reads
            assert shared + catchup <= appends + 2, (shared, catchup)
            assert shared >= 1 and after.beams == 1 and after.subscriptions == 10
            assert all(not s.lagging and s.joins == 1 for s in subs)
            for sub in subs:
                await sub.close()

    run(go())


def test_members_with_different_filters_share_the_stream_read(run, data_dir: Path) -> None:
    async def go() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("f", lts_thresholds=[100, 0, 100])
            await db.append([Record("n/dev0/temp", b"-")])
            (stream,) = db.get_streams("n/+/temp")
            head = await head_iterator(db, "n/+/temp")
            filters = ["n/+/temp", "n/dev1/temp", "n/dev2/#", "n/dev1/temp"]
            subs = [
                db.subscribe(
                    dataclasses.replace(db.make_iterator(stream, f), position=head.position), max_unacked=50
                )
                for f in filters
            ]
            sent: list[Record] = []
            before = db.subscription_stats().shared_reads
            for k in range(8):
                batch = [Record(f"n/dev{(k + j) % 3}/temp", b"%d.%d" % (k, j)) for j in range(3)]
                sent.extend(batch)
                await db.append(batch)
                for f, sub in zip(filters, subs, strict=True):
                    if any(topic_matches(f, r.topic) for r in batch):
                        sub.suback((await take(sub)).seqno)
            for f, sub in zip(filters, subs, strict=True):
                assert sub.seqno == sum(topic_matches(f, r.topic) for r in sent), f
            assert db.subscription_stats().shared_reads - before <= 8 + 1
            for sub in subs:
                await sub.close()

    run(go())


def test_a_lagging_subscriber_catches_up_alone_and_rejoins(run, data_dir: Path) -> None:
    async def go() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("lag", lts_thresholds=[1000, 0])
            history = [Record(f"l/{i % 9}", b"h%d" % i) for i in range(2500)]
            for i in range(0, len(history), 100):
                await db.append(history[i : i + 100])
            (stream,) = db.get_streams("l/+")
            heads = [db.subscribe(await head_iterator(db, "l/+"), max_unacked=100) for _ in range(4)]
            laggard = db.subscribe(db.make_iterator(stream, "l/+"), max_unacked=300)
            live: list[bytes] = []
            head_got: list[list[bytes]] = [[] for _ in heads]
            lag_got: list[bytes] = []
            lag_batches: list[SubscriptionBatch] = []
            k = 0
            while laggard.lagging or len(lag_got) < len(history) + len(live):
                if k < 40:  # the head moves on while the laggard reads its history
                    new = [b"n%d" % k]
                    live.extend(new)
                    await db.append([Record("l/x", new[0])])
                    for i, sub in enumerate(heads):
                        b = await take(sub)
                        assert not b.lagging, "head subscribers stay on the shared path"
                        head_got[i].extend(values(b))
                        sub.suback(b.seqno)
                    k += 1
                if len(lag_got) < len(history) + len(live):
                    b = await take(laggard)
                    lag_batches.append(b)
                    lag_got.extend(values(b))
                    laggard.suback(b.seqno)
                elif laggard.lagging:  # everything read: it joins on the next step
                    await db.append([Record("l/x", b"n%d" % k)])
                    live.append(b"n%d" % k)
                    k += 1
                    for i, sub in enumerate(heads):
                        b = await take(sub)
                        head_got[i].extend(values(b))
                        sub.suback(b.seqno)
            assert lag_got == [r.value for r in history] + live, "everything exactly once, in order"
            assert all(g == live for g in head_got)
            assert not laggard.lagging and laggard.joins == 1
            assert lag_batches[0].lagging and max(len(b) for b in lag_batches) <= 300
            # After rejoining, one read serves all five.
            stats = db.subscription_stats()
            await db.append([Record("l/x", b"last")])
            for sub in [*heads, laggard]:
                b = await take(sub)
                assert values(b) == [b"last"] and not b.lagging
            after = db.subscription_stats()
            assert after.shared_reads - stats.shared_reads <= 2
            assert after.catchup_reads == stats.catchup_reads
            assert after.joins >= 5

    run(go())


def test_subscribers_at_the_same_position_share_their_catch_up(run, data_dir: Path) -> None:
    async def go() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("cu", lts_thresholds=[1000, 0])
            await db.append([Record(f"c/{i % 3}", b"%d" % i) for i in range(600)])
            (stream,) = db.get_streams("c/+")
            it = db.make_iterator(stream, "c/+")
            subs = [db.subscribe(it, max_unacked=10_000) for _ in range(8)]
            for sub in subs:
                b = await take(sub)
                assert len(b) == 600 and b.lagging
            stats = db.subscription_stats()
            assert stats.catchup_reads <= 2, "one catch-up read for eight subscribers at one iterator"

    run(go())


def test_one_subscriber_that_never_acks_does_not_stall_the_others(run, data_dir: Path) -> None:
    async def go() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("fair", lts_thresholds=[1000, 0])
            await db.append([Record("f/0", b"-")])
            it = await head_iterator(db, "f/+")
            slow = db.subscribe(it, max_unacked=3)
            fast = [db.subscribe(it, max_unacked=5) for _ in range(3)]
            expected: list[bytes] = []
            got: list[list[bytes]] = [[] for _ in fast]
            before = db.subscription_stats()
            for k in range(50):
                batch = [b"%d.%d" % (k, j) for j in range(k % 3 + 1)]
                expected.extend(batch)
                await db.append([Record("f/1", v) for v in batch])
                for i, sub in enumerate(fast):
                    while len(got[i]) < len(expected):
                        b = await take(sub)
                        got[i].extend(values(b))
                        sub.suback(b.seqno)
            assert all(g == expected for g in got)
            assert slow.unacked == 3 and slow.stuck and slow.lagging
            after = db.subscription_stats()
            assert after.shared_reads - before.shared_reads <= 50 + 2
            # The slow one gets its 3, then everything else once it acks.
            slow_got: list[bytes] = []
            while len(slow_got) < len(expected):
                b = await take(slow)
                slow_got.extend(values(b))
                assert slow.unacked <= 3
                slow.suback(b.seqno)
            assert slow_got == expected
            for sub in [slow, *fast]:
                await sub.close()

    run(go())


# --- wildcards, resuming ---------------------------------------------------------------------


def test_a_wildcard_subscription_is_one_subscription_per_stream(run, data_dir: Path) -> None:
    async def go() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("wild", shards=2, lts_thresholds=[100, 0, 100])
            topics = [
                f"{site}/dev{d}/{m}" for site in ("north", "south") for d in range(4) for m in ("temp", "rpm")
            ]
            await db.append([Record(t, b"seed") for t in topics])
            for f in ("+/+/temp", "north/#", "+/dev2/+"):
                streams = db.get_streams(f)
                assert len(streams) >= 2, f
                subs = [db.subscribe(await head_of(db, s, f), max_unacked=1000) for s in streams]
                sent: list[Record] = []
                for k in range(5):
                    batch = [Record(t, b"%s %d" % (t.encode(), k)) for t in topics]
                    sent.extend(batch)
                    await db.append(batch)
                total = 0
                for stream, sub in zip(streams, subs, strict=True):
                    want = [
                        r.value
                        for r in sent
                        if topic_matches(f, r.topic)
                        and topic_matches(stream.pattern, r.topic)
                        and db.shard_for(r.topic) == stream.shard
                    ]
                    got: list[Record] = []
                    while len(got) < len(want):
                        got.extend((await take(sub)).records)
                    assert [r.value for r in got] == want, (f, stream)
                    assert {r.shard for r in got} <= {stream.shard}
                    total += len(got)
                    await sub.close()
                assert total == sum(topic_matches(f, r.topic) for r in sent), f

    run(go())


async def head_of(db: seglog.Database, stream: seglog.Stream, topic_filter: str) -> Iterator:
    """An iterator past everything ``stream`` holds now."""
    it = db.make_iterator(stream, topic_filter)
    while True:
        it, table = await db.next_arrow(it, 10_000)
        if not table.num_rows:
            return it


def test_a_batch_iterator_resumes_the_subscription_after_a_restart(run, data_dir: Path) -> None:
    saved: dict[str, object] = {}

    async def first() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("res", lts_thresholds=[1000, 0])
            await db.append([Record(f"r/{i % 4}", b"%d" % i) for i in range(10)])
            (stream,) = db.get_streams("r/+")
            async with db.subscribe(db.make_iterator(stream, "r/+"), max_unacked=6) as sub:
                b = await take(sub)
                assert values(b) == [b"%d" % i for i in range(6)]
                saved["it"] = b.iterator.to_bytes()

    async def second() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.open_db("res")
            it = Iterator.from_bytes(saved["it"])  # type: ignore[arg-type]
            async with db.subscribe(it, max_unacked=100) as sub:
                b = await take(sub)
                assert values(b) == [b"%d" % i for i in range(6, 10)] and b.seqno == 4

    run(first())
    run(second())


# --- lifecycle and errors ------------------------------------------------------------------


def test_closing_the_database_ends_iteration_cleanly(run, data_dir: Path) -> None:
    async def go() -> None:
        store = await seglog.open(data_dir)
        try:
            db = await store.create_db("c", lts_thresholds=[1000, 0])
            await db.append([Record("c/1", b"x")])
            it = await head_iterator(db, "c/+")
            subs = [db.subscribe(it, max_unacked=10) for _ in range(3)]

            await db.append([Record("c/2", b"y")])
            assert [values(await take(s)) for s in subs] == [[b"y"]] * 3

            async def drain(sub: Subscription) -> list[SubscriptionBatch]:
                return [b async for b in sub]

            readers = [asyncio.create_task(drain(s)) for s in subs]  # waiting for more
            await db.close()
            assert await asyncio.wait_for(asyncio.gather(*readers), WAIT_S) == [[]] * 3
            assert all(s.closed for s in subs)
            with pytest.raises(ClosedResourceError):
                db.subscribe(it, max_unacked=10)
            with pytest.raises(ClosedResourceError):
                subs[0].suback(1)
        finally:
            await store.close()

    run(go())


async def db_with_doomed_stream(store: seglog.Store, name: str) -> seglog.Database:
    """A database whose stream of ``c/x`` :func:`cut_doomed_stream` makes unknown (``b/x`` stays)."""
    db = await store.create_db(name, lts_thresholds=[100, 1])
    await db.append([Record("a/x", b"1"), Record("b/x", b"2")])
    await db.append([Record("c/x", b"3"), Record("a/y", b"4")])
    return db


async def cut_doomed_stream(db: seglog.Database) -> None:
    """Truncate below ``c/x``'s first record, so the trie forgets it, then append past it."""
    await db.truncate_to(0, 2, force=True)
    await db.append([Record("d/x", b"5"), Record("a/x", b"6"), Record("e/x", b"7")])


def test_a_failed_read_reaches_the_subscriber(run, data_dir: Path) -> None:
    async def go() -> None:
        async with seglog.open(data_dir) as store:
            db = await db_with_doomed_stream(store, "err")
            sub = db.subscribe(await head_iterator(db, "c/x"), max_unacked=10)
            await cut_doomed_stream(db)
            with pytest.raises(UnknownStream):
                await take(sub)
            with pytest.raises(StopAsyncIteration):
                await anext(sub)
            assert db.subscription_stats().subscriptions == 0
            await sub.close()

    run(go())


def test_an_iterator_at_end_of_stream_subscribes_to_nothing(run, data_dir: Path) -> None:
    async def go() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("eos", lts_thresholds=[1000, 0])
            await db.append([Record("e/1", b"x")])
            (stream,) = db.get_streams("e/+")
            it = dataclasses.replace(db.make_iterator(stream, "e/+"), end_of_stream=True)
            async with db.subscribe(it, max_unacked=1) as sub:
                assert [b async for b in sub] == []

    run(go())


def test_bad_arguments_raise_specific_errors(run, data_dir: Path) -> None:
    async def go() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("bad", lts_thresholds=[1000, 0])
            plain = await store.create_db("plain")
            other = await store.create_db("other", lts_thresholds=[1000, 0])
            await db.append([Record("b/1", b"x"), Record("b/2", b"y")])
            await other.append([Record("b/1", b"x")])
            (stream,) = db.get_streams("b/+")
            it = db.make_iterator(stream, "b/+")
            for bad in (0, -1, True, 1.5, "3", None):
                with pytest.raises(InvalidArgument, match="max_unacked"):
                    db.subscribe(it, max_unacked=bad)  # type: ignore[arg-type]
            with pytest.raises(InvalidArgument, match="Iterator"):
                db.subscribe(it.to_bytes(), max_unacked=1)  # type: ignore[arg-type]
            with pytest.raises(ForeignIterator):
                other.subscribe(it, max_unacked=1)
            with pytest.raises(InvalidArgument, match="no streams"):
                plain.subscribe(it, max_unacked=1)
            async with db.subscribe(it, max_unacked=5) as sub:
                with pytest.raises(SubackOutOfRange):
                    sub.suback(1)  # nothing delivered yet
                b = await take(sub)
                assert b.seqno == 2
                with pytest.raises(SubackOutOfRange) as exc_info:
                    sub.suback(3)
                assert (exc_info.value.seqno, exc_info.value.delivered) == (3, 2)
                sub.suback(2)
                sub.suback(2)  # the same again is fine
                with pytest.raises(SubackOutOfRange, match="goes back"):
                    sub.suback(1)
                for wrong in ("2", 2.0, True, None):
                    with pytest.raises(InvalidArgument):
                        sub.suback(wrong)  # type: ignore[arg-type]
                assert isinstance(SubackOutOfRange("x", seqno=1, acked=0, delivered=0), InvalidArgument)
            with pytest.raises(ClosedResourceError):
                sub.suback(2)
            await sub.close()  # twice is fine

    run(go())


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_many_subscribers_with_random_windows_get_everything_once(run, data_dir: Path, seed: int) -> None:
    """Random starts, filters, windows and ack habits against concurrent appends to two shards."""
    rng = random.Random(seed)

    async def go() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("rand", shards=2, lts_thresholds=[1000, 0])
            for i in range(300):
                await db.append([Record(f"{'sa'[i % 2]}/{i % 5}", b"h%d" % i, key=b"%d" % (i % 11))])
            streams = db.get_streams("+/+")  # s/+ and a/+ in each shard
            assert len(streams) == 4
            subs: list[tuple[Subscription, seglog.Stream, str, int]] = []
            for _ in range(16):
                stream = rng.choice(streams)
                prefix = stream.structure[0]
                f = rng.choice([f"{prefix}/+", f"{prefix}/3", f"{prefix}/#", "+/+"])
                it = db.make_iterator(stream, f)
                start = rng.choice(["zero", "head", "mid"])
                if start != "zero":
                    it, _ = await db.next_arrow(it, 10_000 if start == "head" else rng.randint(1, 40))
                window = rng.randint(1, 40)
                subs.append((db.subscribe(it, max_unacked=window), stream, f, it.position))
            got: list[list[tuple[int, bytes]]] = [[] for _ in subs]
            targets: list[int | None] = [None] * len(subs)
            reached = [asyncio.Event() for _ in subs]

            async def consume(i: int) -> None:
                sub = subs[i][0]
                habit = rng.randint(0, 2)
                pending = 0
                while True:
                    b = await anext(sub)
                    assert sub.unacked <= sub.max_unacked
                    got[i].extend((r.offset, r.value) for r in b.records)
                    target = targets[i]
                    if target is not None and len(got[i]) >= target:
                        reached[i].set()
                    pending += 1
                    if habit == 0 or sub.stuck or pending >= 3:
                        for _ in range(rng.randint(0, 3) if habit == 2 else 0):
                            await asyncio.sleep(0)  # a slow handler: yields to the others
                        sub.suback(b.seqno)
                        pending = 0

            consumers = [asyncio.create_task(consume(i)) for i in range(len(subs))]
            for k in range(120):
                size = rng.randint(1, 12)
                # Some appends go to one shard only, some to one stream only: the paths of
                # the others stay put or skip their read.
                only = rng.choice([None, None, 0, 1])
                prefixes = rng.choice(["s", "a", "sa"])
                await db.append(
                    [
                        Record(
                            f"{rng.choice(prefixes)}/{rng.randint(0, 5)}",
                            b"n%d.%d" % (k, j),
                            key=b"%d" % rng.randint(0, 9),
                        )
                        for j in range(size)
                    ],
                    shard=only,
                )
                if rng.random() < 0.3:
                    await asyncio.sleep(0)
            stored = [r for shard in range(2) for r in await db.read(shard, 0, 100_000)]
            for i, (_sub, stream, f, position) in enumerate(subs):
                want = [
                    (r.offset, r.value)
                    for r in stored
                    if r.shard == stream.shard
                    and r.offset >= position
                    and topic_matches(stream.pattern, r.topic)
                    and topic_matches(f, r.topic)
                ]
                targets[i] = len(want)
                if len(got[i]) >= len(want):
                    reached[i].set()
                await asyncio.wait_for(reached[i].wait(), WAIT_S)
                assert got[i] == want, (i, f, position)
            for task in consumers:
                assert not task.done(), task
                task.cancel()
            stats = db.subscription_stats()
            assert stats.joins >= len(subs)
            assert stats.shared_reads < 120 * 2 + 10
            for sub, *_ in subs:
                await sub.close()
            assert db.subscription_stats().beams == 0

    run(go())


def test_a_truncation_below_the_subscribers_moves_them_back(run, data_dir: Path) -> None:
    async def go() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("cut", lts_thresholds=[1000, 0])
            for i in range(10):  # a frame each: the cut below is at offset 6 exactly
                await db.append([Record(f"t/{i}", b"%d" % i)])
            (stream,) = db.get_streams("t/+")
            head = db.subscribe(await head_iterator(db, "t/+"), max_unacked=100)
            behind = db.subscribe(db.make_iterator(stream, "t/+"), max_unacked=4)
            assert values(await take(behind)) == [b"0", b"1", b"2", b"3"]
            await db.truncate_to(0, 6, force=True)
            assert head.iterator.position == 6
            await db.append([Record("t/new", b"new%d" % i) for i in range(3)])
            b = await take(head)
            assert values(b) == [b"new0", b"new1", b"new2"] and [r.offset for r in b.records] == [6, 7, 8]
            behind.suback(4)
            rest: list[bytes] = []
            while len(rest) < 5:
                b = await take(behind)
                rest.extend(values(b))
                behind.suback(b.seqno)
            assert rest == [b"4", b"5", b"new0", b"new1", b"new2"]
            await head.close()
            await behind.close()

    run(go())


@pytest.mark.parametrize("engine", ["segment", "memory", "lmdb"])
def test_an_append_costs_reads_of_the_streams_it_touched_only(run, data_dir: Path, engine: str) -> None:
    async def go() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("touch", engine=engine, lts_thresholds=[100, 0, 100])
            sites = 10
            await db.append([Record(f"site{s}/d/x", b"-") for s in range(sites)])
            subs = []
            for s in range(sites):
                it = await head_iterator(db, f"site{s}/+/x")
                subs.append([db.subscribe(it, max_unacked=1000) for _ in range(3)])
            before = db.subscription_stats()
            appends = 40
            for k in range(appends):
                site = k % sites
                await db.append([Record(f"site{site}/d{j}/x", b"%d" % k) for j in range(4)])
                for sub in subs[site]:
                    b = await take(sub)
                    assert values(b) == [b"%d" % k] * 4
                    sub.suback(b.seqno)
            after = db.subscription_stats()
            shared = after.shared_reads - before.shared_reads
            # One read per append (the stream it touched), not one per subscribed stream (10)
            # nor per subscriber (30); the other streams' paths skip without reading.
            assert shared <= appends + sites, shared
            assert after.skipped_reads > before.skipped_reads
            for group in subs:
                for sub in group:
                    assert sub.seqno == 4 * (appends // sites)
                    assert sub.iterator.position >= db.end_offset(0) - 4 * (sites - 1)

    run(go())


def test_stamper_watches_say_where_a_stream_may_have_rows() -> None:
    from seglog.topics.streams import StreamStamper

    stamper = StreamStamper(2, [100, 0])
    topics = pa.array(["a/1", "b/1", "a/2"])
    ids = stamper.stamp(topics, 0, 0)  # streams a/+ and b/+ of shard 0, offsets 0..2
    a, b = int(ids[0]), int(ids[1])
    assert stamper.stamped_since(0, a, 100), "not watched: unsure"
    stamper.watch(0, a)
    stamper.watch(0, b)
    # Until the shard's next stamp, rows stamped before the watch may be anywhere.
    assert stamper.stamped_since(0, a, 3) and stamper.stamped_since(0, b, 1000)
    stamper.stamp(pa.array(["b/7", "b/8"]), 0, 3)  # offsets 3, 4: only b
    assert stamper.stamped_since(0, a, 2) and not stamper.stamped_since(0, a, 3)
    assert stamper.stamped_since(0, b, 4) and not stamper.stamped_since(0, b, 5)
    # Rows of many shards at once (a routed append): only shard 0's rows move its watches.
    stamper.stamp(
        pa.array(["a/3", "a/4", "b/9"]), np.array([1, 0, 1], np.int32), np.array([0, 5, 1], np.int64)
    )
    assert stamper.stamped_since(0, a, 5) and not stamper.stamped_since(0, a, 6)
    assert not stamper.stamped_since(0, b, 5)
    stamper.unwatch(0, a)
    assert stamper.stamped_since(0, a, 10**9), "unwatched: unsure again"
