"""Reading the cluster metadata as databases accumulate: one snapshot against a read per database.

    python -m bench.metadata [--dbs 1,10,100] [--shards 16] [--repeats 5] [--out FILE.md]

Every metadata change (an ISR change, a node lease, a new database) makes every node of the
cluster, and the controller, read the metadata again. One etcd (``make etcd``) on loopback,
three registered nodes and N replicated databases of ``--shards`` shards; best of
``--repeats`` of each way of reading all of it:

* **per database** (the baseline, what nodes did before session 20): the database keys, then
  per database its settings and its shard keys, each a request of its own;
* **snapshot, first**: ``ClusterMetadata.snapshot()`` on a fresh ``ClusterMetadata``: one range
  of the whole prefix, every shard state parsed;
* **snapshot, next**: the same on the instance that took the last one, nothing changed in
  between: states whose ``mod_revision`` did not move are not parsed again (every node's case).

Writes ``bench/results/metadata-<date>.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench._report import write_report
from bench.cluster import Etcd
from seglog.cluster.etcd import EtcdClient
from seglog.cluster.metadata import ClusterMetadata, DbMeta, NodeInfo

REPO = Path(__file__).resolve().parent.parent


async def per_database(meta: ClusterMetadata) -> int:
    """The reads a node made per refresh before snapshots; how many shard states it got."""
    await meta.live_nodes()
    got = 0
    for name in await meta.list_dbs():
        await meta.get_db(name)
        got += len(await meta.shards(name))
    return got


async def _best_ms(fn: Callable[[], Awaitable[object]], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        await fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1000


async def run(work: Path, counts: list[int], shards: int, repeats: int) -> list[dict[str, Any]]:
    etcd = Etcd(work)
    await etcd.start()
    rows = []
    try:
        async with EtcdClient(etcd.url) as client:
            meta = ClusterMetadata(client)
            for n in (1, 2, 3):
                await meta.register_node(NodeInfo(n, f"http://n{n}"), ttl_s=600)
            made = 0
            for count in counts:
                while made < count:
                    await meta.create_db(DbMeta(f"db{made:04d}", shards, 3, 2))
                    made += 1
                assert await per_database(meta) == count * shards
                snap = await meta.snapshot()
                assert len(snap.dbs) == count and sum(map(len, snap.shards.values())) == count * shards

                async def first() -> object:
                    return await ClusterMetadata(client).snapshot()

                rows.append(
                    {
                        "dbs": count,
                        "shards": shards,
                        "per_database_ms": await _best_ms(lambda: per_database(meta), repeats),
                        "snapshot_first_ms": await _best_ms(first, repeats),
                        "snapshot_next_ms": await _best_ms(meta.snapshot, repeats),
                    }
                )
    finally:
        etcd.stop()
    return rows


def render(rows: list[dict[str, Any]], repeats: int) -> str:
    lines = [
        f"One etcd on loopback, 3 nodes, N databases of {rows[0]['shards']} shards (replication "
        f"factor 3); best of {repeats}.",
        "",
        "| databases | per database ms | snapshot, first ms | snapshot, next ms | per database ÷ snapshot, next |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['dbs']} | {r['per_database_ms']:.1f} | {r['snapshot_first_ms']:.1f} | "
            f"{r['snapshot_next_ms']:.1f} | {r['per_database_ms'] / r['snapshot_next_ms']:.1f}x |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dbs", default="1,10,100", help="comma-separated database counts")
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    counts = sorted(int(x) for x in args.dbs.split(","))
    with tempfile.TemporaryDirectory(prefix="seglog-metadata-") as tmp:
        rows = asyncio.run(run(Path(tmp), counts, args.shards, args.repeats))
    out = args.out or REPO / "bench" / "results" / f"metadata-{dt.date.today().isoformat()}.md"
    write_report(
        out, "Cluster metadata reads (bench/metadata.py)", render(rows, args.repeats), {"rows": rows}
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
