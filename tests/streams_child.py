"""Child process for the streams crash test: appends many topics, printing each acknowledgement.

Usage: python -m tests.streams_child DATA_DIR MODE (12 shards; ``frames``: each append to one
shard, written as frames; ``keyed``: a key on every record, spread over the shards: the
journal's rows path). Topics are
drawn so that tries keep learning (small thresholds, new topics all along) and LTS snapshots
are written every 60 records of a shard. Each acknowledged record is printed as
``shard offset topic_id seq`` after the append returned (after fdatasync: fsync="always").
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import seglog
from seglog.engines import streams as engine_streams

ROOT = Path(__file__).resolve().parent.parent


def topic_for(topic_id: int) -> str:
    """Topic ``topic_id``: shallow and deep ones, ``$`` ones, levels that become wildcards."""
    kind = topic_id % 5
    if kind == 0:
        return f"$SYS/node{topic_id % 3}/m{topic_id % 11}"
    if kind == 1:
        return f"plant{topic_id % 4}"
    return f"plant{topic_id % 4}/line{topic_id % 17}/dev{topic_id % 101}/t{topic_id % 3}"


async def producer(db: seglog.Database, p: int, keyed: bool) -> None:
    seq = p * 1_000_000
    while True:
        n = 1 + (seq * 7 + p) % 30
        ids = [(seq + i) * 7919 % 5000 for i in range(n)]
        recs = [
            seglog.Record(topic_for(t), b"%d" % (seq + i), key=b"%d" % t if keyed else None)
            for i, t in enumerate(ids)
        ]
        metas = await db.append(recs, shard=None if keyed else (seq // 7 + p) % db.shards)
        sys.stdout.write(
            "".join(
                f"{m.shard} {m.offset} {t} {seq + i}\n"
                for i, (m, t) in enumerate(zip(metas, ids, strict=True))
            )
        )
        sys.stdout.flush()
        seq += n


async def main(data: str, mode: str) -> None:
    engine_streams.SNAPSHOT_EVERY_RECORDS = 60
    keyed = mode == "keyed"
    async with seglog.open(data, fsync="always", buffer_ms=3_600_000 if keyed else 1000) as store:
        db = await store.create_db(
            "crash",
            shards=12,
            segment_bytes=64 * 1024,
            lts_thresholds=[3, 5, 2],
            exist_ok=True,
        )
        await asyncio.gather(*(producer(db, p, keyed) for p in range(3)))


def run_and_kill(data: Path, mode: str, acks_before_kill: int) -> list[str]:
    """Run the child until it acknowledged that many records, SIGKILL it, return its lines."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.streams_child", str(data), mode],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if len(lines) >= acks_before_kill:
                break
        os.kill(proc.pid, signal.SIGKILL)
        lines.extend(proc.stdout.read().splitlines(keepends=True))
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert len(lines) >= acks_before_kill, "child died before producing enough acknowledgements"
    return lines


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:3]))
