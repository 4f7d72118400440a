"""Child process for replica-log crash tests (killed with SIGKILL by the parent or itself).

``truncate DATA OFFSET``: open the ``r`` database, ``truncate_to(0, OFFSET)``, print the new end.
``restart DATA OFFSET``: open the ``r`` database, ``restart_at(0, OFFSET)``, print "restarted".
``epoch DATA EPOCH``: keyed appends over every shard stamped with leader epoch EPOCH (rows
wait in the journal), print "appended", then SIGKILL itself.
``journal DATA OFFSET``: keyed appends over every shard (rows wait in the journal), truncate
shard 0 to OFFSET, print the new end, then SIGKILL itself (no checkpoint at close).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import seglog


async def truncate(data: str, offset: int) -> None:
    store = await seglog.open(data)
    db = await store.open_db("r")
    end = await db.truncate_to(0, offset)
    print("truncated", end, flush=True)
    os._exit(0)  # no close: the cut must be durable on its own


async def restart(data: str, offset: int) -> None:
    store = await seglog.open(data)
    db = await store.open_db("r")
    await db.restart_at(0, offset)
    print("restarted", flush=True)
    os._exit(0)  # no close: the restart must be durable on its own


async def journal(data: str, offset: int) -> None:
    store = await seglog.open(data, buffer_ms=3_600_000)
    db = await store.open_db("r")
    for b in range(4):
        await db.append(
            [
                seglog.Record(
                    topic="t", value=b"j%d-%d" % (b, i), key=b"k%d" % i, ts=1_700_000_000_000_000 + i
                )
                for i in range(400)
            ]
        )
    end = await db.truncate_to(0, offset)
    print("truncated", end, db.end_offset(0), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


async def epoch(data: str, leader_epoch: int) -> None:
    store = await seglog.open(data, buffer_ms=3_600_000)
    db = await store.open_db("r")
    records = [
        seglog.Record(topic="t", value=b"e%d" % i, key=b"k%d" % i, ts=1_700_000_000_000_000 + i)
        for i in range(400)
    ]
    await db.append(records, leader_epoch=leader_epoch)
    print("appended", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    mode, data, arg = sys.argv[1], sys.argv[2], int(sys.argv[3])
    modes = {"truncate": truncate, "restart": restart, "journal": journal, "epoch": epoch}
    asyncio.run(modes[mode](data, arg))
