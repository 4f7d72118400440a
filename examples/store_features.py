"""Settings, live tail, consumer groups, retention: python examples/store_features.py [DATA_DIR]."""

import asyncio
import sys

import seglog


async def main(path: str) -> None:
    async with seglog.open(path, quota_bytes=10 << 30, retention_interval_ms=300_000) as store:
        db = await store.create_db(
            "t",
            shards=2,
            engine="segment",  # or "memory", "lmdb"
            segment_bytes=4096,
            retention_bytes=1 << 30,
            retention_ms=7 * 86_400_000,
        )
        await db.configure(retention_ms=86_400_000)  # mutable settings, durably
        for i in range(0, 1000, 50):
            await db.append([seglog.Record(topic=f"site/{n % 3}", value=b"%d" % n) for n in range(i, i + 50)])

        end = db.end_offset(0)
        async for rec in db.tail(0, end - 2):  # what exists from there, then new records as they come
            print("tail", rec.offset, rec.value)
            if rec.offset == end - 1:
                break  # a tail never ends by itself (only when the database closes)

        consumer = db.consumer("dashboards")  # every shard; starts at the group's commits
        got = await consumer.getmany(max_records=100, timeout_ms=1000)
        await consumer.commit()  # durable before it returns
        print("consumed", {s: len(rs) for s, rs in got.items()}, "committed", consumer.positions())
        print("group position on shard 0:", await db.committed("dashboards", 0))

        live = db.consumer(from_="latest")
        await live.start()
        waiting = asyncio.create_task(live.getone())  # woken by the append, no polling
        await db.append(seglog.Record(topic="site/9", value=b"new"))
        print("live:", (await waiting).value)

        freed = await db.truncate_before(0, 300)  # whole sealed segments below offset 300 go
        print(f"freed {freed} bytes; shard 0 now starts at {db.start_offset(0)}")
        print(
            "retention freed", await db.enforce_retention(), "bytes"
        )  # also runs every retention_interval_ms
        await store.drop_db("t")
        print("databases:", store.list_dbs())


asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "data"))
