"""Peer benchmark: the same durable write + verified read-back workload against several systems.

Usage::

    python -m bench.compare [--quick] [--systems raw,seglog,lmdb,lmdb-keyed,sqlite,redis,nats,kafka]
                            [--out bench/results] [--cache .cache] [--data-dir DIR]

Writes one Markdown table to ``<out>/<YYYY-MM-DD>.md`` (``quick-<date>.md`` with ``--quick``, or
``--out FILE.md``), the same results as JSON, and a PNG bar chart next to it.

What is timed, per system and value size:

* write: only the ``write_batch`` calls, one per producer batch of 1000 records, each returning
  once the batch is durable. The data set is generated once (fixed seed) and pre-encoded into the
  system's native input form (bytes, Record objects, Arrow tables, field maps...) before timing;
  client-library serialisation and the network are inside the timed region.
* read: only the time spent inside the peer's page iterator (fetch + decode into
  ``(topic, ts, value)`` Python tuples, or Arrow tables for seglog-arrow); verifying each page
  against the expected records happens between pages, outside the timed region.
* client CPU: ``getrusage(RUSAGE_SELF)`` deltas over exactly those timed calls (all threads of
  this process, so it includes embedded engines).
* server CPU: ``/proc/<pid>/stat`` utime+stime of the server process from the first write to the
  end of the read (includes its background work in between).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import math
import os
import platform
import random
import resource
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.peers import (
    IN_PROCESS_SYSTEMS,
    SYSTEMS,
    PeerContext,
    PeerUnavailable,
    Row,
    Workload,
    peer_factory,
)

if TYPE_CHECKING:
    from bench.peers import Page, Peer

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT_DIR = REPO_ROOT / "bench" / "results"
DEFAULT_CACHE_DIR = REPO_ROOT / ".cache"

BATCH_RECORDS = 1000
SITES = 100
DEVICES = 1000
DEFAULT_SEED = 20240501
BASE_TS_US = 1_700_000_000_000_000
TS_STEP_US = 1000
FULL_SIZES: tuple[tuple[int, int], ...] = ((100, 1_000_000), (1024, 200_000))
"""(value bytes S, records N) of a full run."""
QUICK_SIZES: tuple[tuple[int, int], ...] = ((100, 20_000), (1024, 5_000))
FULL_RECORD_CAPS: dict[str, int] = {"nats": 20_000}
"""Full-run record caps for systems that would take far too long at full N (see the table note)."""
DEFAULT_RUN_TIMEOUT_S = 1800.0
BYTES_PER_MB = 1_000_000
MS_PER_S = 1000.0
SYSTEM_ALIASES: dict[str, tuple[str, ...]] = {
    "all": SYSTEMS,
    "in-process": IN_PROCESS_SYSTEMS,
    "seglog": ("seglog", "seglog-arrow", "seglog-arrow-keyed"),
    "keyed": ("seglog-arrow-keyed", "lmdb-keyed"),
    "seglog-records": ("seglog",),
}
"""``--systems`` names that select several rows (``seglog`` selects both seglog rows)."""


@dataclass
class Result:
    """One table row: one system at one value size."""

    system: str
    value_bytes: int
    records: int
    status: str = "not run"
    verified: bool = False
    write_records_per_s: float = 0.0
    write_mb_per_s: float = 0.0
    ack_p50_ms: float = 0.0
    ack_p99_ms: float = 0.0
    read_records_per_s: float = 0.0
    read_mb_per_s: float = 0.0
    client_cpu_s: float = 0.0
    server_cpu_s: float | None = None
    write_s: float = 0.0
    read_s: float = 0.0
    durability: str = ""
    version: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the run completed and every record was read back intact."""
        return self.status == "ok"


def make_workload(records: int, value_bytes: int, seed: int) -> Workload:
    """Generate the records once (fixed seed): topics, increasing µs timestamps, random values.

    Args:
        records: N.
        value_bytes: S.
        seed: RNG seed; the same seed gives the same data.
    """
    rng = random.Random(seed * 1_000_003 + value_bytes)
    blob = rng.randbytes(records * value_bytes)
    values = [blob[i * value_bytes : (i + 1) * value_bytes] for i in range(records)]
    rand = rng.randrange
    topics = [f"sensors/{rand(SITES)}/{rand(DEVICES)}/temp" for _ in range(records)]
    ts = [BASE_TS_US + i * TS_STEP_US + rand(TS_STEP_US) for i in range(records)]
    return Workload(topics=topics, ts=ts, values=values, value_bytes=value_bytes)


