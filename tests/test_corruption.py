"""Damaged tails are cut back to the last valid frame, keeping everything before it."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest

import seglog
from seglog.record import FRAME_HEADER_BYTES, parse_header
from tests.helpers import make_records, read_all, segment_files


def _frame_starts(path: Path) -> list[int]:
    data = path.read_bytes()
    pos, starts = 0, []
    while pos < len(data):
        starts.append(pos)
        pos += parse_header(data, pos).size
    return starts


def _truncate_mid_last_frame(path: Path) -> None:
    last = _frame_starts(path)[-1]
    os.truncate(path, last + FRAME_HEADER_BYTES + 5)


def _flip_byte_in_last_frame(path: Path) -> None:
    last = _frame_starts(path)[-1]
    with path.open("r+b") as f:
        f.seek(last + FRAME_HEADER_BYTES + 3)
        b = f.read(1)
        f.seek(last + FRAME_HEADER_BYTES + 3)
        f.write(bytes([b[0] ^ 0x40]))


def _garbage_tail(path: Path) -> None:
    with path.open("ab") as f:
        f.write(os.urandom(777))


def _zero_tail(path: Path) -> None:
    with path.open("ab") as f:
        f.write(b"\0" * 4096)


@pytest.mark.parametrize(
    ("damage", "lost_frames"),
    [(_truncate_mid_last_frame, 1), (_flip_byte_in_last_frame, 1), (_garbage_tail, 0), (_zero_tail, 0)],
    ids=["truncated-tail", "flipped-byte", "garbage-tail", "zero-tail"],
)
def test_damaged_tail_is_truncated(
    run, data_dir: Path, caplog: pytest.LogCaptureFixture, damage: Callable[[Path], None], lost_frames: int
) -> None:
    batches = [make_records(50, start=i * 50) for i in range(10)]

    async def write() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", segment_bytes=8 * 1024)
            for b in batches:
                await db.append(b)

    run(write())
    files = segment_files(data_dir, "t", 0)
    assert len(files) > 1
    active = files[-1]
    n_frames_active = len(_frame_starts(active))
    damage(active)
    caplog.set_level(logging.WARNING, logger="seglog")

    async def check() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.open_db("t")
            recs = await read_all(db, 0)
            expected = 500 - 50 * lost_frames
            assert db.end_offset(0) == expected
            want = [r for b in batches for r in b][:expected]
            assert [(r.value, r.ts) for r in recs] == [(w.value, w.ts) for w in want]
            m = await db.append(make_records(1))
            assert m[0].offset == expected

    run(check())
    assert any("recovery cut" in r.getMessage() for r in caplog.records)
    assert len(_frame_starts(active)) == n_frames_active - lost_frames + 1  # +1: the new append


def test_corrupt_sealed_segment_cuts_it_and_everything_after(
    run, data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def write() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", segment_bytes=8 * 1024)
            for i in range(10):
                await db.append(make_records(50, start=i * 50))

    run(write())
    files = segment_files(data_dir, "t", 0)
    # Remove the checkpoint so sealed segments are validated too (as after a crash at a roll).
    (files[0].parent / "checkpoint.json").unlink()
    os.chmod(files[1], 0o644)
    _flip_byte_in_last_frame(files[1])
    caplog.set_level(logging.WARNING, logger="seglog")

    async def check() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.open_db("t")
            recs = await read_all(db, 0)
            assert [r.offset for r in recs] == list(range(len(recs)))
            assert len(recs) < 500

    run(check())
    assert not any(f.exists() for f in files[2:])
    assert any("deleted" in r.getMessage() for r in caplog.records)
