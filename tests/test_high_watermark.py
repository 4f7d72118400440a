"""HighWatermarkCheckpoint: monotonic updates, reset, lazy flush, reload, corruption; the background writer."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

import seglog
from seglog.engines.segment_writer import HW_FLUSH_INTERVAL_S
from seglog.errors import CorruptCheckpoint, InvalidArgument, StorageError
from seglog.segment import HIGH_WATERMARK_FILE, HighWatermarkCheckpoint
from seglog.segment.high_watermark import HighWatermarkWriter


class Clock:
    """Seconds that move only when told to."""

    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def snapshot(path: Path) -> tuple[int, bytes]:
    return path.stat().st_mtime_ns, path.read_bytes()


def test_missing_file_is_zero_and_nothing_is_written(tmp_path: Path) -> None:
    hw = HighWatermarkCheckpoint(tmp_path)
    assert hw.value == 0
    assert not hw.dirty
    assert hw.flush() is False
    assert not (tmp_path / HIGH_WATERMARK_FILE).exists()


def test_update_is_monotonic_and_lazy(tmp_path: Path) -> None:
    hw = HighWatermarkCheckpoint(tmp_path)
    assert hw.update(10) is True
    assert hw.update(5) is False
    assert hw.update(10) is False
    assert hw.value == 10
    assert hw.dirty
    assert not (tmp_path / HIGH_WATERMARK_FILE).exists()  # nothing on disk until a flush
    assert HighWatermarkCheckpoint(tmp_path).value == 0
    assert hw.flush() is True
    assert not hw.dirty
    assert HighWatermarkCheckpoint(tmp_path).value == 10


def test_flush_writes_only_when_dirty(tmp_path: Path) -> None:
    path = tmp_path / HIGH_WATERMARK_FILE
    hw = HighWatermarkCheckpoint(tmp_path)
    hw.update(7)
    assert hw.flush() is True
    before = snapshot(path)
    assert hw.flush() is False
    assert hw.update(3) is False  # ignored: not dirty either
    assert hw.flush() is False
    assert snapshot(path) == before
    hw.update(8)
    assert hw.flush() is True
    assert path.read_bytes() != before[1]
    assert HighWatermarkCheckpoint(tmp_path).value == 8


def test_reset_lowers_and_persists_at_once(tmp_path: Path) -> None:
    hw = HighWatermarkCheckpoint(tmp_path)
    hw.update(100)
    hw.flush()
    hw.update(120)
    hw.reset(40)
    assert hw.value == 40
    assert not hw.dirty
    assert HighWatermarkCheckpoint(tmp_path).value == 40
    assert hw.update(41) is True


def test_load_drops_unflushed_updates(tmp_path: Path) -> None:
    hw = HighWatermarkCheckpoint(tmp_path)
    hw.update(5)
    hw.flush()
    hw.update(9)
    assert hw.load() == 5
    assert hw.value == 5
    assert not hw.dirty


def test_maybe_flush_follows_the_injected_clock(tmp_path: Path) -> None:
    path = tmp_path / HIGH_WATERMARK_FILE
    clock = Clock()
    hw = HighWatermarkCheckpoint(tmp_path, clock=clock, flush_interval_s=5.0)
    hw.update(1)
    clock.now_s += 4.9
    assert hw.maybe_flush() is False
    assert not path.exists()
    clock.now_s += 0.1
    assert hw.maybe_flush() is True
    assert HighWatermarkCheckpoint(tmp_path).value == 1
    before = snapshot(path)
    clock.now_s += 60
    assert hw.maybe_flush() is False  # not dirty
    assert snapshot(path) == before
    hw.update(2)
    assert hw.maybe_flush() is True  # the interval has long passed since the last write
    hw.update(3)
    assert hw.maybe_flush() is False  # just written
    clock.now_s += 5
    assert hw.maybe_flush() is True
    assert HighWatermarkCheckpoint(tmp_path).value == 3


def test_large_value_round_trip(tmp_path: Path) -> None:
    hw = HighWatermarkCheckpoint(tmp_path)
    hw.reset((1 << 62) + 1)
    assert HighWatermarkCheckpoint(tmp_path).value == (1 << 62) + 1


def test_negative_values_are_rejected(tmp_path: Path) -> None:
    hw = HighWatermarkCheckpoint(tmp_path)
    with pytest.raises(InvalidArgument):
        hw.update(-1)
    with pytest.raises(InvalidArgument):
        hw.reset(-1)
    with pytest.raises(InvalidArgument):
        HighWatermarkCheckpoint(tmp_path, flush_interval_s=-1)


@pytest.mark.parametrize("position", [0, 3, 22, 23, -4, -2])
def test_flipped_byte_is_an_error(tmp_path: Path, position: int) -> None:
    HighWatermarkCheckpoint(tmp_path).reset(123456)
    path = tmp_path / HIGH_WATERMARK_FILE
    raw = bytearray(path.read_bytes())
    raw[position] ^= 0x04
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptCheckpoint):
        HighWatermarkCheckpoint(tmp_path)


def test_every_torn_prefix_is_an_error(tmp_path: Path) -> None:
    HighWatermarkCheckpoint(tmp_path).reset(99)
    path = tmp_path / HIGH_WATERMARK_FILE
    raw = path.read_bytes()
    for cut in range(len(raw)):
        path.write_bytes(raw[:cut])
        with pytest.raises(CorruptCheckpoint):
            HighWatermarkCheckpoint(tmp_path)


@pytest.mark.parametrize("content", [b"", b"0\n", b"garbage", b"\x00" * 40, b"a\nb\nc\nd\n"])
def test_garbage_is_an_error_not_zero(tmp_path: Path, content: bytes) -> None:
    (tmp_path / HIGH_WATERMARK_FILE).write_bytes(content)
    with pytest.raises(CorruptCheckpoint) as info:
        HighWatermarkCheckpoint(tmp_path)
    assert isinstance(info.value, StorageError)


def test_corrupt_file_on_reload_keeps_the_value(tmp_path: Path) -> None:
    hw = HighWatermarkCheckpoint(tmp_path)
    hw.reset(10)
    (tmp_path / HIGH_WATERMARK_FILE).write_bytes(b"junk\n")
    with pytest.raises(CorruptCheckpoint):
        hw.load()
    assert hw.value == 10


def test_failed_flush_stays_dirty(tmp_path: Path) -> None:
    hw = HighWatermarkCheckpoint(tmp_path)
    hw.update(4)
    (tmp_path / (HIGH_WATERMARK_FILE + ".tmp")).mkdir()
    with pytest.raises(StorageError):
        hw.flush()
    assert hw.dirty and hw.value == 4
    with pytest.raises(StorageError):
        hw.reset(2)
    assert hw.value == 4
    (tmp_path / (HIGH_WATERMARK_FILE + ".tmp")).rmdir()
    assert hw.flush() is True
    assert HighWatermarkCheckpoint(tmp_path).value == 4


def test_writer_writes_in_the_background_and_retries_a_failed_write(tmp_path: Path) -> None:
    hw = HighWatermarkCheckpoint(tmp_path)
    writer = HighWatermarkWriter("test-hw-writer")
    hw.update(4)
    blocker = tmp_path / (HIGH_WATERMARK_FILE + ".tmp")
    blocker.mkdir()  # the atomic write's temporary file cannot be created: a real failure
    writer.request([hw])
    assert writer.wait_idle(30)
    assert (writer.written, writer.failures) == (0, 1)
    assert hw.dirty and not (tmp_path / HIGH_WATERMARK_FILE).exists()
    blocker.rmdir()
    hw.update(6)
    writer.request([])  # the failed one is retried with the next request
    assert writer.wait_idle(30)
    assert (writer.written, writer.failures) == (1, 1)
    assert not hw.dirty and HighWatermarkCheckpoint(tmp_path).value == 6
    assert writer.take_failed() == []
    assert not [t for t in threading.enumerate() if t.name == "test-hw-writer"]  # runs only when queued
    writer.close()


def test_a_reset_waits_for_a_flush_in_progress_and_its_lower_value_is_the_one_kept(tmp_path: Path) -> None:
    """A background flush and a truncation's reset take turns writing: a reset that came while
    the flush was writing the older, higher value is written after it, not overtaken by it."""
    hw = HighWatermarkCheckpoint(tmp_path)
    hw.update(50)
    entered, release = threading.Event(), threading.Event()
    written: list[int] = []
    real_write = hw._write

    def write(value: int, *, force: bool = False) -> None:
        if not written and not force:  # the flush: paused mid-write
            entered.set()
            assert release.wait(30)
        written.append(value)
        real_write(value, force=force)

    hw._write = write  # type: ignore[method-assign,assignment]
    flusher = threading.Thread(target=hw.flush)
    flusher.start()
    assert entered.wait(30)
    resetter = threading.Thread(target=hw.reset, args=(20,))
    resetter.start()
    resetter.join(1.0)  # bounded wait: the reset must not finish while the flush writes
    assert resetter.is_alive() and written == []
    release.set()
    flusher.join(30)
    resetter.join(30)
    assert written == [50, 20]
    assert not hw.dirty and hw.value == 20
    assert HighWatermarkCheckpoint(tmp_path).value == 20


def test_the_io_workers_pass_hands_the_writes_to_the_writer_thread(
    run: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The moved high watermarks of a worker's 5-second pass are written by the database's
    writer thread, not by the I/O worker between two drains; close writes the rest."""
    shards = 4
    threads: list[str] = []
    all_written = threading.Event()
    real_write = HighWatermarkCheckpoint._write

    def write(self: HighWatermarkCheckpoint, value: int, *, force: bool = False) -> None:
        real_write(self, value, force=force)
        threads.append(threading.current_thread().name)
        if len(threads) == shards:
            all_written.set()

    monkeypatch.setattr(HighWatermarkCheckpoint, "_write", write)

    def records(n: int) -> list[seglog.Record]:
        return [seglog.Record(topic="t/a", value=b"v%d" % i, ts=1_700_000_000_000_000 + i) for i in range(n)]

    async def main() -> None:
        async with seglog.open(tmp_path / "a", fsync="always") as store:
            db = await store.create_db("r", shards=shards)
            for shard in range(shards):
                await db.append(records(10), shard=shard)
            for worker in db._engine._writers:  # type: ignore[attr-defined]
                worker._hw_flushed_at -= HW_FLUSH_INTERVAL_S  # the next pass is due now
            for shard in range(shards):
                assert db.update_high_watermark(shard, 5 + shard)
            await db.append(records(1), shard=0)  # a drain: the worker's pass follows it
            assert await asyncio.to_thread(all_written.wait, 30)
            assert set(threads) == {"seglog-high-watermark-r"}
            on_disk = [
                HighWatermarkCheckpoint(tmp_path / "a" / "dbs" / "r" / f"shard-{s:04d}").value
                for s in range(shards)
            ]
            assert on_disk == [5, 6, 7, 8]
            assert db.update_high_watermark(1, 10)  # moved after the pass: written at close
        assert len(threads) == shards + 1 and not threads[-1].startswith(
            "seglog-high-watermark"
        )  # close's own
        async with seglog.open(tmp_path / "a") as store:
            db = await store.open_db("r")
            assert [db.high_watermark(s) for s in range(shards)] == [5, 10, 7, 8]

    run(main())
