"""What this machine charges for two things every benchmark here does: new page-cache pages and
thread wake-ups.

    python -m bench.machine [--dir DIR] [--cache-mib N] [--file-mib N] [--runs N] [--out FILE.md]

The benchmark machines are Firecracker microVMs (nested) whose kernel hands freed memory back
to the host (``page_reporting``, see ``/proc/cmdline`` and ``dmesg``). Touching such memory
again costs a host fault per page, so the page cache fills at very different rates depending
on where its pages come from. And an idle vCPU halts (``haltpoll.guest_halt_poll_ns=0``), so
waking a thread that sleeps costs a VM exit. Both show in every write-heavy or hand-off-heavy
figure of ``bench/``, and neither is seglog's doing; this script measures them so the reports
can say how much of a figure they are:

* ``page cache``: MB/s of 1 MiB ``pwrite``s into a new file of ``--file-mib`` (no sync), three times with the
  pages of the previous file just freed (recycled pages), then three times after
  ``--cache-mib`` of other files were written and stay cached (the recycled pages used up:
  fresh guest memory).
* ``wake``: an asyncio loop hands an item to a thread through a ``queue.SimpleQueue`` and
  awaits the future the thread resolves with ``call_soon_threadsafe`` (what seglog's I/O pool
  does for every append): the round trip, and the part from the thread's call to the loop
  running the awaiting task (the loop's wake-up), medians over ``--runs`` hand-offs.

The report goes to ``bench/results/machine-<date>.md`` (and ``.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import queue
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench._report import write_report

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "bench" / "results"
CHUNK_BYTES = 1 << 20


def _write_file(path: Path, mib: int, chunk: bytes) -> float:
    """MB/s of ``mib`` 1 MiB pwrites into a new file at ``path`` (left in the page cache)."""
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    try:
        t0 = time.perf_counter()
        for i in range(mib):
            os.pwrite(fd, chunk, i * CHUNK_BYTES)
        seconds = time.perf_counter() - t0
    finally:
        os.close(fd)
    return mib * CHUNK_BYTES / seconds / 1e6


def page_cache(work: Path, cache_mib: int, file_mib: int) -> dict[str, list[float]]:
    """Page-cache write rates (files of ``file_mib``) with recycled pages, then with fresh
    guest memory (after ``cache_mib`` of other files stayed cached)."""
    chunk = os.urandom(CHUNK_BYTES)
    recycled = []
    for i in range(3):
        path = work / f"recycled-{i}"
        recycled.append(_write_file(path, file_mib, chunk))
        path.unlink()  # its pages are free again for the next file
    kept = [work / f"kept-{i}" for i in range(max(1, cache_mib // file_mib))]
    for path in kept:
        _write_file(path, file_mib, chunk)
    os.sync()
    fresh = []
    for i in range(3):
        path = work / f"fresh-{i}"
        fresh.append(_write_file(path, file_mib, chunk))
    for path in [*kept, *(work / f"fresh-{i}" for i in range(3))]:
        path.unlink()
    return {"recycled_mb_s": recycled, "fresh_mb_s": fresh}


def _wake_worker(items: queue.SimpleQueue[Any]) -> None:
    while (item := items.get()) is not None:
        loop, fut = item
        loop.call_soon_threadsafe(fut.set_result, time.perf_counter_ns())


async def wake(runs: int) -> dict[str, float]:
    """Median µs of a loop -> thread -> loop hand-off and of the loop's wake-up alone."""
    items: queue.SimpleQueue[Any] = queue.SimpleQueue()
    thread = threading.Thread(target=_wake_worker, args=(items,), name="bench-wake", daemon=True)
    thread.start()
    loop = asyncio.get_running_loop()
    round_trip, loop_wake = [], []
    try:
        for _ in range(runs):
            fut: asyncio.Future[int] = loop.create_future()
            t0 = time.perf_counter_ns()
            items.put((loop, fut))
            called = await fut
            t1 = time.perf_counter_ns()
            round_trip.append((t1 - t0) / 1e3)
            loop_wake.append((t1 - called) / 1e3)
    finally:
        items.put(None)
        thread.join(5)
    return {"round_trip_us": statistics.median(round_trip), "loop_wake_us": statistics.median(loop_wake)}


def _cmdline_flags() -> str:
    """The kernel command line's memory and idle flags (empty where not Linux)."""
    try:
        words = Path("/proc/cmdline").read_text().split()
    except OSError:
        return ""
    wanted = ("page_reporting", "haltpoll", "cpuidle", "nested")
    return " ".join(w for w in words if w.startswith(wanted))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", type=Path, default=None, help="where the files go (default: a temp dir)")
    p.add_argument(
        "--cache-mib", type=int, default=3072, help="MiB of files kept cached before the fresh writes"
    )
    p.add_argument("--file-mib", type=int, default=256, help="MiB per written file")
    p.add_argument("--runs", type=int, default=3000, help="hand-offs for the wake figures")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="seglog-machine-", dir=args.dir) as tmp:
        pages = page_cache(Path(tmp), args.cache_mib, args.file_mib)
    wakes = asyncio.run(wake(args.runs))
    recycled = statistics.median(pages["recycled_mb_s"])
    fresh = statistics.median(pages["fresh_mb_s"])
    flags = _cmdline_flags() or "(none of page_reporting/haltpoll/cpuidle/nested)"
    md = "\n".join(
        [
            f"Kernel flags: `{flags}`; 1-min load average {os.getloadavg()[0]:.1f} at the end.",
            "",
            "| measure | figure |",
            "|---|---:|",
            f"| page cache, recycled pages: MB/s of 1 MiB pwrites into a new file (median of 3) | {recycled:,.0f} |",
            f"| page cache, fresh guest memory (after {args.cache_mib:,} MiB stayed cached) | {fresh:,.0f} |",
            f"| fresh ÷ recycled | {fresh / recycled:.2f} |",
            f"| loop -> thread -> loop hand-off, median µs ({args.runs:,} runs) | {wakes['round_trip_us']:.1f} |",
            f"| of which the loop's wake-up (thread's call -> task runs), median µs | {wakes['loop_wake_us']:.1f} |",
            "",
        ]
    )
    out = args.out or RESULTS_DIR / f"machine-{dt.date.today().isoformat()}.md"
    data = {
        "page_cache": pages,
        "wake": wakes,
        "cache_mib": args.cache_mib,
        "file_mib": args.file_mib,
        "kernel_flags": flags,
    }
    write_report(out, "This machine: new page-cache pages and thread wake-ups", md, data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
