"""``make chaos``: the Jepsen-style fault test over many seeded schedules, with a report.

Runs ``tests/test_cluster_faults.py`` once per seed (``SEGLOG_FAULT_SEED``), each with a
nemesis of ``--seconds`` (``SEGLOG_FAULT_SECONDS``), every run a fresh 3-node cluster and
etcd, and writes a table of what each run injected and checked (``bench/results/chaos-DATE.md``;
a later run of the same day writes ``chaos-DATE-2.md`` and so on instead of replacing it).
Seeds start at the date times 100 unless ``--first-seed`` says otherwise, so a second run
of the day repeats the first one's schedules for as many seconds as it is given.
A failing run keeps its pytest output in the report; the exit status is non-zero if any failed.

    python -m tests.chaos --runs 20 --seconds 60 [--first-seed N]
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_LINE = re.compile(r"^CHAOS (.*)$", re.M)


def run_one(seed: int, seconds: float, basetemp: Path) -> tuple[bool, dict[str, str], str, float]:
    """One schedule: (passed, the CHAOS fields, pytest's output, wall seconds)."""
    env = dict(os.environ, SEGLOG_FAULT_SEED=str(seed), SEGLOG_FAULT_SECONDS=str(seconds))
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-s",
        "-p",
        "no:cacheprovider",
        f"--basetemp={basetemp}",
        "tests/test_cluster_faults.py",
    ]
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    output = done.stdout + done.stderr
    found = _LINE.search(output)
    fields = dict(kv.split("=", 1) for kv in found.group(1).split()) if found else {}
    return done.returncode == 0, fields, output, time.monotonic() - started


def _unused_report_path(directory: Path, stem: str) -> Path:
    """``stem.md``, or ``stem-2.md``, ``stem-3.md``... when an earlier run of the day wrote it."""
    path, n = directory / f"{stem}.md", 1
    while path.exists():
        n += 1
        path = directory / f"{stem}-{n}.md"
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--seconds", type=float, default=60.0, help="nemesis time per run")
    p.add_argument("--first-seed", type=int, default=int(datetime.date.today().strftime("%Y%m%d")) * 100)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    report = _unused_report_path(args.out, f"chaos-{datetime.date.today().isoformat()}")
    rows = []
    failures = []
    totals = {"kills": 0, "pauses": 0, "acked": 0}
    for k in range(args.runs):
        seed = args.first_seed + k
        workdir = Path(f"/tmp/seglog-chaos-{os.getpid()}-{k}")
        ok, fields, output, wall = run_one(seed, args.seconds, workdir)
        if ok:
            shutil.rmtree(workdir, ignore_errors=True)  # ~70 MB a run; a failed run's is kept
        for name in totals:
            totals[name] += int(fields.get(name, 0))
        status = "pass" if ok else "FAIL"
        print(f"seed {seed}: {status} {fields} ({wall:.0f} s)", flush=True)
        rows.append(
            f"| {seed} | {status} | {fields.get('kills', '?')} | {fields.get('pauses', '?')} | "
            f"{fields.get('acked', '?')} | {fields.get('refused', '?')} | {fields.get('unknown', '?')} | "
            f"{fields.get('unknown_visible', '?')} | {fields.get('retries', '?')} | "
            f"{fields.get('acked_after_retry', '?')} | {fields.get('final_log', '?')} | "
            f"{fields.get('tiered_objects', '?')} | {fields.get('restarts', '?')} | {wall:.0f} |"
        )
        if not ok:
            failures.append((seed, f"(data kept in {workdir})\n" + output[-6000:]))
    lines = [
        f"# seglog chaos run, {datetime.date.today().isoformat()}",
        "",
        f"`python -m tests.chaos --runs {args.runs} --seconds {args.seconds:g}`: each run is a fresh 3-node "
        "cluster (real etcd, real `seglog serve` processes) under a seeded nemesis (SIGKILL + restart of "
        "a node, mostly the leader; SIGSTOP of the leader past its lease), a client sending unique values "
        "with acks=all as an idempotent producer (a send whose outcome is unknown is retried with the same "
        "sequence number until acknowledged), then heal and Jepsen's queue checks (lost-write, duplicate, "
        "inconsistent-offsets, G1a, replica agreement). retries = attempts after an unknown outcome "
        "(timeouts, `NotEnoughReplicasAfterAppend`, a leader that resigned after writing); acked after "
        "retry = values acknowledged only by a retry (each stored once: the duplicate check); unknown = "
        "the last value when the run ended mid-retry; unknown visible = those that did land. Every node "
        "tiers into one shared directory every 300 ms and drops its local copies once committed; tier "
        "objects = committed objects at the end, checked to run from offset 0 without gap or overlap and to "
        "hold exactly the final log's records; restarts = nodes that came back behind their leader's start "
        "and restarted there (`Database.restart_at`).",
        "",
        f"Total: {args.runs} schedules, {totals['kills']} kills, {totals['pauses']} pauses, "
        f"{totals['acked']} acknowledged sends checked; {len(failures)} failed.",
        "",
        "| seed | result | kills | pauses | acked | refused | unknown | unknown visible | retries | "
        "acked after retry | final log | tier objects | restarts | wall s |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
    ]
    for seed, output in failures:
        lines += ["", f"## seed {seed}: failed", "", "```", output, "```"]
    report.write_text("\n".join(lines) + "\n")
    print(f"wrote {report}: {args.runs} runs, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
