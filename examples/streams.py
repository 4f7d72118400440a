"""Wildcard reads through streams, iterators that survive a restart: python examples/streams.py [DATA_DIR]."""

import asyncio
import sys

import seglog


async def main(path: str) -> None:
    async with seglog.open(path) as store:
        # Sites stay static (up to 100), devices always vary: one stream per site and metric.
        db = await store.create_db("plant", shards=2, lts_thresholds=[100, 0, 100], exist_ok=True)
        for site in ("north", "south"):
            await db.append(
                [seglog.Record(f"{site}/dev{d}/{m}", b"%d" % d) for d in range(50) for m in ("temp", "rpm")]
            )
        streams = db.get_streams("north/+/temp")  # one per shard here; each a learned structure
        print([s.pattern for s in streams])
        saved = []
        for stream in streams:
            it = db.make_iterator(stream, "north/+/temp")
            it, records = await db.next(it, 10)  # only matching records, in append order
            print(stream.shard, [r.topic for r in records[:3]], len(records))
            saved.append(it.to_bytes())  # a few dozen bytes: store it with the reader's state
        print("iterator bytes:", [len(b) for b in saved])
    async with seglog.open(path) as store:  # later, maybe in another process
        db = await store.open_db("plant")
        total = 0
        for data in saved:
            it = seglog.Iterator.from_bytes(data)
            while True:
                it, table = await db.next_arrow(it, 1000)
                if not table.num_rows:  # nothing more yet: the stream may grow
                    break
                total += table.num_rows
        print("the rest after a restart:", total)


asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "data"))
