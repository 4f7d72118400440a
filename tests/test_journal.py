"""The per-worker journal: one sync per drain across shards, replay after SIGKILL and power loss."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import seglog
from seglog.segment import open_shard_log
from seglog.segment.journal import ENTRY_ROWS, Journal
from tests.crash_child import key_for, value_for
from tests.faults import ext4_fs, shutdown_fs, strace_command
from tests.helpers import read_all

ROOT = Path(__file__).resolve().parent.parent


def _kill_after(data: Path, mode: str, acks: int) -> list[tuple[int, int, int, int]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.crash_child", str(data), mode],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        for line in proc.stdout:  # the child's acknowledgements: an event, not a timer
            lines.append(line)
            if len(lines) >= acks:
                break
        os.kill(proc.pid, signal.SIGKILL)
        lines.extend(proc.stdout.read().splitlines(keepends=True))
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert len(lines) >= acks, "child died before producing enough acknowledgements"
    return [tuple(map(int, ln.split())) for ln in lines if ln.endswith("\n")]  # type: ignore[misc]


@contextlib.contextmanager
def _counting_fdatasync() -> Iterator[list[int]]:
    """Count ``os.fdatasync`` calls (any thread) while entered: ``[count]``."""
    calls = [0]
    real = os.fdatasync

    def counted(fd: int) -> None:
        calls[0] += 1
        real(fd)

    os.fdatasync = counted  # type: ignore[assignment]
    try:
        yield calls
    finally:
        os.fdatasync = real  # type: ignore[assignment]


def _segment_ends(db_dir: Path, shards: int) -> list[int]:
    """Each shard's log end as its segment files say, without the journal."""
    ends = []
    for n in range(shards):
        log_, _ = open_shard_log(
            db_dir / f"shard-{n:04d}", segment_bytes=1 << 30, segment_ms=1 << 40, clock_ms=lambda: 0
        )
        ends.append(log_.next_offset)
        log_.close()
    return ends


async def _verify(data: Path, acked: list[tuple[int, int, int, int]]) -> None:
    async with seglog.open(data) as store:
        db = await store.open_db("crash")
        by_shard = {s: await read_all(db, s) for s in range(db.shards)}
        for _s, recs in by_shard.items():
            assert [r.offset for r in recs] == list(range(len(recs))), "offsets must be dense"
        for shard, offset, p, seq in acked:
            rec = by_shard[shard][offset]
            assert (rec.value, rec.key) == (value_for(p, seq), key_for(p, seq, True)), (shard, offset)
        before = db.end_offset(5)
        res = await db.append([seglog.Record(topic="after", value=b"x")], shard=5)
        assert res[0].offset == before


def test_keyed_appends_survive_sigkill_through_journal_replay(run, data_dir: Path) -> None:
    """Rows of many-shard appends live only in memory and the journal until flushed: replay restores them."""
    acked = _kill_after(data_dir, "keyed", 4000)
    db_dir = data_dir / "dbs" / "crash"
    assert any(e.kind == ENTRY_ROWS for e in _entries(db_dir)), "the keyed load never used the journal"
    ends = _segment_ends(db_dir, 16)
    top: dict[int, int] = {}
    for shard, offset, _p, _seq in acked:
        top[shard] = max(top.get(shard, -1), offset)
    assert any(ends[s] <= top[s] for s in top), "every acknowledged row was in a segment: replay untested"
    run(_verify(data_dir, acked))


def _entries(db_dir: Path) -> list:  # type: ignore[type-arg]
    out = []
    for path in sorted((db_dir / "journal").glob("*.journal")):
        j = Journal(path)
        out.extend(j.entries())
        j.close()
    return out


