"""Append records and read them back by offset, time and key: python examples/quickstart.py [DATA_DIR]."""

import asyncio
import datetime as dt
import sys

import pyarrow as pa

import seglog


async def main(path: str) -> None:
    async with seglog.open(path) as store:  # fsync="always": acknowledged means on disk
        db = await store.create_db("telemetry", shards=4, exist_ok=True)
        t0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
        metas = await db.append(
            [  # ts: µs since 1970 or a datetime; omitted = now
                seglog.Record(topic="sensors/s1/d7/temp", value=b"21.5", key=b"d7", ts=t0),
                seglog.Record(
                    topic="sensors/s1/d7/temp", value=b"21.7", key=b"d7", ts=t0 + dt.timedelta(minutes=1)
                ),
                seglog.Record(topic="sensors/s1/d4/temp", value=b"19.0", key=b"d4", ts=t0),
            ]
        )
        print(metas[0])  # RecordMeta(shard=..., offset=..., ts=...); metas.offsets is numpy
        await db.append(seglog.Record(topic="sensors/s2/d9/co2", value=b"415"))  # one record
        await db.append_arrow(pa.table({"topic": ["sensors/s1/d7/temp"], "value": [b"21.9"], "key": [b"d7"]}))

        shard = db.shard_for(b"d7")  # the shard key d7 routes to (by topic when there is no key)
        for rec in await db.read(shard, db.start_offset(shard), max_records=1000):
            print(rec.offset, rec.topic, rec.value, rec.ts)
        table = await db.read_arrow(shard, 0, max_records=100_000)  # + an offset column, zero-copy
        print(table.column_names)
        off = await db.offset_for_time(shard, t0 + dt.timedelta(seconds=30))  # first ts >= that
        print("from 12:00:30:", [r.value for r in await db.read(shard, off)])
        print("key d7:", [r.value for r in await db.read_key(b"d7")])  # every record of the key
        for s in db.stats():
            print(f"shard {s.shard}: offsets {s.start_offset}..{s.end_offset}, {s.bytes} bytes")


asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "data"))
