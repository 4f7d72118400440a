"""Child process for the strace tests: a small, deterministic workload per mode.

Usage: python -m tests.trace_child DATA_DIR MODE [FSYNC]

Every acknowledgement is one ``os.write`` to stdout *after* the append returned, so the
trace shows where the acknowledgement falls among the writer's syscalls.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import seglog


def say(line: str) -> None:
    os.write(1, (line + "\n").encode())


def records(n: int, start: int = 0) -> list[seglog.Record]:
    return [
        seglog.Record(topic="t/x", value=b"v%08d" % i * 10, ts=1_700_000_000_000_000 + i)
        for i in range(start, start + n)
    ]


async def acks(data: str, fsync: str) -> None:
    async with seglog.open(data, fsync=fsync) as store:  # type: ignore[arg-type]
        db = await store.create_db("t")
        for i in range(20):
            res = await db.append(records(100, i * 100), shard=0)
            say(f"ack {res[-1].offset + 1}")


async def interval(data: str, fsync: str) -> None:
    # One I/O worker: shard 0 keeps it busy; shard 1 writes once and then stays quiet.
    async with seglog.open(data, fsync=fsync, fsync_interval_ms=200, io_workers=1) as store:  # type: ignore[arg-type]
        db = await store.create_db("t", shards=2)
        stop = time.monotonic() + 3.0
        quiet_done = asyncio.Event()

        async def busy() -> None:
            i = 0
            while time.monotonic() < stop:
                await db.append(records(50, i), shard=0)
                i += 50

        async def quiet() -> None:
            await db.append(records(10), shard=0)  # the busy loop is running
            await db.append(records(10), shard=1)
            say("ack quiet")
            quiet_done.set()

        await asyncio.gather(busy(), quiet())
        say("done")


async def slow_sync(data: str, fsync: str) -> None:
    async with seglog.open(data, fsync=fsync) as store:  # type: ignore[arg-type]
        db = await store.create_db("t")
        await db.append(records(100), shard=0)
        say("ack A")
        say("start B")
        await db.append(records(100, 100), shard=0)
        say("ack B")


async def layout(data: str, fsync: str) -> None:
    async with seglog.open(data, fsync=fsync) as store:  # type: ignore[arg-type]
        db = await store.create_db("t", shards=2)
        await db.append(records(10), shard=1)
        await db.commit("g", 1, 5)
    say("closed")


MODES = {"acks": acks, "interval": interval, "slow-sync": slow_sync, "layout": layout}

if __name__ == "__main__":
    asyncio.run(MODES[sys.argv[2]](sys.argv[1], sys.argv[3] if len(sys.argv) > 3 else "always"))
