"""Child for the replica property test: random leader/follower history on two stores, one
line per completed step on stdout; the parent SIGKILLs it at a step of its choosing.

    python -m tests.replica_property_child ROOT SEED STEPS ENGINE
"""

from __future__ import annotations

import asyncio
import random
import sys
from pathlib import Path

import seglog
from tests.test_replica_property import TS0, _sync


async def main(root: Path, seed: int, steps: int, engine: str) -> None:
    rng = random.Random(seed)
    a = await seglog.open(root / "a")
    b = await seglog.open(root / "b")
    leader = await a.create_db("r", shards=1, engine=engine, segment_bytes=16384, exist_ok=True)
    follower = await b.create_db("r", shards=1, engine=engine, segment_bytes=16384, exist_ok=True)
    epoch = 0
    for step in range(steps):
        op = rng.choice(("append", "append", "append", "truncate_leader", "truncate_follower", "sync"))
        if op == "append":
            n = rng.randint(1, 120)
            end = leader.end_offset(0)
            recs = [
                seglog.Record(
                    topic=f"t/{i % 5}",
                    value=b"s%d-%d" % (seed, end + i),
                    key=b"k%d" % ((end + i) % 13),
                    ts=TS0 + end + i,
                )
                for i in range(n)
            ]
            await leader.append(recs, shard=0, leader_epoch=epoch)
        elif op == "truncate_leader":
            await leader.truncate_to(0, rng.randint(leader.start_offset(0), leader.end_offset(0)), force=True)
            epoch += 1  # a leader that lost records comes back with a new epoch
        elif op == "truncate_follower":
            await follower.truncate_to(
                0, rng.randint(follower.start_offset(0), follower.end_offset(0)), force=True
            )
        else:
            await _sync(leader, follower)
        print(step, op, flush=True)
    print("done", flush=True)
    await asyncio.Event().wait()  # the parent kills us


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]))
