"""The tier manifest as history grows: load, save and lookups at 1,000 to 100,000 objects.

    python -m bench.manifest [--sizes 1000,10000,100000] [--shards 16] [--before REF]
                             [--before-max-entries N] [--out FILE.md]

A database that keeps its history in the tier gains one object per sealed segment, forever
(unless tier retention drops them): at 100 MB/s of ingest and 64 MiB segments that is ~5,600
objects an hour. Every object is one entry of the database's manifest (``_manifest.json``),
which is loaded when the database opens and at every tier pass of a follower, saved twice
per upload, and asked on every read below the local start and every ``start_offset`` (each
fetch reply carries the log start). This measures, on a synthetic manifest of N committed
entries over ``--shards`` shards (10 ranged-read parts each, as a 64 MiB segment's object
has):

* **load**: ``Manifest.from_json`` of the document (opening the database, a refresh);
* **save**: ``Manifest.to_json``: the first after a load (every entry serialised), and
  the next ones (only changed entries are; before session 20 every save serialised all),
  and the document's size;
* **upload**: one upload's manifest work, ``begin_upload`` + save + ``mark_committed`` + save;
* **find_offset**: the entry holding a random offset (a tier read), µs per lookup;
* **logical start**: ``db_tier.logical_start`` (``Database.start_offset``), µs per call.

``--before REF`` runs the same measurements with the ``seglog`` package of ``REF`` in a child
process, up to ``--before-max-entries`` entries (main before session 20 loaded a manifest in
quadratic time: ~6 minutes at 100,000 entries). Writes ``bench/results/manifest-<date>.md``
and ``.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._refs import export_seglog, head_commit

REPO = Path(__file__).resolve().parent.parent
PARTS_PER_OBJECT = 10
RECORDS_PER_OBJECT = 500_000
OBJECT_BYTES = 40_000_000
LOOKUPS = 1000


def _best_s(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _entry(shard: int, base: int, i: int) -> Any:
    from seglog.tiering.manifest import EntryState, ManifestEntry, ObjectPart
    from seglog.tiering.parquet import object_key

    end = base + RECORDS_PER_OBJECT - 1
    step = OBJECT_BYTES // PARTS_PER_OBJECT
    return ManifestEntry(
        key=object_key("db", shard, base, end),
        shard=shard,
        base_offset=base,
        end_offset=end,
        min_ts=1_700_000_000_000_000 + i * 1_000_000,
        max_ts=1_700_000_000_000_000 + i * 1_000_000 + 999_999,
        rows=RECORDS_PER_OBJECT,
        bytes=OBJECT_BYTES,
        checksum=f"{i:064x}",
        state=EntryState.COMMITTED,
        parts=tuple(
            ObjectPart(j * step, (j + 1) * step, (i * 31 + j) & 0xFFFFFFFF) for j in range(PARTS_PER_OBJECT)
        ),
    )


def measure(n: int, shards: int) -> dict[str, float]:
    """Every figure for a manifest of ``n`` committed entries over ``shards`` shards."""
    from seglog.tiering.db_tier import logical_start
    from seglog.tiering.manifest import Manifest

    entries = [_entry(i % shards, (i // shards) * RECORDS_PER_OBJECT, i) for i in range(n)]
    per_shard = -(-n // shards)
    doc = Manifest("db", entries).to_json()
    repeat = 3 if n <= 20_000 else 1
    load_s = _best_s(lambda: Manifest.from_json(doc, db="db"), repeat)
    manifest = Manifest.from_json(doc, db="db")
    first_save_s = _best_s(lambda: Manifest.from_json(doc, db="db").to_json(), 1) - load_s
    manifest.to_json()
    save_s = _best_s(manifest.to_json, repeat)

    def upload() -> None:
        fresh = _entry(0, per_shard * RECORDS_PER_OBJECT * 2, n)
        manifest.begin_upload(fresh)
        manifest.to_json()
        manifest.mark_committed(fresh.key)
        manifest.to_json()
        manifest.mark_deleting(fresh.key)
        manifest.remove(fresh.key)

    upload_s = _best_s(upload, repeat)
    rng = random.Random(7)
    probes = [
        (rng.randrange(shards), rng.randrange((n // shards) * RECORDS_PER_OBJECT)) for _ in range(LOOKUPS)
    ]

    def lookups() -> None:
        for shard, offset in probes:
            assert manifest.find_offset(shard, offset) is not None

    find_s = _best_s(lookups, repeat) / LOOKUPS
    local_starts = [(s, (n // shards) * RECORDS_PER_OBJECT) for s in range(shards)] * (LOOKUPS // shards)

    def starts() -> None:
        for shard, local in local_starts:
            assert logical_start(manifest, shard, local) == 0

    start_s = _best_s(starts, repeat) / len(local_starts)
    return {
        "entries": n,
        "doc_kib": len(doc) / 1024,
        "load_ms": load_s * 1000,
        "first_save_ms": max(first_save_s, 0.0) * 1000,
        "save_ms": save_s * 1000,
        "upload_ms": upload_s * 1000,
        "find_offset_us": find_s * 1e6,
        "logical_start_us": start_s * 1e6,
    }


def _child(root: Path | None, sizes: list[int], shards: int) -> list[dict[str, float]]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (root, REPO) if p is not None)
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [sys.executable, "-m", "bench.manifest", "--child-json", f.name, "--shards", str(shards)]
        cmd += ["--sizes", ",".join(map(str, sizes))]
        subprocess.run(cmd, cwd=root or REPO, env=env, check=True)
        rows: list[dict[str, float]] = json.loads(Path(f.name).read_text())
    return rows


def render(sides: dict[str, list[dict[str, float]]], described: dict[str, str], shards: int) -> str:
    lines = [
        f"Synthetic manifests of N committed entries over {shards} shards, {PARTS_PER_OBJECT} parts "
        "per entry (a 64 MiB segment's object); best of 3 (1 at 100,000 entries). "
        + "; ".join(f"{k}: {v}" for k, v in described.items())
        + ".",
        "",
        "| side | entries | document KiB | load ms | first save ms | next save ms "
        "| one upload's manifest work ms | find_offset µs | logical start µs |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for side, rows in sides.items():
        for r in rows:
            lines.append(
                f"| {side} | {r['entries']:,.0f} | {r['doc_kib']:,.0f} | {r['load_ms']:,.1f} | "
                f"{r.get('first_save_ms', r['save_ms']):,.1f} | {r['save_ms']:,.1f} | {r['upload_ms']:,.1f} | {r['find_offset_us']:,.1f} | "
                f"{r['logical_start_us']:,.1f} |"
            )
    if "before" in sides:
        lines += ["", "after ÷ before (time; below 1 is faster):", ""]
        before = {int(r["entries"]): r for r in sides["before"]}
        for r in sides["after"]:
            b = before.get(int(r["entries"]))
            if b is None:
                continue
            ratios = ", ".join(
                f"{name} {r[key] / b[key]:.3f}"
                for name, key in (
                    ("load", "load_ms"),
                    ("save", "save_ms"),
                    ("upload", "upload_ms"),
                    ("find_offset", "find_offset_us"),
                    ("logical start", "logical_start_us"),
                )
            )
            lines.append(f"* {r['entries']:,.0f} entries: {ratios}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1000,10000,100000", help="comma-separated entry counts")
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--before", default=None, help="git ref whose seglog package is the 'before' side")
    p.add_argument("--before-max-entries", type=int, default=10_000)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--child-json", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    sizes = [int(x) for x in args.sizes.split(",")]
    if args.child_json:
        Path(args.child_json).write_text(json.dumps([measure(n, args.shards) for n in sizes]))
        return 0
    from bench._report import write_report

    described = {"after": f"this checkout (HEAD {head_commit()}, with its working tree)"}
    sides: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="seglog-before-") as tmp:
        if args.before:
            commit = export_seglog(args.before, Path(tmp))
            described["before"] = f"seglog of {args.before} ({commit})"
            sides["before"] = _child(
                Path(tmp), [n for n in sizes if n <= args.before_max_entries], args.shards
            )
        sides["after"] = _child(None, sizes, args.shards)
    markdown = render(sides, described, args.shards)
    out = args.out or REPO / "bench" / "results" / f"manifest-{dt.date.today().isoformat()}.md"
    write_report(
        out, "Tier manifest scaling (bench/manifest.py)", markdown, {"sides": sides, "described": described}
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
