"""Transparent huge pages on and off: the same appends and reads in child processes, alternating.

    python -m bench.thp [--runs N] [--records N] [--out FILE.md]

Each run is a fresh process (the THP setting is process-wide and one-way) opening a fresh
store with ``thp="keep"`` (huge pages as the kernel's mode gives them) or ``thp="disable"``
(4 KiB pages: ``prctl(PR_SET_THP_DISABLE)``), then, in this order, one untimed pass of
``--records`` records and ``--passes`` timed ones (the same tables again: the cost shows in
a process that runs for seconds, once PyArrow's allocator hands memory back and takes it
again, which it does one second after it falls free):

* ``users``: 4 producers, ``append_arrow`` of keyed 1000-record batches of 100 B (10,000
  devices, a topic per device) into 16 shards, ``fsync="always"``;
* ``1p/1s``: one producer, the same batches into 1 shard, ``fsync="always"``;
* ``read_arrow``: the ``1p/1s`` database read back (its frames are in its segments: a
  one-shard append writes them in its drain).

Records per second (wall) and CPU µs per 1000 records (the process, all threads, user +
system); the kernel's THP mode is printed with the results (``madvise`` is enough for huge
pages here: PyArrow's allocator asks for them; with ``never`` both settings are the same). Medians of ``--runs`` alternating pairs and their ratio
(disable ÷ keep). The report goes to ``bench/results/thp-<date>.md`` (and ``.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "bench" / "results"
BATCH = 1000
DEVICES = 10_000
SHAPES = ("users", "1p/1s", "read_arrow")


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def _child(directory: str, thp: str, records: int, passes: int) -> dict[str, tuple[float, float]]:
    import time

    import numpy as np
    import pyarrow as pa

    import seglog

    rng = np.random.default_rng(11)
    topics = np.array([f"plant/line{d % 50:02d}/dev{d:05d}/temp" for d in range(DEVICES)], object)
    keys = np.array([f"dev{d:05d}".encode() for d in range(DEVICES)], object)
    value = pa.array([b"v" * 100] * BATCH, pa.binary())
    tables = []
    for b in range(records // BATCH):
        devices = rng.integers(0, DEVICES, BATCH)
        tables.append(
            pa.table(
                {
                    "ts": np.arange(b * BATCH, (b + 1) * BATCH, dtype=np.int64) + 1_700_000_000_000_000,
                    "topic": pa.array(topics[devices].tolist(), pa.string()),
                    "key": pa.array(keys[devices].tolist(), pa.binary()),
                    "value": value,
                }
            )
        )
    out: dict[str, tuple[float, float]] = {}
    async with seglog.open(directory, fsync="always", thp=thp) as store:  # type: ignore[arg-type]

        async def timed(name: str, work: Any) -> None:
            await work()  # untimed: the allocator's arena grows in this pass
            t0, c0 = time.perf_counter(), _cpu_s()
            for _ in range(passes):
                await work()
            n = passes * records
            out[name] = (n / (time.perf_counter() - t0), (_cpu_s() - c0) * 1e6 * BATCH / n)

        users = await store.create_db("users", shards=16)

        async def produce(db: seglog.Database, part: list[pa.Table]) -> None:
            for table in part:
                await db.append_arrow(table)

        parts = [tables[i::4] for i in range(4)]
        await timed("users", lambda: asyncio.gather(*(produce(users, p) for p in parts)))
        one = await store.create_db("one", shards=1)
        await timed("1p/1s", lambda: produce(one, tables))

        async def read_all() -> None:
            got = 0
            offset = one_start
            while True:
                table = await one.read_arrow(0, offset, 100_000)
                if table.num_rows == 0:
                    break
                offset = int(table.column("offset")[-1].as_py()) + 1
                got += table.num_rows
            assert got == records, got

        one_start = (passes + 1) * records - records  # read the last pass's records
        await timed("read_arrow", read_all)
    return out


def _run_child(thp: str, records: int, passes: int, base: str) -> dict[str, tuple[float, float]]:
    with tempfile.TemporaryDirectory(dir=base) as directory:
        proc = subprocess.run(
            [sys.executable, "-m", "bench.thp", "--child", directory, thp, str(records), str(passes)],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            check=True,
            capture_output=True,
            text=True,
        )
    result: dict[str, tuple[float, float]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5, help="alternating pairs of child processes (5)")
    p.add_argument("--records", type=int, default=300_000, help="records per pass (300,000)")
    p.add_argument("--passes", type=int, default=3, help="timed passes per shape, after one untimed (3)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--dir", default=None, help="where to put temporary data (default: system temp)")
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        directory, thp, records, passes = args.child
        print(json.dumps(asyncio.run(_child(directory, thp, int(records), int(passes)))))
        return 0
    from seglog._memory import kernel_thp_mode

    mode = kernel_thp_mode()
    load0 = os.getloadavg()[0]
    runs: dict[str, list[dict[str, tuple[float, float]]]] = {"keep": [], "disable": []}
    for i in range(args.runs):
        for thp in ("keep", "disable"):
            runs[thp].append(_run_child(thp, args.records, args.passes, args.dir or tempfile.gettempdir()))
            print(f"run {i + 1} {thp}: {runs[thp][-1]}", file=sys.stderr, flush=True)
    rows = []
    for shape in SHAPES:
        keep = [r[shape] for r in runs["keep"]]
        off = [r[shape] for r in runs["disable"]]
        rate_keep, rate_off = statistics.median(k[0] for k in keep), statistics.median(o[0] for o in off)
        cpu_keep, cpu_off = statistics.median(k[1] for k in keep), statistics.median(o[1] for o in off)
        rows.append(
            {
                "shape": shape,
                "rate_keep": rate_keep,
                "rate_disable": rate_off,
                "ratio": rate_off / rate_keep,
                "cpu_us_keep": cpu_keep,
                "cpu_us_disable": cpu_off,
                "cpu_ratio": cpu_off / cpu_keep,
                "runs_keep": keep,
                "runs_disable": off,
            }
        )
    date = dt.date.today().isoformat()
    lines = [
        f"# seglog THP benchmark, {date}",
        "",
        f"Kernel THP mode: {mode.value if mode else 'none'}; {args.records:,} records per pass, one untimed and "
        f"{args.passes} timed passes per shape; medians of "
        f"{args.runs} alternating pairs of child processes; 1-min load average {load0:.1f} at start, "
        f"{os.getloadavg()[0]:.1f} at end.",
        "",
        '| shape | records/s, thp="keep" | thp="disable" | disable ÷ keep | CPU µs per 1000 records, keep '
        "| disable | disable ÷ keep (CPU) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['shape']} | {r['rate_keep']:,.0f} | {r['rate_disable']:,.0f} | **{r['ratio']:.2f}** "
            f"| {r['cpu_us_keep']:,.0f} | {r['cpu_us_disable']:,.0f} | **{r['cpu_ratio']:.2f}** |"
        )
    report = "\n".join(lines) + "\n"
    print(report)
    out = args.out or RESULTS_DIR / f"thp-{date}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report)
    out.with_suffix(".json").write_text(
        json.dumps({"mode": mode.value if mode else None, "rows": rows}, indent=2)
    )
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
