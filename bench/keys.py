"""Keyed appends and ``read_key``: this tree against an earlier commit, in one run, same machine.

    python -m bench.keys [--before REF] [--quick] [--records N] [--lookup-records N]
                         [--lookup-keys K] [--samples S] [--repeats R] [--out FILE.md] [--dir DIR]

Each side (this working tree, and with ``--before REF`` the ``seglog`` package of that commit,
exported with ``git archive``) runs in its own process, ``--repeats`` times, alternating sides.
Every run measures:

* **append**: 1 producer, 1 shard, ``append_arrow`` of 1000-record batches, 100 B values,
  ``fsync="always"``, each awaited; keyed (a key on every record, 10,000 device ids) and
  unkeyed; each divided by a raw ``os.write`` + ``os.fdatasync`` baseline of the same frames
  run just before it (``bench.core.raw_loop``).
* **read_key**: one shard of ``--lookup-records`` records appended in 1000-record batches with
  ``--lookup-keys`` distinct keys spread so that *every* frame holds every key (record ``i``
  has key ``(i * 7919) % K``), plus a ``rare`` key on one record in 100,000 (fewer records:
  20 rare records in all). After a reopen:
  ``read_key`` p50/p99 over random common keys (each returns ``N / K`` records from every
  frame), the same for the rare key, the index lookup alone (``ShardIndex.key_frames`` or, on
  the old code, ``key_offsets``), and a full ``read_arrow`` scan of the shard for scale.

The report goes to ``bench/results/keys-<date>.md`` (and ``.json``); ``--quick`` only prints.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from bench._refs import export_seglog

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "bench" / "results"


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _q(xs: list[float], p: int) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[p - 1] * 1000 if len(xs) > 1 else xs[0] * 1000


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file())


# --- the child: measures whatever seglog it imports -------------------------------------


class _IndexCpu:
    """Thread CPU time spent in ``ShardIndex.add`` (old and new code both have it) while entered.

    CPU time, unlike wall time, is not inflated when other processes share the machine.
    """

    def __init__(self) -> None:
        self.seconds = 0.0

    def __enter__(self) -> _IndexCpu:
        from seglog.index import shard_index

        self._cls = shard_index.ShardIndex
        self._orig = orig = self._cls.add

        def add(index: Any, frames: Any) -> None:
            t0 = time.thread_time()
            try:
                orig(index, frames)
            finally:
                self.seconds += time.thread_time() - t0

        self._cls.add = add
        return self

    def __exit__(self, *exc: object) -> None:
        self._cls.add = self._orig


async def _appends(base: Path, n: int) -> dict[str, float]:
    from bench.core import Shape, make_batches, raw_loop, seglog_append

    shape = Shape("1p/1s", 1, 1, True, "1 writer, 1 file, 1 fdatasync per batch")
    out: dict[str, float] = {}
    for keyed in (True, False):
        batches = make_batches(n, 100, keyed=keyed)
        raw = raw_loop(base / "raw", batches, shape, 100)
        c0 = time.process_time()
        with _IndexCpu() as index_cpu:
            row = await seglog_append(base / "db", batches, shape, 100, arrow=True)
        label = "keyed" if keyed else "unkeyed"
        out[f"raw_{label}"] = raw.records_s
        out[f"seglog_{label}"] = row.records_s
        out[f"ratio_{label}"] = row.records_s / raw.records_s
        # Includes opening and closing the store: per-record costs dominate at these sizes.
        out[f"cpu_us_{label}"] = (time.process_time() - c0) / n * 1e6
        out[f"index_cpu_us_{label}"] = index_cpu.seconds / n * 1e6
    return out


def _rare_every(n: int) -> int:
    return max(10, min(100_000, n // 20))


def _lookup_batch(start: int, n: int, keys: pa.Array, rare_every: int) -> pa.Table:
    i = np.arange(start, start + n, dtype=np.int64)
    idx = (i * 7919) % (len(keys) - 1)
    idx[i % rare_every == rare_every // 2] = len(keys) - 1
    return pa.table(
        {
            "ts": pa.array(1_700_000_000_000_000 + i),
            "topic": pa.array(["sensors/a/b/temp"] * n),
            "key": keys.take(pa.array(idx)),
            "value": pa.array([b"x" * 100] * n, pa.binary()),
        }
    )


async def _read_key(base: Path, n: int, k: int, samples: int) -> dict[str, Any]:
    import seglog

    directory = base / "lookup"
    shutil.rmtree(directory, ignore_errors=True)
    keys = pa.array([b"dev-%d" % j for j in range(k)] + [b"rare"], pa.binary())
    t0 = time.perf_counter()
    async with seglog.open(directory, fsync="never") as store:
        db = await store.create_db("lookup", shards=1)
        for start in range(0, n, 1000):
            await db.append_arrow(_lookup_batch(start, min(1000, n - start), keys, _rare_every(n)), shard=0)
    build_s = time.perf_counter() - t0
    rng = random.Random(5)
    out: dict[str, Any] = {"build_s": build_s, "records": n, "keys": k}
    async with seglog.open(directory) as store:
        db = await store.open_db("lookup")
        shard = db._engine._shards[0]
        index = shard.index
        lookup = getattr(index, "key_frames", None) or index.key_offsets
        t0 = time.perf_counter()
        offset = 0
        while True:
            got = (await db.read_arrow(0, offset, 100_000)).num_rows
            if not got:
                break
            offset += got
        out["scan_ms"] = (time.perf_counter() - t0) * 1000
        common, index_only = [], []
        for _ in range(samples):
            key = b"dev-%d" % rng.randrange(k)
            t0 = time.perf_counter()
            table = await db.read_key_arrow(0, key)
            common.append(time.perf_counter() - t0)
            assert abs(table.num_rows - n // k) <= 1, table.num_rows
            t0 = time.perf_counter()
            lookup(key)
            index_only.append(time.perf_counter() - t0)
        rare = []
        want_rare = len(range(_rare_every(n) // 2, n, _rare_every(n)))
        for _ in range(max(5, samples // 2)):
            t0 = time.perf_counter()
            table = await db.read_key_arrow(0, b"rare")
            rare.append(time.perf_counter() - t0)
            assert table.num_rows == want_rare, (table.num_rows, want_rare)
        out.update(
            {
                "common_p50_ms": _q(common, 50),
                "common_p99_ms": _q(common, 99),
                "index_p50_ms": _q(index_only, 50),
                "index_p99_ms": _q(index_only, 99),
                "rare_p50_ms": _q(rare, 50),
                "rare_p99_ms": _q(rare, 99),
                "rare_records": want_rare,
                "frames": len(list(shard.frames(0, db.end_offset(0)))),
            }
        )
    index_dirs = [p for p in directory.rglob("index") if p.is_dir()]
    out["index_bytes"] = sum(_dir_bytes(p) for p in index_dirs)
    out["segment_bytes"] = sum(p.stat().st_size for p in directory.rglob("*.log"))
    shutil.rmtree(directory, ignore_errors=True)
    return out


async def child(args: argparse.Namespace) -> dict[str, Any]:
    import seglog

    base = Path(tempfile.mkdtemp(prefix="seglog-keys-", dir=args.dir))
    try:
        res: dict[str, Any] = {"seglog": str(Path(seglog.__file__).parent)}
        res["append"] = await _appends(base, args.records)
        res["read_key"] = await _read_key(base, args.lookup_records, args.lookup_keys, args.samples)
        return res
    finally:
        shutil.rmtree(base, ignore_errors=True)


# --- the parent: runs both sides and reports ---------------------------------------------


def _run_side(root: Path | None, args: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ)
    # The side's seglog first; bench (this file, bench.core) always from this tree.
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (root, REPO) if p is not None)
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [
            sys.executable,
            "-m",
            "bench.keys",
            "--child-json",
            f.name,
            "--records",
            str(args.records),
            "--lookup-records",
            str(args.lookup_records),
            "--lookup-keys",
            str(args.lookup_keys),
            "--samples",
            str(args.samples),
        ]
        if args.dir:
            cmd += ["--dir", str(args.dir)]
        # ``-m`` puts the working directory first on sys.path: run where the side's seglog is.
        subprocess.run(cmd, cwd=root or REPO, env=env, check=True)
        res = dict(json.loads(Path(f.name).read_text()))
    want = (root or REPO) / "seglog"
    if Path(res["seglog"]) != want:
        raise RuntimeError(f"the side ran {res['seglog']}, not {want}")
    return res


def _median(runs: list[dict[str, Any]], section: str, key: str) -> float:
    return float(statistics.median(r[section][key] for r in runs))


def render(meta: dict[str, Any], sides: dict[str, list[dict[str, Any]]]) -> str:
    names = list(sides)
    out = [
        f"# seglog keyed append and read_key, {meta['date']} ({meta['mode']})",
        "",
        f"Machine: {meta['machine']}; filesystem: {meta['filesystem']}; {meta['load']}.",
        "Sides: " + "; ".join(f"**{s}** = {meta['sides'][s]}" for s in names) + ".",
        f"Each figure is the median of {meta['args']['repeats']} runs per side (sides alternated); "
        "ratios are against the raw write+fdatasync baseline run just before, in the same process.",
        "",
        f"## Append: 1 producer, 1 shard, append_arrow, 1000-record batches, 100 B values, fsync=always, "
        f"{meta['args']['records']:,} records",
        "",
        "| side | raw records/s | unkeyed records/s | ÷ raw | keyed records/s | ÷ raw | keyed ÷ unkeyed "
        "| CPU µs/record unkeyed / keyed | of which index (ShardIndex.add) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in names:
        runs = sides[s]
        a = lambda key, runs=runs: _median(runs, "append", key)  # noqa: E731
        out.append(
            f"| {s} | {a('raw_keyed'):,.0f} | {a('seglog_unkeyed'):,.0f} | {a('ratio_unkeyed'):.2f} "
            f"| {a('seglog_keyed'):,.0f} | {a('ratio_keyed'):.2f} | {a('seglog_keyed') / a('seglog_unkeyed'):.2f} "
            f"| {a('cpu_us_unkeyed'):.2f} / {a('cpu_us_keyed'):.2f} "
            f"| {a('index_cpu_us_unkeyed'):.3f} / {a('index_cpu_us_keyed'):.3f} |"
        )
    rk = sides[names[0]][0]["read_key"]
    out += [
        "",
        f"## read_key on one shard of {rk['records']:,} records ({rk['frames']:,} frames of 1000), "
        f"{rk['keys']:,} keys in every frame + 1 rare key",
        "",
        f"A common key returns {rk['records'] // rk['keys']:,} records, one from every frame; the rare key "
        f"{rk['rare_records']} records. `index` = the index lookup alone; `scan` = read_arrow of the whole shard.",
        "",
        "| side | read_key common p50 ms | p99 ms | index lookup p50 ms | rare key p50 ms | p99 ms "
        "| full scan ms | build s | index MB | segments MB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in names:
        runs = sides[s]
        m = lambda key, runs=runs: _median(runs, "read_key", key)  # noqa: E731
        out.append(
            f"| {s} | {m('common_p50_ms'):.1f} | {m('common_p99_ms'):.1f} | {m('index_p50_ms'):.2f} "
            f"| {m('rare_p50_ms'):.2f} | {m('rare_p99_ms'):.2f} | {m('scan_ms'):.0f} | {m('build_s'):.1f} "
            f"| {m('index_bytes') / 1e6:.1f} | {m('segment_bytes') / 1e6:.0f} |"
        )
    out += ["", f"Runtime {meta['runtime_s']} s."]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", default=None, help="git ref whose seglog package is the 'before' side")
    p.add_argument(
        "--quick", action="store_true", help="small sizes (for tests); writes no file without --out"
    )
    p.add_argument("--records", type=int, default=300_000, help="records per append row")
    p.add_argument("--lookup-records", type=int, default=2_000_000)
    p.add_argument("--lookup-keys", type=int, default=1000)
    p.add_argument("--samples", type=int, default=40, help="read_key calls per run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--dir", default=None, help="where to put temporary data (default: system temp)")
    p.add_argument("--child-json", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child_json:
        Path(args.child_json).write_text(json.dumps(asyncio.run(child(args))))
        return 0
    if args.quick:
        args.records, args.lookup_records, args.lookup_keys, args.samples, args.repeats = (
            5_000,
            20_000,
            100,
            5,
            1,
        )
    from bench.core import _git_state, run_meta

    t_start = time.perf_counter()
    load_start = os.getloadavg()[0]
    sides: dict[str, list[dict[str, Any]]] = {}
    described: dict[str, str] = {"after": f"this tree ({_git_state()})"}
    with tempfile.TemporaryDirectory(prefix="seglog-before-") as tmp:
        roots: dict[str, Path | None] = {"after": None}
        if args.before:
            commit = export_seglog(args.before, Path(tmp))
            roots = {"before": Path(tmp), "after": None}
            described["before"] = f"seglog of {args.before} ({commit})"
        for r in range(args.repeats):
            for side in roots if r % 2 == 0 else reversed(list(roots)):
                _log(f"run {r + 1}/{args.repeats}: {side}")
                sides.setdefault(side, []).append(_run_side(roots[side], args))
    sides = {s: sides[s] for s in roots}
    meta = run_meta(
        args, load_start, t_start, git=False, skip_args=("out", "dir", "child_json"), sides=described
    )
    text = render(meta, sides)
    print(text)
    out = args.out if args.out is not None or args.quick else RESULTS_DIR / f"keys-{meta['date']}.md"
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        out.with_suffix(".json").write_text(json.dumps({"meta": meta, "runs": sides}, indent=1) + "\n")
        _log(f"wrote {out} and {out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
