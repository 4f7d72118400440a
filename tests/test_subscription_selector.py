"""SubscriptionSelector: one task reading many subscriptions (issue 14, item 5's delivery cost)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

import seglog
from seglog import Record, Subscription, SubscriptionBatch, SubscriptionSelector
from seglog.errors import BusyResourceError, ClosedResourceError, InvalidArgument, UnknownStream
from seglog.topics import topic_matches
from tests.test_subscriptions import cut_doomed_stream, db_with_doomed_stream, head_iterator

WAIT_S = 10.0

Polled = list[tuple[Subscription, SubscriptionBatch | None]]


async def poll(sel: SubscriptionSelector, max_batches: int | None = None) -> Polled:
    """The next poll, failing the test instead of hanging."""
    return await asyncio.wait_for(sel.poll(max_batches), WAIT_S)


def values(batch: SubscriptionBatch | None) -> list[bytes]:
    assert batch is not None
    return [r.value for r in batch.records]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_one_task_polling_many_subscriptions_gets_what_each_would(run, data_dir: Path, seed: int) -> None:
    """Random starts, filters and windows on two shards, read by one polling task: each
    subscription gets exactly its stream's matching records, in order, within its window."""
    rng = random.Random(seed)

    async def go() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("sel", shards=2, lts_thresholds=[1000, 0])
            for i in range(200):
                await db.append([Record(f"{'sa'[i % 2]}/{i % 5}", b"h%d" % i, key=b"%d" % (i % 11))])
            streams = db.get_streams("+/+")
            assert len(streams) == 4
            subs: list[tuple[Subscription, seglog.Stream, str, int]] = []
            for _ in range(24):
                stream = rng.choice(streams)
                f = rng.choice([f"{stream.structure[0]}/+", f"{stream.structure[0]}/3", "+/+"])
                it = db.make_iterator(stream, f)
                if rng.random() < 0.5:
                    it, _ = await db.next_arrow(it, rng.randint(1, 10_000))
                subs.append((db.subscribe(it, max_unacked=rng.randint(1, 30)), stream, f, it.position))
            got: dict[Subscription, list[tuple[int, bytes]]] = {s: [] for s, *_ in subs}
            target: dict[Subscription, int] = {}
            all_in = asyncio.Event()
            selector = SubscriptionSelector(s for s, *_ in subs)
            assert len(selector) == len(subs)

            def complete() -> bool:
                return len(target) == len(subs) and all(len(got[s]) >= n for s, n in target.items())

            async def consume() -> None:
                while batches := await selector.poll(max_batches=rng.choice([None, 1, 7])):
                    for sub, batch in batches:
                        assert batch is not None and sub.unacked <= sub.max_unacked
                        got[sub].extend((r.offset, r.value) for r in batch.records)
                        if rng.random() < 0.7 or sub.stuck:
                            sub.suback(batch.seqno)
                    if complete():
                        all_in.set()

            consumer = asyncio.create_task(consume())
            for k in range(100):
                prefixes = rng.choice(["s", "a", "sa"])
                await db.append(
                    [
                        Record(
                            f"{rng.choice(prefixes)}/{rng.randint(0, 5)}", b"n%d.%d" % (k, j), key=b"%d" % j
                        )
                        for j in range(rng.randint(1, 12))
                    ],
                    shard=rng.choice([None, 0, 1]),
                )
            stored = [r for shard in range(2) for r in await db.read(shard, 0, 100_000)]
            want = {}
            for sub, stream, f, position in subs:
                want[sub] = [
                    (r.offset, r.value)
                    for r in stored
                    if r.shard == stream.shard
                    and r.offset >= position
                    and topic_matches(stream.pattern, r.topic)
                    and topic_matches(f, r.topic)
                ]
                target[sub] = len(want[sub])
            if complete():
                all_in.set()
            await asyncio.wait_for(all_in.wait(), WAIT_S)
            assert got == want
            selector.close()
            assert await asyncio.wait_for(consumer, WAIT_S) is None  # a closed selector ends the loop
            for sub, *_ in subs:
                await sub.close()

    run(go())


