"""The core benchmark for an earlier commit and for this checkout, interleaved in one run.

    python -m bench.before_after --before REF [--runs 2] [--out FILE.md] [bench.core options]

Both sides run this checkout's ``bench/core.py`` (same shapes, same raw baselines); only the
``seglog`` package differs: the earlier one is taken from a temporary ``git worktree`` of
``REF``. Runs alternate (before, after, before, after, ...) so that a noisy neighbour hurts
both sides alike. Each append row is compared as its same-run ratio to the raw loop (median
over runs); reads, lookups and engine figures, which have no raw baseline, as the median of
their absolute figures.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "bench" / "results"

# Runs bench.core with ``seglog`` imported from the given directory (first on sys.path).
_RUNNER = (
    "import sys; sys.path.insert(0, sys.argv[1]); sys.path.insert(1, sys.argv[2]); "
    "import seglog, bench.core as c; "
    "assert seglog.__file__.startswith(sys.argv[1]), seglog.__file__; "
    "sys.exit(c.main(sys.argv[3:]))"
)


def _run_core(package_root: Path, out: Path, core_args: list[str]) -> dict[str, Any]:
    cmd = [sys.executable, "-c", _RUNNER, str(package_root), str(REPO), "--out", str(out), *core_args]
    subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    data: dict[str, Any] = json.loads(out.with_suffix(".json").read_text())
    return data


def _figures(data: dict[str, Any]) -> dict[str, float]:
    """Every comparable figure of one bench.core run, by a stable name."""
    out: dict[str, float] = {}
    for group in ("append", "scaling"):
        for row in data[group]:
            if row.get("ratio_vs_raw") is not None:
                out[f"{group} {row['value_bytes']} B {row['shape']} {row['system']} (÷ raw)"] = row[
                    "ratio_vs_raw"
                ]
    for size, reads in data["reads"].items():
        for name, value in reads.items():
            out[f"reads {size} B {name} (records/s)"] = value
    for name, value in data["lookups"].items():
        out[f"lookups {name}"] = value
    for eng in data["engines"]:
        for name in ("append", "read_arrow"):
            out[f"engine {eng['engine']} {name} (records/s)"] = eng[name]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True, help="git ref of the earlier commit")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--out", type=Path, default=None, help="default: bench/results/before-after-<date>.md")
    args, core_args = p.parse_known_args(argv)
    ref = subprocess.run(
        ["git", "rev-parse", "--short", args.before], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.strip()
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="seglog-before-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(tree), ref], cwd=REPO, check=True, capture_output=True
        )
        try:
            runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
            for k in range(args.runs):
                for side, root in (("before", tree), ("after", REPO)):
                    print(f"run {k + 1}/{args.runs}: {side}", file=sys.stderr, flush=True)
                    data = _run_core(root, Path(tmp) / f"{side}-{k}.md", core_args)
                    runs[side].append(_figures(data))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, check=False)
    names = [n for n in runs["after"][0] if all(n in r for r in runs["before"] + runs["after"])]
    lines = [
        f"# Core benchmark, {ref} (before) and {head} (after), {args.runs} interleaved runs each",
        "",
        f"`python -m bench.before_after --before {args.before} --runs {args.runs} {' '.join(core_args)}`".rstrip(),
        "",
        "Append rows: median same-run ratio to the raw write+fdatasync loop; other rows: median figure.",
        "Lookups are latencies (lower is better).",
        "",
        "| figure | before | after | change |",
        "|---|---:|---:|---:|",
    ]
    for name in names:
        b = statistics.median(r[name] for r in runs["before"])
        a = statistics.median(r[name] for r in runs["after"])
        change = (a / b - 1) * 100 if b else float("nan")
        lines.append(f"| {name} | {b:,.3f} | {a:,.3f} | {change:+.1f} % |")
    text = "\n".join(lines) + "\n"
    print(text)
    out = args.out or RESULTS_DIR / f"before-after-{dt.date.today().isoformat()}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
