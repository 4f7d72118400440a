"""The order of syscalls, read from a real ``strace`` of a writer process.

These prove the durability promises directly: they fail if the fsync is removed, moved
after the acknowledgement, or skipped for a quiet shard.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
from pathlib import Path

import seglog
from tests.faults import Syscall, strace_command, strace_events

ROOT = Path(__file__).resolve().parent.parent
_WRITES = ("pwritev", "pwritev2", "pwrite64")


def _trace(tmp_path: Path, mode: str, fsync: str = "always", extra: tuple[str, ...] = ()) -> list[Syscall]:
    log = tmp_path / "strace.log"
    cmd = [
        *strace_command(),
        "-o",
        str(log),
        "-e",
        "trace=pwritev,pwritev2,pwrite64,fdatasync,fsync,write",
        *extra,
        sys.executable,
        "-m",
        "tests.trace_child",
        str(tmp_path / "data"),
        mode,
        fsync,
    ]
    subprocess.run(cmd, cwd=ROOT, check=True, timeout=120, stdout=subprocess.DEVNULL)
    return strace_events(log)


def _is_segment(call: Syscall) -> bool:
    return ".log>" in call.args.split(",", 1)[0]


def _is_ack(call: Syscall) -> bool:
    return call.name == "write" and call.args.startswith("1<") and '"ack' in call.args


def test_every_ack_follows_the_fdatasync_of_its_bytes(tmp_path: Path) -> None:
    events = _trace(tmp_path, "acks")
    acks = [i for i, e in enumerate(events) if _is_ack(e)]
    assert len(acks) == 20
    prev = 0
    for i in acks:
        writes = [e for e in events[prev:i] if e.name in _WRITES and _is_segment(e)]
        assert writes, "each acknowledged append writes its frames first"
        last_write = max(events.index(w) for w in writes)
        synced = [
            e
            for e in events[last_write:i]
            if e.name in ("fdatasync", "fsync") and _is_segment(e) and e.result.startswith("0")
        ]
        assert synced, (
            f"acknowledgement {events[i].args[:40]!r} was not preceded by an fdatasync of its segment"
        )
        prev = i


def test_fsync_never_is_caught_by_the_ordering_check(tmp_path: Path) -> None:
    """The check above can fail: under fsync="never" no fdatasync precedes the acks."""
    events = _trace(tmp_path, "acks", fsync="never")
    acks = [i for i, e in enumerate(events) if _is_ack(e)]
    assert acks
    first = acks[0]
    assert not [e for e in events[:first] if e.name == "fdatasync" and _is_segment(e)]


def test_interval_policy_syncs_a_quiet_shard_on_a_busy_worker(tmp_path: Path) -> None:
    interval_s = 0.2
    events = _trace(tmp_path, "interval", fsync="interval")
    ack = next(e for e in events if _is_ack(e) and "quiet" in e.args)
    quiet_fd = next(
        e.args.split(",", 1)[0]
        for e in events
        if e.name in _WRITES and "shard-0001" in e.args.split(",", 1)[0] and ".log>" in e.args
    )
    last_write = max(
        e.end_s for e in events if e.name in _WRITES and e.args.startswith(quiet_fd) and e.end_s <= ack.end_s
    )
    # Its bytes are durable once its segment, or the worker's journal written after it, is synced.
    journal_writes = [
        e
        for e in events
        if e.name in _WRITES and ".journal>" in e.args.split(",", 1)[0] and last_write <= e.end_s <= ack.end_s
    ]
    durable_fds = {quiet_fd} | {e.args.split(",", 1)[0] for e in journal_writes}
    if journal_writes:
        last_write = max(e.end_s for e in journal_writes)
    syncs = [
        e
        for e in events
        if e.name in ("fdatasync", "fsync")
        and e.args.split(",", 1)[0] in durable_fds
        and e.end_s >= last_write
    ]
    assert syncs, "the quiet shard was never synced while the worker was busy"
    waited = syncs[0].end_s - last_write
    sync_time = syncs[0].end_s - syncs[0].start_s
    # The bound, plus one fsync's time, plus slack for strace's own overhead.
    assert waited <= interval_s + sync_time + 0.15, (
        f"unsynced for {waited:.3f}s with a {interval_s}s interval"
    )


def test_follower_never_sees_frames_before_they_are_durable(run, tmp_path: Path) -> None:
    """Delay every fdatasync by 1.5 s: the frames of B sit written but unsynced meanwhile.

    strace writes its log into a FIFO, so the test learns from a blocking read, not a timer,
    the moment the writer's ``pwritev`` of B has returned.
    """
    data = tmp_path / "data"
    fifo = tmp_path / "strace.fifo"
    os.mkfifo(fifo)
    cmd = [
        *strace_command(),
        "-o",
        str(fifo),
        "-e",
        f"trace=fdatasync,{','.join(_WRITES)}",
        "-e",
        "inject=fdatasync:delay_enter=1500000",
        sys.executable,
        "-m",
        "tests.trace_child",
        str(data),
        "slow-sync",
        "always",
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        with open(fifo) as trace:  # blocks until strace opens its end
            assert proc.stdout.readline() == "ack A\n"
            assert proc.stdout.readline() == "start B\n"
            segment_writes = 0
            for line in trace:  # A's frames, then B's: the second write to the segment
                if any(f" {w}(" in line for w in _WRITES) and ".log>" in line and " = " in line:
                    segment_writes += 1
                    if segment_writes == 2:
                        break
            assert segment_writes == 2, "B was never written"

            async def read() -> int:
                async with seglog.follow(data, "t", 0, offset=0) as f:
                    table = await f.read_available()
                    return table.num_rows

            seen = run(read())
            assert not _acked_b(proc), "B was acknowledged before the follower read: the test proves nothing"
            assert seen == 100, f"the follower saw {seen - 100} records that were written but not yet durable"
            for _ in trace:  # drain, so strace never blocks on a full FIFO
                pass
        assert proc.stdout.readline() == "ack B\n"
        assert run(read()) == 200
    finally:
        proc.kill()
        proc.wait(timeout=30)


def _acked_b(proc: subprocess.Popen[str]) -> bool:
    """Whether the child already printed B's acknowledgement (or exited)."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 0)
    return bool(ready) or proc.poll() is not None


def test_new_directories_are_fsynced(tmp_path: Path) -> None:
    log = tmp_path / "strace.log"
    data = tmp_path / "data"
    cmd = [
        *strace_command(),
        "-o",
        str(log),
        "-e",
        "trace=fsync,fdatasync",
        sys.executable,
        "-m",
        "tests.trace_child",
        str(data),
        "layout",
        "always",
    ]
    subprocess.run(cmd, cwd=ROOT, check=True, timeout=120, stdout=subprocess.DEVNULL)
    synced = {
        e.args.split("<", 1)[1].rstrip(">") for e in strace_events(log) if e.name == "fsync" and "<" in e.args
    }
    db = data / "dbs" / "t"
    for d in (data, data / "dbs", db, db / "shard-0000", db / "shard-0001", db / "index", db / "groups"):
        assert str(d) in synced, f"directory {d} was never fsynced"
