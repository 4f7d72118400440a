"""Child process that owns a store and appends on command, for cross-process follow tests.

Usage: python -m tests.owner_child DATA_DIR DB
Reads commands from stdin, one per line, and answers each on stdout:
``append N`` -> appends N records (values ``v<offset>``) to shard 0, answers ``acked END``;
``committed G`` -> answers ``committed G OFFSET|None``; ``retain`` -> truncates shard 0 to its
end, answers ``retained START``. Prints ``ready`` once the store is open.
"""

from __future__ import annotations

import asyncio
import sys

import seglog


async def main(data: str, name: str) -> None:
    async with seglog.open(data, retention_interval_ms=None) as store:
        db = await store.create_db(name, 1, exist_ok=True, segment_bytes=4096)
        print("ready", flush=True)
        loop = asyncio.get_running_loop()
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            cmd, arg = line.split()
            if cmd == "append":
                end = db.end_offset(0)
                recs = [
                    seglog.Record(
                        topic="follow/t", value=b"v%d" % (end + i), ts=1_700_000_000_000_000 + end + i
                    )
                    for i in range(int(arg))
                ]
                for i in range(0, len(recs), 25):  # several frames, so segments roll
                    await db.append(recs[i : i + 25], shard=0)
                print(f"acked {db.end_offset(0)}", flush=True)
            elif cmd == "committed":
                print(f"committed {arg} {await db.committed(arg, 0)}", flush=True)
            elif cmd == "retain":
                await db.truncate_before(0, db.end_offset(0))
                print(f"retained {db.start_offset(0)}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
