"""Child process for the generations crash test: appends while generations are added.

Usage: python -m tests.generations_child DATA_DIR (6 shards, small LTS thresholds). Three
producers append small batches of topics to every shard; a fourth task adds a generation
after every few batches. Each acknowledged record is printed as ``R shard offset topic_id``
after its append returned (fsync="always"), each generation as ``G id`` after
``add_generation`` returned, and ``A id`` just before it is asked for (the parent kills
the child at such lines too, so some kills land inside ``add_generation``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import seglog

ROOT = Path(__file__).resolve().parent.parent


def topic_for(topic_id: int) -> str:
    """Topic ``topic_id``: ``$`` ones, short ones, and levels that become wildcards."""
    kind = topic_id % 4
    if kind == 0:
        return f"$SYS/node{topic_id % 3}/m{topic_id % 7}"
    if kind == 1:
        return f"plant{topic_id % 3}"
    return f"plant{topic_id % 3}/line{topic_id % 13}/dev{topic_id % 41}"


async def producer(db: seglog.Database, p: int, batches: asyncio.Queue[int]) -> None:
    seq = p * 1_000_000
    while True:
        n = 1 + (seq * 7 + p) % 20
        ids = [(seq + i) * 7919 % 3000 for i in range(n)]
        recs = [seglog.Record(topic_for(t), b"%d" % t) for t in ids]
        metas = await db.append(recs, shard=(seq // 3 + p) % db.shards)
        sys.stdout.write("".join(f"R {m.shard} {m.offset} {t}\n" for m, t in zip(metas, ids, strict=True)))
        sys.stdout.flush()
        seq += n
        batches.put_nowait(1)


async def generations(db: seglog.Database, batches: asyncio.Queue[int]) -> None:
    while True:
        for _ in range(4):
            await batches.get()
        nxt = db.list_slabs()[-1].generation + 1
        print(f"A {nxt}", flush=True)
        slab = await db.add_generation()
        print(f"G {slab.generation}", flush=True)


async def main(data: str) -> None:
    async with seglog.open(data, fsync="always") as store:
        db = await store.create_db("crash", shards=6, lts_thresholds=[3, 4, 2], exist_ok=True)
        batches: asyncio.Queue[int] = asyncio.Queue()
        await asyncio.gather(*(producer(db, p, batches) for p in range(3)), generations(db, batches))


def run_and_kill(data: Path, kill_after_generations: int, lines_after: int = 0) -> list[str]:
    """Run the child until it asked for that many generations (and printed ``lines_after``
    more lines: the first lines after an ``A`` line come while ``add_generation`` runs, so
    the kill lands before, inside or after it), SIGKILL it, return its lines."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.generations_child", str(data)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    asked = 0
    after = 0
    try:
        for line in proc.stdout:
            lines.append(line)
            if asked >= kill_after_generations:
                after += 1
            asked += line.startswith("A ")
            if asked >= kill_after_generations and after >= lines_after:
                break
        os.kill(proc.pid, signal.SIGKILL)
        lines.extend(proc.stdout.read().splitlines(keepends=True))
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert asked >= kill_after_generations, "child died before adding enough generations"
    return lines


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