def test_a_full_window_gets_nothing_while_the_others_go_on(run, data_dir: Path) -> None:
    async def go() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("win", lts_thresholds=[1000, 0])
            await db.append([Record("t/0", b"-")])
            head = await head_iterator(db, "t/+")
            slow, fast = db.subscribe(head, max_unacked=2), db.subscribe(head, max_unacked=100)
            async with SubscriptionSelector([slow, fast]) as selector:
                await db.append([Record("t/1", b"a"), Record("t/2", b"b"), Record("t/3", b"c")])
                batches = await poll(selector)
                assert sorted((s is slow, values(b)) for s, b in batches) == [
                    (False, [b"a", b"b", b"c"]),
                    (True, [b"a", b"b"]),
                ]
                assert slow.stuck and not fast.stuck
                fast.suback(fast.seqno)
                await db.append([Record("t/4", b"d")])
                batches = await poll(selector)  # only the fast one: the slow one waits for a suback
                assert [(s is fast, values(b)) for s, b in batches] == [(True, [b"d"])]
                slow.suback(slow.seqno)
                batches = await poll(selector)  # the suback alone lets it catch up
                assert [(s is slow, values(b)) for s, b in batches] == [(True, [b"c", b"d"])]
            await slow.close()
            await fast.close()

    run(go())


def test_max_batches_leaves_the_rest_for_the_next_poll(run, data_dir: Path) -> None:
    async def go() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("lim", lts_thresholds=[1000, 0])
            await db.append([Record("t/0", b"-")])
            head = await head_iterator(db, "t/+")
            subs = [db.subscribe(head, max_unacked=100) for _ in range(3)]
            selector = SubscriptionSelector(subs)
            await db.append([Record("t/1", b"a")])
            first = await poll(selector, 2)
            second = await poll(selector, 2)
            assert len(first) == 2 and len(second) == 1
            assert {id(s) for s, _ in first + second} == {id(s) for s in subs}
            assert all(values(b) == [b"a"] for _, b in first + second)
            with pytest.raises(InvalidArgument):
                await selector.poll(0)
            for sub in subs:
                await sub.close()

    run(go())


def test_ended_subscriptions_come_once_as_none_and_leave(run, data_dir: Path) -> None:
    async def go() -> None:
        async with seglog.open(data_dir) as store:
            db = await db_with_doomed_stream(store, "end")
            failing = db.subscribe(await head_iterator(db, "c/x"), max_unacked=10)
            closing = db.subscribe(await head_iterator(db, "b/x"), max_unacked=10)
            selector = SubscriptionSelector([failing, closing])
            await closing.close()
            assert await poll(selector) == [(closing, None)]
            assert closing.done and closing.error is None and len(selector) == 1
            await cut_doomed_stream(db)
            assert await poll(selector) == [(failing, None)]
            assert isinstance(failing.error, UnknownStream)
            assert len(selector) == 0
            assert await poll(selector) == []  # nothing left to wait for
            await failing.close()

    run(go())


def test_ownership_rules(run, data_dir: Path) -> None:
    async def go() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("own", lts_thresholds=[1000, 0])
            await db.append([Record("t/0", b"-")])
            sub = db.subscribe(await head_iterator(db, "t/+"), max_unacked=10)
            one, two = SubscriptionSelector(), SubscriptionSelector()
            one.add(sub)
            one.add(sub)  # again: no-op
            with pytest.raises(BusyResourceError):
                two.add(sub)
            with pytest.raises(BusyResourceError):
                await anext(sub)
            with pytest.raises(InvalidArgument):
                one.add("not a subscription")  # type: ignore[arg-type]
            await db.append([Record("t/1", b"a")])
            (polled,) = await poll(one)
            assert values(polled[1]) == [b"a"]
            await db.append([Record("t/2", b"b")])
            waiting = asyncio.create_task(one.poll())
            batch = await asyncio.wait_for(waiting, WAIT_S)
            assert values(batch[0][1]) == [b"b"]
            await db.append([Record("t/3", b"c")])
            one.remove(sub)  # what it queued meanwhile goes to the next async for
            b = await asyncio.wait_for(anext(sub), WAIT_S)
            assert b.records[-1].value == b"c"
            two.add(sub)
            waiting = asyncio.create_task(two.poll())
            two.close()  # ends a waiting poll
            assert await asyncio.wait_for(waiting, WAIT_S) == []
            with pytest.raises(ClosedResourceError):
                two.add(sub)
            assert len(two) == 0
            await sub.close()

    run(go())