def test_replay_killed_at_successive_writes_then_reopened_loses_nothing(run, data_dir: Path) -> None:
    """SIGKILL inside replay and the recycling after it: the 8th, 16th, ... write/sync of an open."""
    acked = _kill_after(data_dir, "keyed", 3000)
    db_dir = data_dir / "dbs" / "crash"
    ends = [_segment_ends(db_dir, 16)]
    kill_at = 8
    while True:
        cmd = [
            *strace_command(),
            "-o",
            "/dev/null",
            "-e",
            "trace=pwrite64,pwritev,fdatasync,fsync,rename",
            "-e",
            f"inject=pwrite64,pwritev,fdatasync,fsync,rename:signal=SIGKILL:when={kill_at}",
            sys.executable,
            "-m",
            "tests.open_child",
            str(data_dir),
        ]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
        if "opened" in proc.stdout:
            break
        ends.append(_segment_ends(db_dir, 16))
        kill_at += 8
        assert kill_at < 4000, "the open never finished"
    assert any(a != b for a, b in itertools.pairwise(ends)), "no killed open had replayed anything"
    run(_verify(data_dir, acked))
    run(_verify(data_dir, acked))  # and again: replay after a completed replay changes nothing


def test_one_fdatasync_per_drain_for_many_shards(run, data_dir: Path) -> None:
    """A 1000-record keyed append over 64 shards costs each worker one journal sync, not 16."""

    async def main() -> tuple[int, int]:
        async with seglog.open(data_dir, io_workers=2) as store:
            db = await store.create_db("t", shards=64)
            recs = [seglog.Record(topic="m", value=b"v" * 100, key=b"dev-%d" % i) for i in range(1000)]
            await db.append(recs)  # warm: journals allocated
            with _counting_fdatasync() as calls:
                res = await db.append(recs)
            return calls[0], len(set(res.shards.tolist()))

    calls, touched = run(main())
    assert touched == 64
    assert calls == 2, f"{calls} fdatasync calls for one append over 64 shards on 2 workers"


def test_power_loss_after_acknowledged_many_shard_appends(run, tmp_path: Path) -> None:
    """The disk loses its page cache (ext4 shut down): acknowledged rows come back from the journal."""
    with ext4_fs(tmp_path, size_mib=96) as fs:
        data = fs.mount / "data"
        acked: dict[int, set[bytes]] = {}

        async def load() -> None:
            store = await seglog.open(data, buffer_ms=3_600_000)
            db = await store.create_db("t", shards=16)
            for b in range(20):
                recs = [
                    seglog.Record(topic="m", value=b"b%d-%d" % (b, i), key=b"dev-%d" % (i * 31 + b))
                    for i in range(500)
                ]
                res = await db.append(recs)
                for m, r in zip(res, recs, strict=True):
                    acked.setdefault(m.shard, set()).add(r.value)
            shutdown_fs(fs.mount)  # like a power cut: nothing unsynced reaches the disk
            with pytest.raises(seglog.StorageError):
                await store.close()

        run(load())
        fs.remount()

        async def verify() -> None:
            async with seglog.open(data) as store:
                db = await store.open_db("t")
                for shard in range(16):
                    values = (await db.read_arrow(shard, 0, 10**6)).column("value").to_pylist()
                    assert set(values) == acked.get(shard, set())
                    assert len(values) == len(acked.get(shard, set()))

        run(verify())


def test_interval_policy_is_one_sync_per_interval_not_per_shard(run, data_dir: Path) -> None:
    async def main() -> int:
        async with seglog.open(data_dir, fsync="interval", fsync_interval_ms=60_000, io_workers=1) as store:
            db = await store.create_db("t", shards=32)
            recs = [seglog.Record(topic="m", value=b"v", key=b"k%d" % i) for i in range(500)]
            await db.append(recs)
            with _counting_fdatasync() as calls:
                for _ in range(5):
                    await db.append(recs)
            return calls[0]

    assert run(main()) == 0


