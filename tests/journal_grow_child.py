"""Child process: keyed appends while the journal grower's chunk is stuck in its fdatasync.

Usage: python -m tests.journal_grow_child DATA_DIR

Appends 50 keyed records at a time to a fresh 16-shard database (``fsync="always"``) and
prints each acknowledged record as ``shard offset seq``. The first ``fdatasync`` of the
journal grower's thread prints ``growing`` and then never returns (a disk slow to sync the
zeros): its chunk is written, unsynced, and in flight when the parent SIGKILLs the process.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading

import seglog

_real_fdatasync = os.fdatasync


def _stuck_in_grower(fd: int) -> None:
    if threading.current_thread().name.startswith("seglog-journal-grow"):
        sys.stdout.write("growing\n")
        sys.stdout.flush()
        threading.Event().wait()  # until SIGKILL
    _real_fdatasync(fd)


def value_for(seq: int) -> bytes:
    return b"v%d-" % seq + b"x" * 90


async def main(data: str) -> None:
    os.fdatasync = _stuck_in_grower  # type: ignore[assignment]
    async with seglog.open(data, fsync="always", buffer_ms=3_600_000, io_workers=1) as store:
        db = await store.create_db("grow", shards=16)
        seq = 0
        while True:
            recs = [
                seglog.Record(topic="g", value=value_for(seq + i), key=b"dev-%d" % ((seq + i) % 997))
                for i in range(50)
            ]
            metas = await db.append(recs)
            sys.stdout.write("".join(f"{m.shard} {m.offset} {seq + i}\n" for i, m in enumerate(metas)))
            sys.stdout.flush()
            seq += len(recs)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
