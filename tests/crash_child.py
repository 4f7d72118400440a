"""Child process for crash tests: appends forever, printing each acknowledged record.

Usage: python -m tests.crash_child DATA_DIR MODE [ENGINE]
(ENGINE: the database engine, default ``segment``.) MODE ``keyed``: a key on every record,
spread over 16 shards, so each append reaches several shards of every I/O worker (the
segment engine's journal path: rows wait in memory until written into their segments).
Each acknowledged record is printed as ``shard offset producer seq`` and flushed, after the
append returned (so after fdatasync under fsync="always").
"""

from __future__ import annotations

import asyncio
import sys

import seglog


def value_for(producer: int, seq: int) -> bytes:
    return f"p{producer}-s{seq}-".encode() * (1 + seq % 7)


def key_for(producer: int, seq: int, keyed: bool) -> bytes:
    return f"dev-{(seq * 7919 + producer) % 1000}".encode() if keyed else f"p{producer}".encode()


async def producer(db: seglog.Database, p: int, out: asyncio.Queue[str], keyed: bool = False) -> None:
    seq = 0
    while True:
        n = 1 + (seq * 7 + p) % 40
        recs = [
            seglog.Record(topic=f"crash/{p}", value=value_for(p, seq + i), key=key_for(p, seq + i, keyed))
            for i in range(n)
        ]
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
    keyed = mode == "keyed"
    # keyed: rows stay in memory (and the journal) until the store closes or a checkpoint.
    async with seglog.open(data, fsync="always", buffer_ms=3_600_000 if keyed else 1000) as store:
        db = await store.create_db(
            "crash", shards=16 if keyed else 3, segment_bytes=16 * 1024, engine=engine, exist_ok=True
        )
        tasks = [producer(db, p, asyncio.Queue(), keyed) for p in range(4)]
        if mode == "commits":
            tasks.append(commit_loop(db))
        await asyncio.gather(*tasks)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