def test_failed_drain_leaves_no_rows_and_offsets_continue(run, tmp_path: Path) -> None:
    """ENOSPC while the journal grows: the many-shard append fails whole; later appends continue densely."""
    with ext4_fs(tmp_path, size_mib=24) as fs:
        data = fs.mount / "data"

        async def main() -> None:
            async with seglog.open(data, io_workers=1, buffer_ms=3_600_000) as store:
                db = await store.create_db("t", shards=8)
                small = [seglog.Record(topic="m", value=b"s%d" % i, key=b"k%d" % i) for i in range(100)]
                await db.append(small)
                ends = [db.end_offset(s) for s in range(8)]
                fs.fill(leave_bytes=1 << 20)
                big = [seglog.Record(topic="m", value=b"x" * 1000, key=b"k%d" % i) for i in range(8000)]
                with pytest.raises(seglog.AppendFailed):
                    await db.append(big)
                assert [db.end_offset(s) for s in range(8)] == ends
                fs.unfill()
                res = await db.append(small)
                for m in res:
                    assert m.offset >= ends[m.shard]
                assert sorted((m.shard, m.offset) for m in res)[0][1] == ends[0]

        run(main())

        async def reopen() -> None:
            async with seglog.open(data) as store:
                db = await store.open_db("t")
                total = sum(db.end_offset(s) for s in range(8))
                assert total == 200
                for s in range(8):
                    values = (await db.read_arrow(s, 0, 10**6)).column("value").to_pylist()
                    assert all(len(v) < 10 for v in values), "a row of the failed append came back"

        run(reopen())


def test_buffered_rows_of_many_appends_become_one_frame_per_shard(run, data_dir: Path) -> None:
    """A flush writes each shard's rows of many appends as one run of frames, in offset order,
    also after a single-shard append wrote some shards' rows earlier."""

    async def main() -> None:
        async with seglog.open(data_dir, io_workers=1, buffer_ms=3_600_000) as store:
            db = await store.create_db("t", shards=8)
            expected: dict[int, list[bytes]] = {}
            for b in range(30):
                recs = [
                    seglog.Record(topic="m", value=b"%d-%d" % (b, i), key=b"dev-%d" % (i * 7 + b))
                    for i in range(40)
                ]
                res = await db.append(recs)
                for m, r in zip(res, recs, strict=True):
                    assert m.offset == len(expected.setdefault(m.shard, []))
                    expected[m.shard].append(r.value)
                if b == 10:
                    # One shard only: written straight to its segment, flushing its rows first.
                    one = [seglog.Record(topic="m", value=b"single-%d" % i) for i in range(5)]
                    res = await db.append(one, shard=3)
                    assert res[0].offset == len(expected[3])
                    expected[3].extend(r.value for r in one)
            for shard in range(8):  # read back before the flush: pending rows are read from memory
                assert (await db.read_arrow(shard, 0, 10**6)).column("value").to_pylist() == expected[shard]
        async with seglog.open(data_dir) as store:
            db = await store.open_db("t")
            for shard in range(8):
                assert (await db.read_arrow(shard, 0, 10**6)).column("value").to_pylist() == expected[shard]
            # The rows buffered after the single-shard write went into few frames, not one per append.
            frames = sum(1 for _ in _frames(data_dir / "dbs" / "t", 0))
            assert frames <= 2, f"shard 0's rows of 30 appends were cut into {frames} frames"

    run(main())


def _frames(db_dir: Path, shard: int) -> Iterator[object]:
    log_, _ = open_shard_log(
        db_dir / f"shard-{shard:04d}", segment_bytes=1 << 30, segment_ms=1 << 40, clock_ms=lambda: 0
    )
    try:
        for seg in log_.segments_snapshot():
            yield from log_.frames_from(seg, 0, log_.next_offset)
    finally:
        log_.close()


def test_single_shard_flushes_release_the_buffered_requests(run, data_dir: Path) -> None:
    """Sealing shard by shard (one flush each) leaves no buffered request behind in the worker."""

    async def main() -> None:
        async with seglog.open(data_dir, io_workers=1, buffer_ms=3_600_000) as store:
            db = await store.create_db("t", shards=4)
            for b in range(5):
                await db.append(
                    [seglog.Record(topic="m", value=b"%d-%d" % (b, i), key=b"k%d" % i) for i in range(100)]
                )
            writer = db._engine._writers[0]  # type: ignore[attr-defined]
            assert writer._pending._parts, "the appends never took the buffered path"
            await db.seal()  # each shard flushed on its own before its segment is sealed
            assert not writer._pending._parts and writer._pending.count == 0
            total = 0
            for shard in range(4):
                total += len(await read_all(db, shard))
            assert total == 500

    run(main())
