"""Append latency on a fresh database while its journal grows and recycles: before (a git ref) and after.

    python -m bench.journal_growth [--before main] [--runs 3] [--seconds 10] [--journal-mib 64] [--out FILE.md]

Each run: a fresh store and database (16 shards, ``fsync="always"``, one I/O worker) in a
temporary directory, one producer appending 50 keyed 100 B records at a time, back to back
(or every ``--interval-ms``), for ``--seconds``; the latency of every append is recorded.
On a fresh database the journal grows from 1 MiB towards ``journal_bytes`` (64 MiB) during
the run, so the drains that used to zero-fill it (1, 2, 4, 8, 16 MiB steps, each written and
fdatasynced inside the drain) show in the tail; so do the checkpoints of a full journal (every
dirty segment synced before the journal is recycled: with ``--journal-mib 16`` and 250 records
every 5 ms, several per run), counted as the appends during which a journal's cycle moved.
Both sides run this script; only the
``seglog`` package differs (the earlier one from a temporary ``git worktree`` of ``--before``,
or ``--before-tree``), and runs alternate (before, after, after, before, ...) so a noisy
neighbour hurts both alike; each figure is also given as the median of the runs' same-run
ratios. The load average is printed with every run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "bench" / "results"


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


async def _measure(
    directory: Path,
    seconds: float,
    shards: int,
    records: int,
    value_bytes: int,
    interval_s: float,
    journal_mib: int,
) -> dict[str, Any]:
    import seglog

    lat: list[float] = []
    value = b"v" * value_bytes
    async with seglog.open(directory, fsync="always", io_workers=1, journal_bytes=journal_mib << 20) as store:
        db = await store.create_db("grow", shards=shards)
        batches = [
            [
                seglog.Record(topic="g/t", value=value, key=b"dev-%d" % ((b * records + i) % 10_000))
                for i in range(records)
            ]
            for b in range(64)
        ]
        engine: Any = db._engine  # type: ignore[attr-defined]
        journals = [w.journal for w in engine._writers]
        grew: list[float] = []  # appends during which a journal's zero-filled size moved
        recycled: list[float] = []  # appends during which a journal was checkpointed
        end = time.monotonic() + seconds
        n = 0
        while time.monotonic() < end:
            allocated = sum(j.allocated for j in journals)
            cycle = sum(j.cycle for j in journals)
            start = time.perf_counter()
            await db.append(batches[n % len(batches)])
            lat.append(time.perf_counter() - start)
            if sum(j.allocated for j in journals) != allocated:
                grew.append(lat[-1] * 1000)
            if sum(j.cycle for j in journals) != cycle:
                recycled.append(lat[-1] * 1000)
            n += 1
            if interval_s:
                await asyncio.sleep(max(0.0, interval_s - lat[-1]))
        journal_bytes = sum(j.allocated for j in journals)
        in_drain = sum(getattr(j, "sync_grow_count", -1) for j in journals)
    lat.sort()
    ms = [x * 1000 for x in lat]

    def q(p: float) -> float:
        return ms[min(len(ms) - 1, int(p * len(ms)))]

    return {
        "appends": len(ms),
        "p50_ms": q(0.50),
        "p99_ms": q(0.99),
        "p999_ms": q(0.999),
        "max_ms": ms[-1],
        "over_20ms": sum(1 for x in ms if x > 20),
        # Before: the drains that zero-filled a step; after: appends overlapping a grower chunk.
        "growth_appends": len(grew),
        "growth_max_ms": max(grew, default=0.0),
        "growth_median_ms": statistics.median(grew) if grew else 0.0,
        "checkpoint_appends": len(recycled),
        "checkpoint_max_ms": max(recycled, default=0.0),
        "checkpoint_median_ms": statistics.median(recycled) if recycled else 0.0,
        "journal_mib": journal_bytes / (1 << 20),
        "in_drain_growths": in_drain,
    }


def _one(argv: list[str]) -> int:
    """Child mode: ``--one ROOT DIR OUT.json seconds shards records value_bytes interval_ms journal_mib``."""
    root, directory, out, seconds, shards, records, value_bytes, interval_ms, journal_mib = argv
    sys.path.insert(0, root)
    import seglog

    assert seglog.__file__ is not None and seglog.__file__.startswith(root), seglog.__file__
    load_before = _loadavg()
    res = asyncio.run(
        _measure(
            Path(directory),
            float(seconds),
            int(shards),
            int(records),
            int(value_bytes),
            float(interval_ms) / 1000,
            int(journal_mib),
        )
    )
    res["load_before"] = load_before
    res["load_after"] = _loadavg()
    Path(out).write_text(json.dumps(res))
    return 0


def _run_side(root: Path, tmp: Path, tag: str, args: argparse.Namespace) -> dict[str, Any]:
    data = tmp / f"data-{tag}"
    out = tmp / f"{tag}.json"
    # This file run as a script (so the earlier tree's own bench/ cannot shadow it), with
    # ``seglog`` imported from ``root``.
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--one",
        str(root),
        str(data),
        str(out),
        str(args.seconds),
        str(args.shards),
        str(args.records),
        str(args.value_bytes),
        str(args.interval_ms),
        str(args.journal_mib),
    ]
    subprocess.run(cmd, check=True, cwd=REPO)
    subprocess.run(["rm", "-rf", str(data)], check=False)
    res: dict[str, Any] = json.loads(out.read_text())
    return res


_FIGURES = (
    "p50_ms",
    "p99_ms",
    "p999_ms",
    "max_ms",
    "over_20ms",
    "appends",
    "growth_appends",
    "growth_median_ms",
    "growth_max_ms",
    "checkpoint_appends",
    "checkpoint_median_ms",
    "checkpoint_max_ms",
)


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--one":
        return _one(sys.argv[2:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", default="main", help="git ref of the earlier code (default: main)")
    p.add_argument("--before-tree", type=Path, default=None, help="a checkout to use instead of --before")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--records", type=int, default=50)
    p.add_argument("--value-bytes", type=int, default=100)
    p.add_argument("--interval-ms", type=float, default=0.0, help="pace appends (0: back to back)")
    p.add_argument("--journal-mib", type=int, default=64, help="journal_bytes of the store, in MiB")
    p.add_argument("--dir", type=Path, default=None, help="where the databases go (default: the temp dir)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="seglog-jgrow-", dir=args.dir) as tmp_s:
        tmp = Path(tmp_s)
        tree = args.before_tree
        added = False
        if tree is None:
            tree = tmp / "tree"
            subprocess.run(
                ["git", "worktree", "add", "--detach", str(tree), args.before],
                cwd=REPO,
                check=True,
                capture_output=True,
            )
            added = True
        try:
            runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
            for k in range(args.runs):
                # Who goes first alternates too, so a load that drifts up or down favours neither.
                order = (("before", tree), ("after", REPO))
                for side, root in order if k % 2 == 0 else order[::-1]:
                    res = _run_side(root, tmp, f"{side}-{k}", args)
                    runs[side].append(res)
                    print(
                        f"run {k + 1}/{args.runs} {side:6}: p50 {res['p50_ms']:.2f} p99 {res['p99_ms']:.2f} "
                        f"p99.9 {res['p999_ms']:.2f} max {res['max_ms']:.1f} ms, {res['appends']} appends, "
                        f">20 ms: {res['over_20ms']}, in-drain growths {res['in_drain_growths']}, "
                        f"appends while the journal grew: {res['growth_appends']} "
                        f"(median {res['growth_median_ms']:.1f}, max {res['growth_max_ms']:.1f} ms), "
                        f"checkpoint appends: {res['checkpoint_appends']} (max {res['checkpoint_max_ms']:.1f} ms), "
                        f"journal {res['journal_mib']:.0f} MiB, load {res['load_before']} -> {res['load_after']}",
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            if added:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, check=False)
    lines = [
        f"# Append latency on a fresh database while its journal grows ({args.runs} interleaved runs each)",
        "",
        f"`python -m bench.journal_growth --before {args.before} --runs {args.runs} --seconds {args.seconds:g} "
        f"--interval-ms {args.interval_ms:g} --records {args.records} --journal-mib {args.journal_mib}`: "
        f"{args.shards} shards, {args.records} keyed "
        f"{args.value_bytes} B records per append, fsync=always, one I/O worker.",
        "",
        "| figure (median of runs) | before | after | after / before | median of the runs' after / before |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in _FIGURES:
        b = statistics.median(r[name] for r in runs["before"])
        a = statistics.median(r[name] for r in runs["after"])
        pairs = [
            ra[name] / rb[name] for ra, rb in zip(runs["after"], runs["before"], strict=True) if rb[name]
        ]
        paired = statistics.median(pairs) if pairs else float("nan")
        lines.append(f"| {name} | {b:,.2f} | {a:,.2f} | {a / b if b else float('nan'):.2f} | {paired:.2f} |")
    lines += [
        "",
        "growth_*: appends during which a journal's zero-filled size moved (before: the drains that",
        "zero-filled a step themselves; after: appends that overlapped a background chunk).",
        "checkpoint_*: appends during which a journal was checkpointed (its cycle moved).",
        "",
        "| run | side | p50 ms | p99 ms | max ms | growth appends: max ms | checkpoint appends: max ms "
        "| in-drain growths | load avg (start -> end) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for k in range(args.runs):
        for side in ("before", "after"):
            r = runs[side][k]
            lines.append(
                f"| {k + 1} | {side} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['max_ms']:.1f} | "
                f"{r['growth_max_ms']:.1f} | {r.get('checkpoint_max_ms', 0.0):.1f} | "
                f"{r['in_drain_growths'] if r['in_drain_growths'] >= 0 else 'n/a'} | {r['load_before']} -> {r['load_after']} |"
            )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
