"""Tier sealed segments to Parquet and read through them: python examples/tiering.py [DATA_DIR]."""

import asyncio
import sys
from pathlib import Path

import seglog


async def main(path: str) -> None:
    tier = (Path(path).absolute().parent / (Path(path).name + "-tier")).as_uri()  # file:///abs/dir
    # or tier="s3://bucket/prefix", s3_endpoint="http://127.0.0.1:9000" (credentials: args or AWS_* env)
    async with seglog.open(path, tier=tier, tier_interval_ms=60_000) as store:
        db = await store.create_db("telemetry", shards=2, exist_ok=True, local_retention_bytes=0)
        await db.append([seglog.Record(topic=f"sensors/s{i % 4}/temp", value=b"%d" % i) for i in range(1000)])
        await db.seal()  # seal active segments now (normally they roll by size or age)
        entries = await db.tier_now()  # sealed segments -> Parquet objects, verified, then committed
        for e in entries:
            print(f"tiered {e.key}: offsets {e.base_offset}..{e.end_offset}, {e.rows} rows")
        for t in db.tier_stats():  # per shard: hot (active), warm (sealed, local), cold (tier) bytes
            print(
                f"shard {t.shard}: hot {t.hot_bytes}, warm {t.warm_bytes}, cold {t.cold_bytes} bytes, "
                f"local start {t.local_start_offset}, start {t.start_offset}"
            )
        first = await db.read(0, 0, max_records=2)  # below the local start: read from the tier
        print("read through the tier:", [(r.offset, r.value) for r in first])
    print("tier:", tier)


asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "data"))
