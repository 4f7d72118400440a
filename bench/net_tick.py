"""CPU per tick of a node's store work in the 16-shard end-to-end shape, before and after.

    python -m bench.net_tick [--before DIR] [--ticks N] [--shards N] [--runs N]

What the node does for every tick of ``bench.net``'s end-to-end rows, without the network: a
keyed append of 250 records over ``--shards`` shards (``fsync="always"``) and one read of
frames per shard from where its last read ended (the tailing consumer's poll). Two paths:
``rows`` (an Arrow post: rows routed by key, buffered and written into the tailed shards'
segments in the drain) and ``producer`` (the idempotent ``Producer``: rows grouped by shard,
a frame per shard). Each run is a fresh store in a subprocess; CPU = the process's user +
system seconds (both threads) over the ticks, so it does not depend on how busy the machine
is the way latency does. ``--before DIR`` imports ``seglog`` from DIR (e.g. a worktree of
main) in alternating runs and prints the ratio of the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEVICES = 10_000
TS0 = 1_700_000_000_000_000


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def _ticks(mode: str, shards: int, per_tick: int, ticks: int, work: str) -> dict[str, float]:
    import numpy as np
    import pyarrow as pa

    import seglog

    keys = pa.array([f"dev-{d:05d}".encode() for d in range(DEVICES)], pa.binary())
    topics = pa.array([f"sensors/site-{d % 100:02d}/dev-{d:05d}/temp" for d in range(DEVICES)], pa.string())
    data = np.random.default_rng(7).integers(ord("a"), ord("z") + 1, size=per_tick * 100, dtype=np.uint8)
    offsets = np.arange(0, (per_tick + 1) * 100, 100, dtype=np.int32)
    value = pa.Array.from_buffers(pa.binary(), per_tick, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    stamp_type: Any = None
    if mode == "producer":
        from seglog.segment.producer_state import ProducerStamp as stamp_type
    async with seglog.open(work, fsync="always") as store:
        db = await store.create_db("t", shards=shards)
        read_from = [0] * shards
        sequences = [0] * shards
        append_s = read_s = 0.0
        cpu0 = _cpu_s()
        for i in range(ticks):
            devices = pa.array((np.arange(per_tick) + i * per_tick) % DEVICES)
            table = pa.table(
                {
                    "ts": pa.array(np.full(per_tick, TS0 + i, np.int64)),
                    "topic": topics.take(devices),
                    "key": keys.take(devices),
                    "value": value,
                }
            )
            t0 = time.process_time()
            if stamp_type is not None:
                # As the network Producer sends them: rows grouped by shard, a sequence per shard.
                rows = np.sort(np.arange(per_tick) % shards).astype(np.int32)
                counts = np.bincount(rows, minlength=shards)
                stamp = stamp_type(1, 0, {s: sequences[s] for s in range(shards) if counts[s]})
                for s in range(shards):
                    sequences[s] += int(counts[s])
                await db.append_arrow(table, shards=rows, producer=stamp)
            else:
                await db.append_arrow(table)
            t1 = time.process_time()
            for s in range(shards):
                await db.read_frames(s, read_from[s], 1 << 20)
                read_from[s] = db.end_offset(s)
            append_s += t1 - t0
            read_s += time.process_time() - t1
        cpu = _cpu_s() - cpu0
    return {"cpu_us": cpu / ticks * 1e6, "append_us": append_s / ticks * 1e6, "read_us": read_s / ticks * 1e6}


def _one(root: str | None, args: argparse.Namespace) -> dict[str, Any]:
    """One run in a fresh interpreter (importing seglog from ``root`` if given)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if root:
        env["BENCH_TICK_SEGLOG"] = root
    argv = [sys.executable, "-m", "bench.net_tick", "--child", args.mode, str(args.shards), str(args.ticks)]
    out = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if root and Path(result["seglog"]).resolve() != Path(root).resolve():
        raise RuntimeError(f"the run imported seglog from {result['seglog']}, not {root}")
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["rows", "producer"], default="rows")
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--ticks", type=int, default=800)
    p.add_argument("--runs", type=int, default=3, help="runs per side (alternating with --before)")
    p.add_argument("--before", default=None, help="also run seglog imported from this directory")
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        root = os.environ.get("BENCH_TICK_SEGLOG")
        if root:  # before bench's own imports of seglog: -m puts this checkout first
            sys.path.insert(0, root)
        mode, shards, ticks = args.child[0], int(args.child[1]), int(args.child[2])
        with tempfile.TemporaryDirectory(prefix="seglog-net-tick-") as work:
            result: dict[str, Any] = dict(asyncio.run(_ticks(mode, shards, 250, ticks, work)))
        import seglog

        result["seglog"] = str(Path(seglog.__file__).parent.parent)
        print(json.dumps(result))
        return 0
    sides = {"after": None} if args.before is None else {"before": args.before, "after": None}
    got: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    load = os.getloadavg()[0]
    for _ in range(args.runs):
        for name, root in sides.items():
            got[name].append(_one(root, args))
    print(
        f"{args.mode}, {args.shards} shards, 250 records per tick, {args.ticks} ticks, {args.runs} runs per side; "
        f"1-min load average {load:.1f} at start, {os.getloadavg()[0]:.1f} at end"
    )
    medians = {}
    for name, runs in got.items():
        medians[name] = {k: statistics.median(r[k] for r in runs) for k in ("cpu_us", "append_us", "read_us")}
        m = medians[name]
        each = ", ".join(f"{r['cpu_us']:,.0f}" for r in runs)
        print(
            f"  {name}: CPU per tick {m['cpu_us']:,.0f} us (append {m['append_us']:,.0f}, "
            f"tail reads {m['read_us']:,.0f}); runs: {each}"
        )
    if "before" in medians:
        print(f"  after / before: {medians['after']['cpu_us'] / medians['before']['cpu_us']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
