"""HighWatermarkCheckpoint: monotonic updates, reset, lazy flush, reload, corruption."""

from __future__ import annotations

from pathlib import Path

import pytest

from seglog.errors import CorruptCheckpoint, InvalidArgument, StorageError
from seglog.segment import HIGH_WATERMARK_FILE, HighWatermarkCheckpoint


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
