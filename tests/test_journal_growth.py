"""The journal is zero-filled ahead of its drains by a background grower, not inside them."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import seglog
from seglog.segment.journal import Journal
from tests.faults import ext4_fs
from tests.journal_grow_child import value_for

ROOT = Path(__file__).resolve().parent.parent
_GROWER = "seglog-journal-grow"


def _journals(db: seglog.Database) -> list[Journal]:
    return [w.journal for w in db._engine._writers]  # type: ignore[attr-defined]


def _wait_grower_idle(db: seglog.Database) -> None:
    grower = getattr(db._engine, "journal_grower", None)  # type: ignore[attr-defined]
    assert grower is None or grower.wait_idle(60), "the journal grower never finished"


def _batch(b: int, n: int = 500, size: int = 200) -> list[seglog.Record]:
    return [
        seglog.Record(topic="m", value=b"%d-%d-" % (b, i) + b"x" * size, key=b"dev-%d" % i) for i in range(n)
    ]


def _grower_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(_GROWER)]


def test_fresh_journal_grows_past_several_steps_without_a_drain_growing_it(
    run, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """~10 MiB of journal entries on a fresh database (the old steps 1, 2, 4, 8, 16 MiB, each
    zero-filled and synced inside the drain that needed it): every drain now finds its room
    zero-filled already, and the I/O worker makes exactly one fdatasync per drain."""
    worker_syncs: list[str] = []
    real = os.fdatasync

    def counted(fd: int) -> None:
        name = threading.current_thread().name
        if name.startswith("seglog-io"):
            worker_syncs.append(name)
        real(fd)

    async def main() -> None:
        async with seglog.open(data_dir, fsync="always", io_workers=1, buffer_ms=3_600_000) as store:
            db = await store.create_db("t", shards=16, segment_bytes=1 << 30)
            (journal,) = _journals(db)
            first = journal.allocated
            monkeypatch.setattr(os, "fdatasync", counted)
            appends = 0
            while journal.write_pos < 10 << 20:
                await db.append(_batch(appends))
                appends += 1
                # The grower was asked before the append returned; let it finish (it is ahead
                # of the drains as long as it gets its share of the machine).
                _wait_grower_idle(db)
            monkeypatch.setattr(os, "fdatasync", real)
            assert first <= 1 << 20 and journal.allocated > journal.write_pos >= 10 << 20
            assert os.stat(journal.path).st_size == journal.allocated
            assert len(worker_syncs) == appends, f"{len(worker_syncs)} worker fdatasyncs for {appends} drains"
            assert journal.sync_grow_count == 0, f"{journal.sync_grow_bytes} bytes zero-filled inside drains"

        async with seglog.open(data_dir) as store:
            db = await store.open_db("t")
            assert sum(db.end_offset(s) for s in range(16)) == appends * 500

    run(main())
    assert not _grower_threads()


def test_a_drain_that_outruns_the_grower_grows_the_journal_itself(run, data_dir: Path) -> None:
    """One append larger than all the room zero-filled ahead: the drain grows what it needs
    (counted), as before the grower; nothing is lost."""

    async def main() -> None:
        async with seglog.open(data_dir, fsync="always", io_workers=1, buffer_ms=3_600_000) as store:
            db = await store.create_db("t", shards=16)
            (journal,) = _journals(db)
            await db.append(_batch(0, n=20_000, size=200))  # ~4.5 MiB in one drain
            assert journal.sync_grow_count == 1
            assert journal.allocated >= journal.write_pos > 4 << 20
            _wait_grower_idle(db)
        async with seglog.open(data_dir) as store:
            db = await store.open_db("t")
            assert sum(db.end_offset(s) for s in range(16)) == 20_000

    run(main())


def _kill_child_while_growing(data: Path, acks_after: int) -> tuple[list[tuple[int, int, int]], int]:
    """Run the child until its grower is stuck mid-chunk and ``acks_after`` more records are
    acknowledged, then SIGKILL it. Returns the acknowledged records and how many came after."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.journal_grow_child", str(data)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    acked: list[tuple[int, int, int]] = []
    growing_at: int | None = None
    try:
        for line in proc.stdout:  # events from the child, not a timer
            if line == "growing\n":
                growing_at = len(acked)
                continue
            acked.append(tuple(map(int, line.split())))  # type: ignore[arg-type]
            if growing_at is not None and len(acked) >= growing_at + acks_after:
                break
            if growing_at is None and len(acked) > 200_000:  # ~20 MiB of journal: no grower
                break
        os.kill(proc.pid, signal.SIGKILL)
        for line in proc.stdout.read().splitlines(keepends=True):
            if line.endswith("\n") and line != "growing\n":
                acked.append(tuple(map(int, line.split())))  # type: ignore[arg-type]
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert growing_at is not None, "the child exited before its journal grower started"
    return acked, len(acked) - growing_at


