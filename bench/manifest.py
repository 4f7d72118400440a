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
* **saved upload**: the same through real saves (``Manifest.save`` to a local-directory tier
  and a local copy, both fsync'd), averaged over ``--uploads`` uploads (enough for heads to
  fill up and checkpoints to be rewritten, since session 21), with the bytes put into the
  tier per upload (heads and checkpoints; the local copy writes as much again), loading
  it from the tier, and a shared reader's refresh after one more upload (another node's
  tier pass), and meanwhile how long a lookup (``log_start`` + ``find_offset``, what the
  event loop asks) takes, once a millisecond from another thread;
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
import threading
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


class _CountingTarget:
    """A local-directory tier that counts the bytes put into it."""

    def __init__(self, root: Path) -> None:
        from seglog.tiering import LocalTarget

        self.inner = LocalTarget(root)
        self.bytes_put = 0

    def put(self, key: str, data: bytes) -> Any:
        self.bytes_put += len(data)
        return self.inner.put(key, data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


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


def measure(n: int, shards: int, uploads: int) -> dict[str, float]:
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
    saved = _saved_uploads(entries, shards, per_shard, uploads)
    return {
        **saved,
        "entries": n,
        "doc_kib": len(doc) / 1024,
        "load_ms": load_s * 1000,
        "first_save_ms": max(first_save_s, 0.0) * 1000,
        "save_ms": save_s * 1000,
        "upload_ms": upload_s * 1000,
        "find_offset_us": find_s * 1e6,
        "logical_start_us": start_s * 1e6,
    }


def _saved_uploads(entries: list[Any], shards: int, per_shard: int, uploads: int) -> dict[str, float]:
    """Mean wall time and tier bytes of one upload's two real saves, over ``uploads`` uploads."""
    from seglog.tiering.manifest import Manifest

    with tempfile.TemporaryDirectory(prefix="seglog-bench-manifest-") as tmp:
        target = _CountingTarget(Path(tmp) / "tier")
        local = Path(tmp) / "local" / "tier-manifest.json"
        manifest = Manifest("db", entries)
        manifest.save(target, local_path=local)  # type: ignore[arg-type]
        target.bytes_put = 0
        # Meanwhile, what the event loop does on every read below the local start and every
        # start_offset: a lookup, once a millisecond; how long each took.
        stop = threading.Event()
        waits: list[float] = []

        def look() -> None:
            while not stop.wait(0.001):
                t = time.perf_counter()
                manifest.log_start(0)
                manifest.find_offset(0, 0)
                waits.append(time.perf_counter() - t)

        looker = threading.Thread(target=look)
        looker.start()
        t0 = time.perf_counter()
        for u in range(uploads):
            fresh = _entry(u % shards, (per_shard + u // shards) * RECORDS_PER_OBJECT, len(entries) + u)
            manifest.begin_upload(fresh)
            manifest.save(target, local_path=local)  # type: ignore[arg-type]
            manifest.mark_committed(fresh.key)
            manifest.save(target, local_path=local)  # type: ignore[arg-type]
        elapsed = time.perf_counter() - t0
        stop.set()
        looker.join()
        waits.sort()
        t0 = time.perf_counter()
        loaded = Manifest.load(target, "db")  # type: ignore[arg-type]
        load_tier_s = time.perf_counter() - t0
        assert len(loaded.entries()) == len(entries) + uploads
        # Another node's tier pass after this writer's next upload: a refresh.
        reader = Manifest.load_shared(target, "db")  # type: ignore[arg-type]
        fresh = _entry(0, (per_shard + uploads) * RECORDS_PER_OBJECT, len(entries) + uploads)
        manifest.begin_upload(fresh)
        manifest.mark_committed(fresh.key)
        manifest.save(target, local_path=local)  # type: ignore[arg-type]
        t0 = time.perf_counter()
        reader.refresh(target)  # type: ignore[arg-type]
        refresh_s = time.perf_counter() - t0
        assert reader.get(fresh.key) is not None
    return {
        "lookup_p99_ms": waits[int(len(waits) * 0.99)] * 1000 if waits else 0.0,
        "lookup_max_ms": waits[-1] * 1000 if waits else 0.0,
        "refresh_ms": refresh_s * 1000,
        "uploads": uploads,
        "saved_upload_ms": elapsed / uploads * 1000,
        "upload_tier_kib": target.bytes_put / uploads / 1024,
        "load_tier_ms": load_tier_s * 1000,
    }


def _child(root: Path | None, sizes: list[int], shards: int, uploads: int) -> list[dict[str, float]]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (root, REPO) if p is not None)
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [sys.executable, "-m", "bench.manifest", "--child-json", f.name, "--shards", str(shards)]
        cmd += ["--uploads", str(uploads)]
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
        "| one upload's manifest work ms | find_offset µs | logical start µs "
        "| saved upload ms | tier KiB put per upload | load from the tier ms | refresh after a save ms "
        "| a lookup during saves, p99 / max ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for side, rows in sides.items():
        for r in rows:
            lines.append(
                f"| {side} | {r['entries']:,.0f} | {r['doc_kib']:,.0f} | {r['load_ms']:,.1f} | "
                f"{r.get('first_save_ms', r['save_ms']):,.1f} | {r['save_ms']:,.1f} | {r['upload_ms']:,.1f} | {r['find_offset_us']:,.1f} | "
                f"{r['logical_start_us']:,.1f} | {r['saved_upload_ms']:,.1f} | {r['upload_tier_kib']:,.1f} | "
                f"{r['load_tier_ms']:,.1f} | {r['refresh_ms']:,.1f} | "
                f"{r['lookup_p99_ms']:,.2f} / {r['lookup_max_ms']:,.1f} |"
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
                    ("saved upload", "saved_upload_ms"),
                    ("tier bytes per upload", "upload_tier_kib"),
                    ("refresh", "refresh_ms"),
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
    p.add_argument(
        "--uploads", type=int, default=600, help="uploads saved for the saved-upload figures (after side)"
    )
    p.add_argument("--before-uploads", type=int, default=20, help="the same for the before side")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--child-json", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    sizes = [int(x) for x in args.sizes.split(",")]
    if args.child_json:
        Path(args.child_json).write_text(json.dumps([measure(n, args.shards, args.uploads) for n in sizes]))
        return 0
    from bench._report import write_report

    described = {"after": f"this checkout (HEAD {head_commit()}, with its working tree)"}
    sides: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="seglog-before-") as tmp:
        if args.before:
            commit = export_seglog(args.before, Path(tmp))
            described["before"] = f"seglog of {args.before} ({commit})"
            sides["before"] = _child(
                Path(tmp),
                [n for n in sizes if n <= args.before_max_entries],
                args.shards,
                args.before_uploads,
            )
        sides["after"] = _child(None, sizes, args.shards, args.uploads)
    markdown = render(sides, described, args.shards)
    out = args.out or REPO / "bench" / "results" / f"manifest-{dt.date.today().isoformat()}.md"
    write_report(
        out, "Tier manifest scaling (bench/manifest.py)", markdown, {"sides": sides, "described": described}
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
