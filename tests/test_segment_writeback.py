"""Dirty segments are synced in the background as the journal fills, ahead of its checkpoint."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import threading
from pathlib import Path

import pytest

import seglog
from seglog.segment.writeback import SegmentWriteback

_THREAD = "seglog-segment-writeback"


def _synced_paths(monkeypatch: pytest.MonkeyPatch, fail: set[str] | None = None) -> list[str]:
    """Record (and optionally fail) the writeback thread's fdatasyncs, by file path."""
    seen: list[str] = []
    real = os.fdatasync

    def recording(fd: int) -> None:
        if threading.current_thread().name.startswith(_THREAD):
            path = os.readlink(f"/proc/self/fd/{fd}")
            seen.append(path)
            if fail and Path(path).name in fail:
                raise OSError(errno.EIO, "injected writeback error")
        real(fd)

    monkeypatch.setattr(os, "fdatasync", recording)
    return seen


def _threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(_THREAD)]


def test_each_requested_file_is_synced_once_and_missing_ones_are_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = [tmp_path / f"{i}.log" for i in range(3)]
    for f in files:
        f.write_bytes(b"x" * 4096)
    seen = _synced_paths(monkeypatch)
    wb = SegmentWriteback()
    wb.request([files[0], files[1], files[0], tmp_path / "gone.log", files[2]])
    assert wb.wait_idle(30)
    assert sorted(seen) == sorted(str(f) for f in files)
    assert (wb.synced, wb.failed) == (3, 0)
    assert not _threads()  # the thread runs only while something is queued
    wb.close()


def test_a_failed_sync_is_counted_logged_and_the_rest_still_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    files = [tmp_path / f"{i}.log" for i in range(3)]
    for f in files:
        f.write_bytes(b"x")
    seen = _synced_paths(monkeypatch, fail={"1.log"})
    wb = SegmentWriteback()
    with caplog.at_level(logging.WARNING, logger="seglog.segment.writeback"):
        wb.request(files)
        assert wb.wait_idle(30)
    assert seen == [str(f) for f in files]
    assert (wb.synced, wb.failed) == (2, 1)
    assert "1.log: background writeback failed" in caplog.text


def test_close_drops_the_queue_and_later_requests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "a.log"
    f.write_bytes(b"x")
    seen = _synced_paths(monkeypatch)
    wb = SegmentWriteback()
    wb.close()
    wb.request([f])
    assert wb.wait_idle(5) and not seen and not _threads()
    wb.close()  # idempotent


def _shard_segments(data_dir: Path) -> set[str]:
    return {str(p) for p in data_dir.glob("dbs/t/shard-*/*.log")}


@pytest.mark.parametrize("fsync", ["always", "interval"])
def test_the_dirty_segments_are_synced_in_the_background_as_the_journal_fills(
    run, data_dir: Path, monkeypatch: pytest.MonkeyPatch, fsync: str
) -> None:
    """With a 1 MiB journal, every 1/WRITEBACK_PARTS (8) of it hands the dirty segments to the
    writeback: they are synced off the drain, before the checkpoint at the journal's end."""
    seen = _synced_paths(monkeypatch)
    records = 0

    async def main() -> None:
        nonlocal records
        async with seglog.open(data_dir, fsync=fsync, io_workers=1, journal_bytes=1 << 20) as store:
            db = await store.create_db("t", shards=4)
            engine = db._engine  # type: ignore[attr-defined]
            (writer,) = engine._writers
            journal, wb = writer.journal, engine.segment_writeback
            cycle = journal.cycle
            # Appends to the four shards at once: their frames share drains, which go through
            # the journal (a drain of one shard's frames syncs its segment directly) and leave
            # the segments dirty, until the journal is half full (no checkpoint yet).
            for _ in range(10_000):
                if journal.write_pos >= (1 << 20) // 2:
                    break
                await asyncio.gather(
                    *(
                        db.append(
                            [
                                seglog.Record(topic="t", value=b"%d-%d" % (records, i) + b"v" * 300)
                                for i in range(100)
                            ],
                            shard=shard,
                        )
                        for shard in range(4)
                    )
                )
                records += 400
            assert journal.cycle == cycle, "the journal was checkpointed: the test wants it half full"
            assert wb.wait_idle(60)
            # Half the journal is four writeback requests of the shards journaled drains left
            # dirty (a drain of one shard's frames syncs its segment itself; a path still
            # queued is not queued twice): synced before any checkpoint.
            assert seen and set(seen) <= _shard_segments(data_dir), seen
            assert wb.synced == len(seen) and wb.failed == 0

        async with seglog.open(data_dir) as store:
            db = await store.open_db("t")
            assert sum(db.end_offset(s) for s in range(4)) == records

    run(main())
    assert not _threads()


def test_fsync_never_asks_for_no_writeback(run, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _synced_paths(monkeypatch)

    async def main() -> None:
        async with seglog.open(data_dir, fsync="never", io_workers=1, journal_bytes=1 << 20) as store:
            db = await store.create_db("t", shards=4)
            (writer,) = db._engine._writers  # type: ignore[attr-defined]
            for n in range(10_000):  # fsync="never" journals every drain
                if writer.journal.write_pos >= (1 << 20) // 2:
                    break
                await db.append([seglog.Record(topic="t", value=b"v" * 300) for _ in range(500)], shard=n % 4)
            assert db._engine.segment_writeback.synced == 0  # type: ignore[attr-defined]

    run(main())
    assert not seen


def test_a_failed_background_writeback_fails_the_checkpoint_and_the_journal_keeps_the_records(
    run, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write error the writeback's sync consumed may never reach the worker's own
    descriptors: the next checkpoint fails instead of recycling the journal, and a reopen
    replays it, so no acknowledged record is lost."""
    _synced_paths(monkeypatch, fail={"00000000000000000000.log"})
    acked: dict[int, int] = {}

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            store = await stack.enter_async_context(
                seglog.open(data_dir, fsync="always", io_workers=1, journal_bytes=1 << 20)
            )
            db = await store.create_db("t", shards=4)
            engine = db._engine  # type: ignore[attr-defined]
            (writer,) = engine._writers
            failed_at: int | None = None
            for _ in range(10_000):
                results = await asyncio.gather(
                    *(
                        db.append(
                            [seglog.Record(topic="t", value=b"v" * 300) for _ in range(100)], shard=shard
                        )
                        for shard in range(4)
                    ),
                    return_exceptions=True,
                )
                errors = [r for r in results if isinstance(r, BaseException)]
                for shard, r in enumerate(results):
                    if not isinstance(r, BaseException):
                        acked[shard] = acked.get(shard, 0) + 100
                if errors:
                    assert all(isinstance(e, seglog.errors.StorageError) for e in errors), errors
                    break
                if (
                    failed_at is None
                    and engine.segment_writeback.wait_idle(60)
                    and engine.segment_writeback.failed
                ):
                    failed_at = writer.journal.cycle
            else:
                pytest.fail("no append failed")
            assert failed_at is not None and writer.journal.cycle == failed_at, "the journal was recycled"
            stack.pop_all()  # closing checkpoints again, and fails the same way
            with pytest.raises(seglog.errors.StorageError):
                await store.close()

    run(main())
    monkeypatch.undo()

    async def check() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.open_db("t")
            for shard, count in acked.items():  # every acknowledged record is there
                assert db.end_offset(shard) >= count
                assert len(await db.read(shard, 0, max_records=count)) == count

    run(check())
