"""Subscriptions that share one read per stream: python examples/subscriptions.py [DATA_DIR]."""

import asyncio
import sys

import seglog


async def subscriber(name: str, sub: seglog.Subscription, want: int) -> None:
    got = 0
    async with sub:
        async for batch in sub:  # pushed as appends complete, at most max_unacked unacknowledged
            got += len(batch)
            sub.suback(batch.seqno)  # seqno counts the records delivered so far
            if got == want:
                print(name, "got", got, "records, last:", batch.records[-1].topic, batch.records[-1].value)
                return


async def main(path: str) -> None:
    async with seglog.open(path) as store:
        db = await store.create_db("alerts", lts_thresholds=[100, 0, 100], exist_ok=True)
        await db.append([seglog.Record("plant1/dev0/alarm", b"boot")])  # learns the stream
        (stream,) = db.get_streams("plant1/+/alarm")
        it = db.make_iterator(stream, "plant1/+/alarm")
        while True:  # move to the head: these subscribers want new records only
            it, table = await db.next_arrow(it, 1000)
            if not table.num_rows:
                break
        readers = [
            asyncio.create_task(subscriber(f"sub{i}", db.subscribe(it, max_unacked=20), 100))
            for i in range(3)
        ]
        for i in range(100):
            await db.append([seglog.Record(f"plant1/dev{i % 7}/alarm", b"%d" % i)])
        await asyncio.gather(*readers)
        stats = db.subscription_stats()  # one read per append serves all three
        print(
            "stream reads:",
            stats.shared_reads + stats.catchup_reads,
            "for",
            stats.records_delivered,
            "deliveries",
        )


asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "data"))
