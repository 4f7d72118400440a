"""Generations: close one, read it to its end, drop it: python examples/generations.py [DATA_DIR]."""

import asyncio
import sys

import seglog


async def main(path: str) -> None:
    async with seglog.open(path) as store:
        db = await store.create_db("fleet", shards=1, lts_thresholds=[100, 2], exist_ok=True)
        await db.append([seglog.Record(f"car/{n}/speed", b"%d" % n) for n in range(5)])
        it = db.make_iterator(db.get_streams("car/+/speed")[-1], "car/+/speed")  # car/+/speed
        slab = await db.add_generation()  # new tries: only the learned wildcards carry over
        await db.append([seglog.Record("car/9/speed", b"9")])  # goes to generation 2's car/+/speed
        print([(s.generation, s.pattern) for s in db.get_streams("car/+/speed")])
        while not it.end_of_stream:  # generation 1 first, to its end
            it, records = await db.next(it)
            print("generation", it.generation, [r.value for r in records])
        saved = it.to_bytes()
        print([(s.generation, s.since, s.until, s.dropped) for s in db.list_slabs()])
        await db.drop_slab(1)  # retention by generation: its segments go
        print("dropped generation 1; shard 0 starts at", db.start_offset(0), "=", slab.since[0])
        try:
            await db.next(seglog.Iterator.from_bytes(saved))
        except seglog.errors.GenerationDropped as exc:
            print("GenerationDropped:", exc)


asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "data"))
