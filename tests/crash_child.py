"""Child process for crash tests: appends forever, printing each acknowledged record.

Usage: python -m tests.crash_child DATA_DIR MODE [ENGINE]
(ENGINE: the database engine, default ``segment``.)
Each acknowledged record is printed as ``shard offset producer seq`` and flushed, after the
append returned (so after fdatasync under fsync="always").
"""

from __future__ import annotations

import asyncio
import sys

import seglog


def value_for(producer: int, seq: int) -> bytes:
    return f"p{producer}-s{seq}-".encode() * (1 + seq % 7)


async def producer(db: seglog.Database, p: int, out: asyncio.Queue[str]) -> None:
    seq = 0
    while True:
        n = 1 + (seq * 7 + p) % 40
        recs = [seglog.Record(topic=f"crash/{p}", value=value_for(p, seq + i), key=f"p{p}".encode())
                for i in range(n)]
        metas = await db.append(recs)
        lines = "".join(f"{m.shard} {m.offset} {p} {seq + i}\n" for i, m in enumerate(metas))
        sys.stdout.write(lines)
        sys.stdout.flush()
        seq += n


async def commit_loop(db: seglog.Database) -> None:
    i = 0
    while True:
        shard = i % db.shards
        offset = i
        await db.commit("g", shard, offset)  # type: ignore[attr-defined]
        sys.stdout.write(f"commit {shard} {offset}\n")
        sys.stdout.flush()
        i += 1


async def main(data: str, mode: str, engine: str = "segment") -> None:
    async with seglog.open(data, fsync="always") as store:
        db = await store.create_db("crash", shards=3, segment_bytes=16 * 1024, engine=engine, exist_ok=True)
        tasks = [producer(db, p, asyncio.Queue()) for p in range(4)]
        if mode == "commits":
            tasks.append(commit_loop(db))
        await asyncio.gather(*tasks)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
