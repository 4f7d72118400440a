"""Reading ``Record`` objects against the LMDB peer, alternating in one process.

Usage::

    python -m bench.read_records [--records N] [--value-bytes S] [--reps R] [--all-fields]

The peer table (``bench.compare``) reads each system once, minutes apart, on a machine whose
load changes under it. This bench writes the peer table's workload once into seglog and into
LMDB (the same peers, ``bench/peers``), keeps the workload alive as the runner does (the
expected rows: a heap of millions of list elements, which is what a full garbage collection
has to walk), then reads both back ``--reps`` times, alternating, and prints the median
records/s and the median process CPU per record of each. ``--all-fields`` makes the seglog
side build ``(topic, ts, value, key, headers, shard, offset)`` instead of the peer's
``(topic, ts, value)``: the cost of touching every field of every record.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from bench.compare import DEFAULT_SEED, make_workload
from bench.peers import READ_PAGE_RECORDS, PeerContext
from bench.peers.lmdb_store import LmdbPeer
from bench.peers.seglog_embedded import SHARD, SeglogPeer

NS_PER_S = 1e9


class _AllFieldsPeer(SeglogPeer):
    """The seglog peer, reading every field of every record."""

    async def read_all(self) -> AsyncIterator[Any]:
        """``db.read`` pages as 7-tuples of every ``Record`` field."""
        offset = 0
        while True:
            records = await self._db.read(SHARD, offset, max_records=READ_PAGE_RECORDS)
            if not records:
                return
            yield [(r.topic, r.ts, r.value, r.key, r.headers, r.shard, r.offset) for r in records]
            offset = records[-1].offset + 1


async def _drain(peer: Any) -> int:
    n = 0
    async for page in peer.read_all():
        n += len(page)
    return n


async def run(
    records: int, value_bytes: int, reps: int, all_fields: bool
) -> dict[str, list[tuple[float, float]]]:
    """Write once per system, then read ``reps`` times alternating; (records/s, CPU ns/record) each."""
    workload = make_workload(records, value_bytes, DEFAULT_SEED)
    expected = workload.rows()  # kept alive, as the runner keeps it
    out: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="seglog-read-records-") as tmp:
        peers: dict[str, Any] = {}
        try:
            for cls in (_AllFieldsPeer if all_fields else SeglogPeer, LmdbPeer):
                work = Path(tmp) / cls.name
                work.mkdir()
                peer = cls(PeerContext(work, work, records, value_bytes))
                peers[cls.name] = peer
                await peer.setup()
                for start in range(0, records, 1000):
                    await peer.write_batch(peer.encode(workload, start, min(start + 1000, records)))
            for _ in range(reps):
                for name, peer in peers.items():
                    cpu0, t0 = time.process_time(), time.perf_counter()
                    n = await _drain(peer)
                    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
                    if n != len(expected):
                        raise RuntimeError(f"{name} read back {n} of {len(expected)} records")
                    out.setdefault(name, []).append((n / wall, cpu / n * NS_PER_S))
        finally:
            for peer in peers.values():
                await peer.teardown()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: print one line per system."""
    parser = argparse.ArgumentParser(prog="python -m bench.read_records", description=__doc__)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--all-fields", action="store_true")
    args = parser.parse_args(argv)
    results = asyncio.run(run(args.records, args.value_bytes, args.reps, args.all_fields))
    shape = "all 7 fields" if args.all_fields else "(topic, ts, value)"
    for name, runs in results.items():
        rate = statistics.median(r for r, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        print(
            f"{name:7} S={args.value_bytes} N={args.records:,} {shape}: median {rate:,.0f} records/s, "
            f"{cpu:.0f} ns CPU/record over {len(runs)} reads"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