def _client_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _percentile(sorted_values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(pct / 100.0 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def _page_rows(page: Page) -> list[Row]:
    """Rows of a page; Arrow tables are converted here, outside the timed region."""
    if isinstance(page, list):
        return page
    columns = [page.column(name).to_pylist() for name in ("topic", "ts", "value")]
    return list(zip(*columns, strict=True))


def _first_mismatch(rows: list[Row], expected: list[Row]) -> int:
    for i, (got, want) in enumerate(zip(rows, expected, strict=False)):
        if got != want:
            return i
    return min(len(rows), len(expected))


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ").replace("|", "/")
    return text[:300]


class _Deadline:
    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.at = time.monotonic() + timeout_s

    def check(self, phase: str) -> None:
        if time.monotonic() > self.at:
            raise TimeoutError(f"run exceeded {self.timeout_s:.0f} s during {phase}")


async def _timed_write(peer: Peer, workload: Workload, result: Result, deadline: _Deadline) -> None:
    """Pre-encode every batch (untimed), then time each durable ``write_batch``."""
    n = workload.n
    batches = [
        peer.encode(workload, start, min(start + BATCH_RECORDS, n)) for start in range(0, n, BATCH_RECORDS)
    ]
    latencies_s: list[float] = []
    cpu_s = 0.0
    for batch in batches:
        deadline.check("write")
        cpu0 = _client_cpu_s()
        t0 = time.perf_counter()
        await peer.write_batch(batch)
        latencies_s.append(time.perf_counter() - t0)
        cpu_s += _client_cpu_s() - cpu0
    del batches
    result.write_s = sum(latencies_s)
    result.client_cpu_s += cpu_s
    latencies_s.sort()
    result.ack_p50_ms = _percentile(latencies_s, 50) * MS_PER_S
    result.ack_p99_ms = _percentile(latencies_s, 99) * MS_PER_S
    result.write_records_per_s = n / result.write_s
    result.write_mb_per_s = workload.logical_bytes / BYTES_PER_MB / result.write_s


async def _timed_read(peer: Peer, workload: Workload, result: Result, deadline: _Deadline) -> None:
    """Time every page fetch; verify each page against the expected rows between fetches."""
    expected = workload.rows()
    pages: AsyncIterator[Page] = peer.read_all()
    pos = 0
    mismatch: str | None = None
    read_s = cpu_s = 0.0
    while True:
        deadline.check("read")
        cpu0 = _client_cpu_s()
        t0 = time.perf_counter()
        try:
            page = await anext(pages)
        except StopAsyncIteration:
            read_s += time.perf_counter() - t0
            cpu_s += _client_cpu_s() - cpu0
            break
        read_s += time.perf_counter() - t0
        cpu_s += _client_cpu_s() - cpu0
        # Untimed: verification.
        rows = _page_rows(page)
        want = expected[pos : pos + len(rows)]
        if mismatch is None and rows != want:
            bad = pos + _first_mismatch(rows, want)
            mismatch = (
                f"read back {pos + len(rows)} > {len(expected)} records"
                if bad >= len(expected)
                else f"record {bad} differs after read-back"
            )
        pos += len(rows)
    with contextlib.suppress(Exception):
        await pages.aclose()  # type: ignore[attr-defined]
    result.read_s = read_s
    result.client_cpu_s += cpu_s
    if read_s > 0 and expected:
        result.read_records_per_s = pos / read_s
        result.read_mb_per_s = workload.logical_bytes * pos / len(expected) / BYTES_PER_MB / read_s
    if mismatch is None and pos != len(expected):
        mismatch = f"read back {pos} of {len(expected)} records"
    if mismatch is not None:
        raise RuntimeError(f"verification failed: {mismatch}")
    result.verified = True


async def run_system(
    system: str, workload: Workload, cache_dir: Path, data_root: Path, timeout_s: float
) -> Result:
    """Run setup, timed write, timed + verified read and teardown of one system.

    Never raises: failures become the row's status.
    """
    result = Result(system=system, value_bytes=workload.value_bytes, records=workload.n)
    work_dir = Path(tempfile.mkdtemp(prefix=f"{system}-{workload.value_bytes}-", dir=data_root))
    ctx = PeerContext(
        work_dir=work_dir,
        cache_dir=cache_dir,
        expected_records=workload.n,
        value_bytes=workload.value_bytes,
    )
    deadline = _Deadline(timeout_s)
    phase = "setup"
    peer: Peer | None = None
    try:
        peer = peer_factory(system)(ctx)
        result.durability = peer.durability
        await asyncio.wait_for(peer.setup(), timeout_s)
        result.version = peer.version
        server_cpu0 = _server_cpu_s(peer)
        phase = "write"
        remaining_s = max(1.0, deadline.at - time.monotonic())
        await asyncio.wait_for(_timed_write(peer, workload, result, deadline), remaining_s)
        phase = "read"
        remaining_s = max(1.0, deadline.at - time.monotonic())
        await asyncio.wait_for(_timed_read(peer, workload, result, deadline), remaining_s)
        server_cpu1 = _server_cpu_s(peer)
        if server_cpu0 is not None and server_cpu1 is not None:
            result.server_cpu_s = server_cpu1 - server_cpu0
        result.status = "ok"
    except PeerUnavailable as exc:
        result.status = f"unavailable: {_describe(exc)}"
    except Exception as exc:
        result.status = f"failed in {phase}: {_describe(exc)}"
        result.notes.append(traceback.format_exc(limit=6))
    finally:
        if peer is not None:
            try:
                await asyncio.wait_for(peer.teardown(), 120)
            except Exception as exc:
                result.notes.append(f"teardown: {_describe(exc)}")
        shutil.rmtree(work_dir, ignore_errors=True)
    return result


def _server_cpu_s(peer: Peer) -> float | None:
    from bench.peers._server import process_cpu_s

    return None if peer.server_pid is None else process_cpu_s(peer.server_pid)


# ---------------------------------------------------------------------------------------------
# Report


def _machine() -> dict[str, str]:
    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    return {
        "cpu": f"{cpu} x {os.cpu_count()}",
        "memory": f"{mem_gib:.0f} GiB",
        "kernel": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
    }


def _filesystem(path: Path) -> str:
    """Filesystem type and device holding ``path`` (longest mount-point prefix)."""
    best = ("", "?", "?")
    real = str(path.resolve())
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            device, mount, fstype = line.split()[:3]
            inside = real == mount or real.startswith(mount.rstrip("/") + "/")
            if inside and len(mount) > len(best[0]):
                best = (mount, fstype, device)
    return f"{best[1]} on {best[2]}"


def _fmt_int(value: float) -> str:
    return f"{value:,.0f}"


def _fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


TABLE_HEADER = (
    "| system | S (B) | N | status | verified | write rec/s | write MB/s | ack p50 ms | ack p99 ms "
    "| read rec/s | read MB/s | client CPU s | server CPU s | durability | version |"
)


def render_markdown(results: list[Result], meta: dict[str, Any]) -> str:
    """The report: context, one table, notes."""
    lines = [
        f"# seglog peer benchmark, {meta['date']} ({meta['mode']})",
        "",
        f"Machine: {meta['machine']['cpu']}, {meta['machine']['memory']}, "
        f"{meta['machine']['kernel']}, Python {meta['machine']['python']}; "
        f"data dir filesystem: {meta['filesystem']}; {meta['load']}.",
        f"Workload: one shard/partition; records of topic `sensors/<0..{SITES - 1}>/"
        f"<0..{DEVICES - 1}>/temp` + int64 µs ts + S random bytes (seed {meta['seed']}); "
        f"producer batches of {BATCH_RECORDS}, each acknowledged only when durable; "
        "then everything read back in order and every record verified.",
        "",
        TABLE_HEADER,
        "|" + "---|" * TABLE_HEADER.count(" | ") + "---|",
    ]
    for r in results:
        good = r.ok
        lines.append(
            "| "
            + " | ".join(
                [
                    r.system,
                    str(r.value_bytes),
                    _fmt_int(r.records),
                    r.status,
                    "yes" if r.verified else "no",
                    _fmt_int(r.write_records_per_s) if good else "-",
                    _fmt(r.write_mb_per_s, 1) if good else "-",
                    _fmt(r.ack_p50_ms, 2) if good else "-",
                    _fmt(r.ack_p99_ms, 2) if good else "-",
                    _fmt_int(r.read_records_per_s) if good else "-",
                    _fmt(r.read_mb_per_s, 1) if good else "-",
                    _fmt(r.client_cpu_s, 2) if good else "-",
                    _fmt(r.server_cpu_s, 2) if good else "-",
                    r.durability or "-",
                    r.version or "-",
                ]
            )
            + " |"
        )
    lines += ["", "Notes:", ""]
    lines += [f"- {note}" for note in meta["notes"]]
    return "\n".join(lines) + "\n"


def _short(value: float) -> str:
    for threshold, suffix in ((1e6, "M"), (1e3, "k")):
        if value >= threshold:
            return f"{value / threshold:.3g}{suffix}"
    return f"{value:.3g}"


def draw_chart(results: list[Result], png_path: Path, title: str) -> None:
    """Grouped bars of write and read records/s per system, one panel per value size, log y."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r.value_bytes for r in results})
    systems = list(dict.fromkeys(r.system for r in results))
    fig, axes = plt.subplots(
        1,
        len(sizes),
        figsize=(1.2 + 0.9 * len(systems) * len(sizes) + 1.5 * len(sizes), 5.2),
        squeeze=False,
        sharey=True,
    )
    rates = [v for r in results if r.ok for v in (r.write_records_per_s, r.read_records_per_s)]
    bottom = max(1.0, min(rates, default=1.0) / 3)
    top = max(rates, default=10.0) * 4
    bar_width = 0.4
    series = (
        ("write (durable)", "write_records_per_s", "#d95f02", -1),
        ("read + decode", "read_records_per_s", "#1b9e77", 1),
    )
    for ax, size in zip(axes[0], sizes, strict=True):
        rows = [r for r in results if r.value_bytes == size]
        xs = list(range(len(rows)))
        for label, attr, color, side in series:
            values = [getattr(r, attr) if r.ok else 0.0 for r in rows]
            offsets = [x + side * bar_width / 2 for x in xs]
            bars = ax.bar(offsets, values, bar_width, label=label, color=color)
            ax.bar_label(bars, [_short(v) if v > 0 else "" for v in values], fontsize=7, padding=1)
        for x, r in zip(xs, rows, strict=True):
            if not r.ok:
                ax.text(
                    x,
                    bottom * 1.5,
                    "failed" if r.status.startswith("failed") else "n/a",
                    ha="center",
                    va="bottom",
                    color="red",
                    fontsize=8,
                    rotation=90,
                )
        ax.set_yscale("log")
        ax.set_ylim(bottom, top)
        n_max = max(r.records for r in rows)
        ticks = [r.system if r.records == n_max else f"{r.system}\n(N={r.records:,})" for r in rows]
        ax.set_xticks(xs, ticks, rotation=30, ha="right")
        ax.set_title(f"S = {size} B, N = {n_max:,}")
        ax.grid(axis="y", which="major", alpha=0.4)
    axes[0][0].set_ylabel("records/s (log scale)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper right", ncols=2, fontsize=9)
    fig.suptitle(title, x=0.02, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(png_path, dpi=110)
    plt.close(fig)


def output_paths(out: Path | None, quick: bool, date: str) -> tuple[Path, Path, Path]:
    """(markdown, png, json) paths for ``--out`` (a directory, or a ``.md`` file)."""
    if out is not None and out.suffix == ".md":
        md_path = out
    else:
        md_path = (out or DEFAULT_OUT_DIR) / (f"quick-{date}.md" if quick else f"{date}.md")
    md_path.parent.mkdir(parents=True, exist_ok=True)
    return md_path, md_path.with_suffix(".png"), md_path.with_suffix(".json")


def parse_systems(spec: str) -> list[str]:
    """Expand a comma list of systems and aliases into rows in table order.

    Raises:
        SystemExit: An unknown name.
    """
    chosen: set[str] = set()
    for name in filter(None, (part.strip() for part in spec.split(","))):
        if name in SYSTEM_ALIASES:
            chosen.update(SYSTEM_ALIASES[name])
        elif name in SYSTEMS:
            chosen.add(name)
        else:
            known = ", ".join([*SYSTEMS, *SYSTEM_ALIASES])
            raise SystemExit(f"unknown system {name!r}; known: {known}")
    return [s for s in SYSTEMS if s in chosen]


def _notes(
    args: argparse.Namespace, sizes: Sequence[tuple[int, int]], caps: dict[str, int], results: list[Result]
) -> list[str]:
    notes = [
        "Timed write = only the per-batch durable write calls; data generated once and "
        "pre-encoded per system before timing (client-library serialisation and the network "
        "are timed). Ack latency = one batch of 1000 records from call to durable ack.",
        "Timed read = time inside each system's page iterator (fetch + decode to (topic, ts, "
        "value) Python objects; the seglog-arrow rows stay columnar as Arrow tables); pages of "
        "10,000 records; verification of every record runs between pages, untimed. Reads "
        "follow the writes, so they are served from the OS page cache.",
        "MB/s = record content (topic + 8-byte ts + value) / s, MB = 10^6 bytes. "
        "Client CPU = getrusage(self) over the timed calls; server CPU = /proc/<pid>/stat "
        "utime+stime of the server process from first write to end of read (in-process: -).",
        "Keyed rows (seglog-arrow-keyed, lmdb-keyed): a key on every record, its device "
        f"(`<site>/<device>` of the topic, up to {SITES * DEVICES:,} distinct); seglog writes its key "
        "index with each batch, LMDB a DUPSORT key -> sequence database in the same synced "
        "transaction as the records. Their read-back ends with one key lookup (timed) that must "
        "return exactly the records written with that key.",
        "Every server runs on 127.0.0.1 with a fresh temp data dir, started per row and "
        "stopped by PID afterwards. One run per row without warm-up (Kafka's JVM starts "
        "cold); fsync-bound rates vary between runs on a shared VM, so compare rows within "
        "one report.",
    ]
    for system, cap in caps.items():
        capped = [n for _, n in sizes if n > cap]
        if capped and any(r.system == system for r in results):
            notes.append(
                f"{system}: N capped at {cap:,} records per size in full runs (fsync per "
                "message would take too long at full N); rates are per second, so still comparable."
            )
    if args.records:
        notes.append(f"N overridden to {args.records:,} for every size (--records).")
    return notes


async def run(args: argparse.Namespace) -> tuple[list[Result], Path]:
    """Run every selected system at every size; write the Markdown, JSON and PNG."""
    systems = parse_systems(args.systems)
    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    if args.records:
        sizes = tuple((s, args.records) for s, _ in sizes)
    caps = {} if args.quick else FULL_RECORD_CAPS
    date = dt.date.today().isoformat()
    md_path, png_path, json_path = output_paths(args.out, args.quick, date)
    data_root = Path(tempfile.mkdtemp(prefix="seglog-bench-", dir=args.data_dir))
    load_start = os.getloadavg()[0]
    results: list[Result] = []
    try:
        for value_bytes, records in sizes:
            print(f"generating {records:,} records of {value_bytes} B ...", file=sys.stderr)
            full = make_workload(records, value_bytes, args.seed)
            for system in systems:
                cap = caps.get(system, records)
                workload = (
                    full
                    if cap >= records
                    else Workload(full.topics[:cap], full.ts[:cap], full.values[:cap], value_bytes)
                )
                print(
                    f"  {system:<13} S={value_bytes:<5} N={workload.n:<9,}",
                    end=" ",
                    file=sys.stderr,
                    flush=True,
                )
                result = await run_system(system, workload, args.cache, data_root, args.timeout)
                results.append(result)
                print(
                    f"{result.status[:120]}  write {result.write_records_per_s:,.0f}/s "
                    f"read {result.read_records_per_s:,.0f}/s",
                    file=sys.stderr,
                    flush=True,
                )
                for note in result.notes:
                    print(note, file=sys.stderr)
    finally:
        shutil.rmtree(data_root, ignore_errors=True)
    meta: dict[str, Any] = {
        "date": date,
        "mode": "quick" if args.quick else "full",
        "seed": args.seed,
        "machine": _machine(),
        "load": f"1-min load average {load_start:.1f} at start, {os.getloadavg()[0]:.1f} at end",
        "filesystem": _filesystem(args.data_dir or Path(tempfile.gettempdir())),
        "notes": _notes(args, sizes, caps, results),
    }
    md_path.write_text(render_markdown(results, meta))
    json_path.write_text(json.dumps({"meta": meta, "results": [asdict(r) for r in results]}, indent=1) + "\n")
    draw_chart(results, png_path, f"seglog peer benchmark {date} ({meta['mode']})")
    return results, md_path


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.compare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--quick", action="store_true", help=f"small N: {', '.join(f'S={s}: {n:,}' for s, n in QUICK_SIZES)}"
    )
    parser.add_argument(
        "--systems",
        default="all",
        help=f"comma list of {', '.join(SYSTEMS)} or aliases {', '.join(SYSTEM_ALIASES)} (default: all)",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="output directory, or a .md file path (default: bench/results)"
    )
    parser.add_argument(
        "--cache",
        type=Path,
        default=DEFAULT_CACHE_DIR,
        help="cache with bin/nats-server and kafka/libs (default: .cache)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="parent of the temp data dirs (default: the system temp dir)",
    )
    parser.add_argument("--records", type=int, default=None, help="override N for every size")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_RUN_TIMEOUT_S,
        help="hard limit per system and size in seconds",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: run, print the table, return 0 even when some systems failed."""
    args = build_parser().parse_args(argv)
    if args.data_dir is not None:
        args.data_dir.mkdir(parents=True, exist_ok=True)
    _, md_path = asyncio.run(run(args))
    print(md_path.read_text())
    print(f"wrote {md_path}, {md_path.with_suffix('.png')}, {md_path.with_suffix('.json')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