def test_sigkill_with_background_growth_in_flight_loses_no_acknowledged_record(run, data_dir: Path) -> None:
    """The grower wrote a chunk of zeros and hangs in its fdatasync; drains go on (their
    room is zero-filled already) and are acknowledged; SIGKILL; every acknowledged record is
    there after reopen (journal replay), in dense offsets, and appends continue."""
    acked, after = _kill_child_while_growing(data_dir, acks_after=200)
    assert after >= 200, "no append was acknowledged while the growth was in flight"
    journal = data_dir / "dbs" / "grow" / "journal" / "worker-000.journal"
    assert journal.stat().st_size > 1 << 20, "the killed growth never wrote its zeros"

    async def verify() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.open_db("grow")
            values = {s: (await db.read_arrow(s, 0, 10**7)).column("value").to_pylist() for s in range(16)}
            for shard, offset, seq in acked:
                assert values[shard][offset] == value_for(seq), (shard, offset, seq)
            assert sum(len(v) for v in values.values()) >= len(acked)
            res = await db.append(_batch(1, n=100))
            for m in res:
                assert m.offset < len(values[m.shard]) + 100

    run(verify())


def test_close_with_growth_in_flight_leaves_no_thread(
    run, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Close while the grower is inside a chunk (held in its fdatasync until the journal is
    closing): close waits for that chunk, abandons the rest, and no grower thread is left."""
    real_sync = os.fdatasync
    real_close = Journal.close
    entered = threading.Event()
    release = threading.Event()

    def slow_grower_sync(fd: int) -> None:
        if threading.current_thread().name.startswith(_GROWER) and not release.is_set():
            entered.set()
            assert release.wait(60)
        real_sync(fd)

    def closing(self: Journal) -> None:
        release.set()  # the chunk in flight may finish now; close waits for it
        real_close(self)

    monkeypatch.setattr(os, "fdatasync", slow_grower_sync)
    monkeypatch.setattr(Journal, "close", closing)

    async def main() -> tuple[int, int]:
        async with seglog.open(data_dir, fsync="always", io_workers=1, buffer_ms=3_600_000) as store:
            db = await store.create_db("t", shards=16)
            (journal,) = _journals(db)
            appends = 0
            while not entered.is_set():
                assert appends < 1000, "the grower never started"
                await db.append(_batch(appends, n=100))
                appends += 1
            assert _grower_threads(), "no grower thread while its chunk is in flight"
            target = journal._grow_target
        return appends, target

    appends, target = run(main())
    assert release.is_set()
    assert not _grower_threads(), "a grower thread outlived the store"
    monkeypatch.setattr(os, "fdatasync", real_sync)

    async def reopen() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.open_db("t")
            assert sum(db.end_offset(s) for s in range(16)) == appends * 100

    run(reopen())
    assert target > 1 << 20


def test_enospc_in_background_growth_falls_back_to_the_drain(
    run, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The disk fills: the grower's zero-fill fails (logged, nothing lost); appends that fit
    in the room already zero-filled go on; one that outruns it fails whole, as before the
    grower; once space is back, appends continue and every acknowledged record reopens."""
    with ext4_fs(tmp_path, size_mib=24) as fs:
        data = fs.mount / "data"
        caplog.set_level(logging.WARNING, logger="seglog.segment.journal")
        acked = 0

        async def main() -> None:
            nonlocal acked
            async with seglog.open(data, fsync="always", io_workers=1, buffer_ms=3_600_000) as store:
                db = await store.create_db("t", shards=8)
                (journal,) = _journals(db)
                fs.fill(leave_bytes=64 << 10)
                b = 0
                while "growing the journal ahead failed" not in caplog.text:
                    assert journal.write_pos + (64 << 10) < journal.allocated, "the grower was never asked"
                    await db.append(_batch(b, n=100))
                    acked += 100
                    b += 1
                    _wait_grower_idle(db)
                assert journal.allocated == 1 << 20 and journal.sync_grow_count == 0
                room = journal.allocated - journal.write_pos
                await db.append(_batch(b, n=100))  # fits in the room zero-filled at creation
                acked += 100
                assert room > 32 << 10
                with pytest.raises(seglog.AppendFailed):
                    await db.append(_batch(b + 1, n=5000))  # outruns: the drain's own ENOSPC
                fs.unfill()
                await db.append(_batch(b + 2, n=5000))
                acked += 5000
                assert journal.sync_grow_count == 1  # this one (the failed one grew nothing)

        run(main())

        async def reopen() -> None:
            async with seglog.open(data) as store:
                db = await store.open_db("t")
                assert sum(db.end_offset(s) for s in range(8)) == acked

        run(reopen())
