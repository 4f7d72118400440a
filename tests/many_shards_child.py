"""Child of test_many_shards: a 10,000-shard store under ``ulimit -n 1024``; prints a JSON report."""

from __future__ import annotations

import resource
import sys

resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))  # before anything opens a file

import asyncio  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import seglog  # noqa: E402


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def main(data: Path, shards: int, records: int) -> dict[str, object]:
    report: dict[str, object] = {"shards": shards, "records": records}
    expected: dict[int, list[bytes]] = {}
    t0 = time.perf_counter()
    async with seglog.open(data) as store:
        db = await store.create_db("many", shards=shards)
        report["create_s"] = time.perf_counter() - t0
        report["fds_after_create"] = _open_fds()
        t1 = time.perf_counter()
        for b in range(0, records, 1000):
            recs = [
                seglog.Record(topic="t/x", value=b"v%d" % i, key=b"dev-%d" % i) for i in range(b, b + 1000)
            ]
            for meta, rec in zip(await db.append(recs), recs, strict=True):
                expected.setdefault(meta.shard, []).append(rec.value)
        report["append_s"] = time.perf_counter() - t1
        report["fds_after_append"] = _open_fds()
        t2 = time.perf_counter()
    report["close_s"] = time.perf_counter() - t2
    t3 = time.perf_counter()
    async with seglog.open(data) as store:
        db = await store.open_db("many")
        report["reopen_s"] = time.perf_counter() - t3
        t4 = time.perf_counter()
        read = 0
        for shard in range(shards):
            values = (await db.read_arrow(shard, 0, 10**6)).column("value").to_pylist()
            if values != expected.get(shard, []):
                raise AssertionError(
                    f"shard {shard}: read {values[:3]}..., expected {expected.get(shard, [])[:3]}..."
                )
            read += len(values)
        report["read_s"] = time.perf_counter() - t4
        report["read_records"] = read
        report["touched_shards"] = len(expected)
        report["fds_after_read"] = _open_fds()
    report["max_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return report


if __name__ == "__main__":
    out = asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])))
    print(json.dumps(out))
