"""The replica log: frames shipped byte for byte (append_frames), truncation, reading frames."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest

import seglog
import seglog.record
from seglog.errors import BusyResourceError, CorruptFrame, InvalidArgument, OffsetMismatch
from seglog.record import parse_header
from tests.faults import kill_at_each_call
from tests.helpers import read_all

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent
TS0 = 1_700_000_000_000_000


def _records(n: int, start: int = 0, *, prefix: bytes = b"v") -> list[seglog.Record]:
    return [
        seglog.Record(topic=f"dev/{i % 7}/t", value=prefix + b"-%d" % i, key=b"k%d" % (i % 50), ts=TS0 + i)
        for i in range(start, start + n)
    ]


def _frame_bounds(data: bytes) -> list[tuple[int, int]]:
    out, pos = [], 0
    while pos < len(data):
        h = parse_header(data, pos)
        out.append((h.base_offset, h.next_offset))
        pos += h.size
    return out


async def _all_frames(db: seglog.Database, shard: int) -> bytes:
    out = []
    offset = db.start_offset(shard)
    while offset < db.end_offset(shard):
        chunk = await db.read_frames(shard, offset, max_bytes=8192)
        out.append(chunk)
        offset = _frame_bounds(chunk)[-1][1]
    return b"".join(out)


def test_frames_shipped_byte_for_byte_answer_every_read_alike(run, tmp_path: Path) -> None:
    async def main() -> None:
        async with seglog.open(tmp_path / "a") as a, seglog.open(tmp_path / "b") as b:
            da = await a.create_db("r", shards=4, segment_bytes=16384)
            db_ = await b.create_db("r", shards=4, segment_bytes=16384)
            for k in range(6):  # keyed over 4 shards: the journal rows path, then frames
                await da.append(_records(300, k * 300))
            await da.append(_records(200, 5000), shard=2)  # a frame request
            for shard in range(4):
                shipped = 0
                while shipped < da.end_offset(shard):
                    chunk = await da.read_frames(shard, shipped, max_bytes=5000)
                    shipped = await db_.append_frames(shard, chunk, expected_base=shipped)
                assert await _all_frames(db_, shard) == await _all_frames(da, shard)
                ra, rb = await read_all(da, shard), await read_all(db_, shard)
                assert [(r.offset, r.key, r.value, r.ts) for r in ra] == [
                    (r.offset, r.key, r.value, r.ts) for r in rb
                ]
                for key in (b"k0", b"k7", b"k49", b"nope"):
                    ka = await da.read_key(key, shard=shard)
                    kb = await db_.read_key(key, shard=shard)
                    assert [r.offset for r in ka] == [r.offset for r in kb]
                for ts in (TS0, TS0 + 333, TS0 + 5100, TS0 + 10**9):
                    assert await da.offset_for_time(shard, ts) == await db_.offset_for_time(shard, ts)
        async with seglog.open(tmp_path / "b") as b:  # and after a reopen
            db_ = await b.open_db("r")
            assert sum(db_.end_offset(s) for s in range(4)) == 2000

    run(main())


def test_append_frames_rejects_gaps_overlaps_and_corruption_writing_nothing(run, tmp_path: Path) -> None:
    async def main() -> None:
        async with seglog.open(tmp_path / "a") as a, seglog.open(tmp_path / "b") as b:
            da = await a.create_db("r", shards=1)
            dbb = await b.create_db("r", shards=1)
            for k in range(3):
                await da.append(_records(100, k * 100))
            data = await da.read_frames(0, 0, max_bytes=1 << 20)
            bounds = _frame_bounds(data)
            assert len(bounds) == 3
            first = parse_header(data, 0).size
            second = first + parse_header(data, first).size
            with pytest.raises(OffsetMismatch) as gap:
                await dbb.append_frames(0, data[first:], expected_base=0)
            assert (gap.value.expected, gap.value.actual) == (0, 100)
            with pytest.raises(OffsetMismatch):  # expected_base is not the end
                await dbb.append_frames(0, data, expected_base=5)
            with pytest.raises(OffsetMismatch):  # a gap inside the data
                await dbb.append_frames(0, data[:first] + data[second:], expected_base=0)
            await dbb.append_frames(0, data[:first], expected_base=0)
            with pytest.raises(OffsetMismatch):  # an overlap
                await dbb.append_frames(0, data[:second], expected_base=100)
            bad = bytearray(data[first:])
            bad[first // 2 + 60] ^= 0x40  # a body byte of the second frame
            with pytest.raises(CorruptFrame):
                await dbb.append_frames(0, bytes(bad), expected_base=100)
            with pytest.raises(CorruptFrame):  # ends inside a frame
                await dbb.append_frames(0, data[first : second - 8], expected_base=100)
            with pytest.raises(InvalidArgument):
                await dbb.append_frames(0, b"", expected_base=100)
            assert dbb.end_offset(0) == 100
            assert len(await read_all(dbb, 0)) == 100
            assert await dbb.append_frames(0, data[first:], expected_base=100) == 300
            assert await _all_frames(dbb, 0) == data

    run(main())


def test_truncate_to_cuts_at_a_frame_boundary_across_segments_and_appends_continue(
    run, tmp_path: Path
) -> None:
    async def main() -> tuple[int, list[tuple[int, bytes]]]:
        async with seglog.open(tmp_path / "a") as store:
            db = await store.create_db("r", shards=1, segment_bytes=8192)
            for k in range(20):
                await db.append(_records(50, k * 50))
            segments_before = len(list((tmp_path / "a").rglob("*.log")))
            held = await db.read_arrow(0, 0, max_records=1000)  # zero-copy views of what goes
            new_end = await db.truncate_to(0, 275)
            assert new_end == 250  # frames hold 50 records: cut at the start of 250..299
            assert db.end_offset(0) == 250
            assert len(list((tmp_path / "a").rglob("*.log"))) < segments_before
            assert held.num_rows == 1000 and held.column("value")[999].as_py() == b"v-999"  # no SIGBUS
            assert [r.offset for r in await db.read_key(b"k3", shard=0)] == [o for o in range(3, 250, 50)]
            assert await db.offset_for_time(0, TS0 + 900) == 250
            with pytest.raises(seglog.OffsetOutOfRange):
                await db.truncate_to(0, 251)
            res = await db.append(_records(10, 0, prefix=b"new"), shard=0)
            assert res[0].offset == 250
            return new_end, [(r.offset, r.value) for r in await read_all(db, 0)]

    _, before = run(main())
    assert len(before) == 260 and before[250][1] == b"new-0"

    async def reopen() -> None:
        async with seglog.open(tmp_path / "a") as store:
            db = await store.open_db("r")
            assert [(r.offset, r.value) for r in await read_all(db, 0)] == before
            assert [r.offset for r in await db.read_key(b"k3", shard=0)] == [*range(3, 250, 50), 253]

    run(reopen())


def test_truncated_rows_are_not_replayed_from_the_journal(run, tmp_path: Path) -> None:
    """Rows of many-shard appends wait in the journal; a cut must not come back after SIGKILL."""
    data = tmp_path / "data"

    async def create() -> None:
        async with seglog.open(data) as store:
            await store.create_db("r", shards=4)

    run(create())
    proc = subprocess.run(
        [sys.executable, "-m", "tests.replica_child", "journal", str(data), "100"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -9, proc.stderr
    words = proc.stdout.split()
    assert words[0] == "truncated" and int(words[1]) == int(words[2]) <= 100

    async def verify() -> None:
        async with seglog.open(data) as store:
            db = await store.open_db("r")
            assert db.end_offset(0) == int(words[1])
            on_shard0 = 4 * sum(1 for i in range(400) if db.shard_for(b"k%d" % i) == 0)
            assert on_shard0 > 100  # so the cut removed acknowledged rows of shard 0
            assert sum(db.end_offset(s) for s in range(1, 4)) == 1600 - on_shard0
            assert len(await read_all(db, 0)) == db.end_offset(0)

    run(verify())


def _make_template(path: Path) -> list[tuple[int, bytes]]:
    async def main() -> list[tuple[int, bytes]]:
        async with seglog.open(path) as store:
            db = await store.create_db("r", shards=1, segment_bytes=8192)
            for k in range(16):  # epoch 0, then a leader of epoch 2 from offset 400
                await _append_epoch(db, _records(50, k * 50), 0 if k < 8 else 2)
            assert db.leader_epochs(0) == [(0, 0), (2, 400)]
            return [(r.offset, r.value) for r in await read_all(db, 0)]

    return asyncio_run(main())


def asyncio_run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def test_truncate_killed_at_every_step_reopens_consistent(tmp_path: Path) -> None:
    """SIGKILL at each write, sync, rename, unlink and copy of a truncation (strace counts each
    system call separately, so each is stepped on its own): the reopened log is the whole log
    or the cut one, never between, and the indexes and the leader-epoch cache agree with it."""
    template = tmp_path / "template"
    full = _make_template(template)
    offset = 175  # inside the second of several sealed segments
    outcomes: set[int] = set()
    child = ["-m", "tests.replica_child", "truncate", "{data}", str(offset)]
    syscalls = ("pwrite64", "fsync", "fdatasync", "unlink", "rename", "copy_file_range")
    for syscall, kill_at, data, done in kill_at_each_call(template, tmp_path, syscalls, child, cwd=ROOT):
        end = asyncio_run(_verified_end(data, full))
        assert end in (150, len(full)), (syscall, kill_at, end)
        if done:
            assert end == 150
        else:
            outcomes.add(end)
    assert outcomes == {150, len(full)}, outcomes  # killed both before and after the point of no return


async def _verified_end(data: Path, full: list[tuple[int, bytes]]) -> int:
    async with seglog.open(data) as store:
        db = await store.open_db("r")
        end = db.end_offset(0)
        assert [(r.offset, r.value) for r in await read_all(db, 0)] == full[:end]
        assert [r.offset for r in await db.read_key(b"k3", shard=0)] == list(range(3, end, 50))
        assert await db.offset_for_time(0, TS0 + 10_000) == end
        assert db.leader_epochs(0) == ([(0, 0), (2, 400)] if end > 400 else [(0, 0)])
        assert db.end_offset_for_epoch(0, 2) == ((2, end) if end > 400 else (-1, -1))
        return end


def test_truncate_refuses_concurrent_truncation_and_bad_offsets(run, tmp_path: Path) -> None:
    async def main() -> None:
        async with seglog.open(tmp_path / "a") as store:
            db = await store.create_db("r", shards=2)
            for k in range(10):
                await db.append(_records(10, k * 10), shard=1)
            with pytest.raises(seglog.OffsetOutOfRange):
                await db.truncate_to(1, 101)
            with pytest.raises(seglog.InvalidArgument):
                await db.truncate_to(5, 0)
            # gather starts the first, which marks the shard before its first await.
            first, second = await asyncio.gather(
                db.truncate_to(1, 50), db.truncate_to(1, 10), return_exceptions=True
            )
            assert first == 50 and isinstance(second, BusyResourceError)
            cut, appended = await asyncio.gather(
                db.truncate_to(1, 40), db.append(_records(1), shard=1), return_exceptions=True
            )
            assert cut == 40 and isinstance(appended, BusyResourceError)  # refused, not interleaved
            assert db.end_offset(1) == 40
            assert await db.truncate_to(1, 40) == 40  # at the end: nothing to do
            assert await db.truncate_to(1, 0) == 0
            assert db.end_offset(1) == 0 and await db.read(1, 0) == []

    run(main())


async def _append_epoch(
    db: seglog.Database, records: list[seglog.Record], epoch: int, shard: int = 0
) -> None:
    await db.append(records, shard=shard, leader_epoch=epoch)


def test_leader_epochs_travel_with_frames_and_answer_like_kafka(run, tmp_path: Path) -> None:
    async def main() -> None:
        async with seglog.open(tmp_path / "a") as a, seglog.open(tmp_path / "b") as b:
            da = await a.create_db("r", shards=1)
            dbb = await b.create_db("r", shards=1)
            await da.append(_records(100))
            assert da.leader_epochs(0) == [] and da.end_offset_for_epoch(0, 0) == (0, 100)
            await _append_epoch(da, _records(100, 100), 3)
            await _append_epoch(da, _records(50, 200), 5)
            assert da.leader_epochs(0) == [(0, 0), (3, 100), (5, 200)]
            data = await da.read_frames(0, 0, max_bytes=1 << 20)
            assert [parse_header(data, p).leader_epoch for p in _positions(data)] == [0, 3, 5]
            await dbb.append_frames(0, data, expected_base=0)
            assert dbb.leader_epochs(0) == [(0, 0), (3, 100), (5, 200)]
            for epoch, answer in (
                (0, (0, 100)),
                (1, (0, 100)),
                (3, (3, 200)),
                (4, (3, 200)),
                (5, (5, 250)),
                (6, (-1, -1)),
            ):
                assert dbb.end_offset_for_epoch(0, epoch) == answer, epoch
            assert await dbb.truncate_to(0, 150) == 100  # frames of 100 and 50 records
            assert dbb.leader_epochs(0) == [(0, 0)]
            assert dbb.end_offset_for_epoch(0, 0) == (0, 100)
            assert dbb.end_offset_for_epoch(0, 3) == (-1, -1)  # above the latest epoch (Kafka)
        async with seglog.open(tmp_path / "a") as a:  # persisted
            da = await a.open_db("r")
            assert da.leader_epochs(0) == [(0, 0), (3, 100), (5, 200)]

    run(main())


def _positions(data: bytes) -> list[int]:
    out, pos = [], 0
    while pos < len(data):
        out.append(pos)
        pos += parse_header(data, pos).size
    return out


def test_epoch_of_journalled_rows_survives_sigkill_and_a_lost_cache_is_rebuilt(run, tmp_path: Path) -> None:
    data = tmp_path / "data"

    async def create() -> None:
        async with seglog.open(data) as store:
            db = await store.create_db("r", shards=4)
            await db.append(_records(40))

    run(create())
    proc = subprocess.run(
        [sys.executable, "-m", "tests.replica_child", "epoch", str(data), "7"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -9 and "appended" in proc.stdout, proc.stderr

    async def verify() -> list[list[tuple[int, int]]]:
        async with seglog.open(data) as store:
            db = await store.open_db("r")
            caches = []
            for shard in range(4):
                frames = await db.read_frames(shard, 0, max_bytes=1 << 20)
                epochs = [parse_header(frames, p).leader_epoch for p in _positions(frames)]
                assert epochs[-1] == 7 and set(epochs) <= {0, 7}  # the journal kept the epoch
                caches.append(db.leader_epochs(shard))
                first7 = next(
                    parse_header(frames, p).base_offset
                    for p in _positions(frames)
                    if parse_header(frames, p).leader_epoch == 7
                )
                assert db.end_offset_for_epoch(shard, 6) == (0, first7)
            return caches

    caches = run(verify())
    for shard_dir in sorted((data / "dbs" / "r").glob("shard-*")):
        (shard_dir / "leader-epoch-checkpoint").unlink()  # lost: rebuilt from the frames
    assert run(verify()) == caches


def test_high_watermark_moves_up_caps_reads_guards_truncation_and_persists(run, tmp_path: Path) -> None:
    async def main() -> None:
        async with seglog.open(tmp_path / "a") as store:
            db = await store.create_db("r", shards=1)
            for k in range(10):
                await db.append(_records(10, k * 10))
            assert db.high_watermark(0) == 0
            assert db.update_high_watermark(0, 60) and not db.update_high_watermark(0, 50)
            with pytest.raises(seglog.OffsetOutOfRange):
                db.update_high_watermark(0, 101)
            capped = await db.read_arrow(0, 40, 1000, upper=db.high_watermark(0))
            assert capped.column("offset").to_pylist() == list(range(40, 60))
            assert [r.offset for r in await db.read(0, 55, upper=60)] == list(range(55, 60))
            assert await db.read(0, 70, upper=60) == []  # at or past the cap: nothing yet
            with pytest.raises(seglog.OffsetOutOfRange):
                await db.read(0, 101, upper=60)
            with pytest.raises(InvalidArgument, match="high watermark"):
                await db.truncate_to(0, 50)
            assert await db.truncate_to(0, 70) == 70
        async with seglog.open(tmp_path / "a") as store:
            db = await store.open_db("r")
            assert db.high_watermark(0) == 60  # written at close
            assert await db.truncate_to(0, 30, force=True) == 30
            assert db.high_watermark(0) == 30
        async with seglog.open(tmp_path / "a") as store:
            db = await store.open_db("r")
            assert db.high_watermark(0) == 30 and db.end_offset(0) == 30

    run(main())


def test_recovery_reports_its_cause(tmp_path: Path) -> None:
    from seglog.record import encode_frame, records_to_batch
    from seglog.segment import open_shard_log
    from seglog.segment.log_loader import RecoveryCause

    def opened() -> tuple[seglog.segment.ShardLog, seglog.segment.RecoveryReport]:
        return open_shard_log(tmp_path / "s", segment_bytes=1 << 20, segment_ms=1 << 40, clock_ms=lambda: 0)

    log_, report = opened()
    assert report.cause is None and not report.cut
    for k in range(3):
        log_.append([encode_frame(records_to_batch(_records(10, k * 10)), k * 10)])
    log_.close()
    log_, report = opened()
    assert report.cause is None and log_.next_offset == 30
    seg = log_.active
    bounds = [pos for pos, _ in seg.headers()]
    log_.marker.publish(20, 0, bounds[2], fenced=True)  # a fence at the third frame
    log_.close()
    log_, report = opened()
    assert report.cause is RecoveryCause.FENCED and log_.next_offset == 20
    path = log_.active.path
    log_.close()
    with open(path, "r+b") as f:  # garble the second frame's body
        f.seek(bounds[1] + 80)
        f.write(b"\xff\xfe")
    log_, report = opened()
    assert report.cause is RecoveryCause.BAD_FRAME and log_.next_offset == 10
    log_.close()


def test_buffered_rows_keep_the_epoch_they_were_appended_with(run, tmp_path: Path) -> None:
    """Rows of many-shard appends wait in memory; rows of two epochs never share a frame."""

    async def main() -> None:
        async with seglog.open(tmp_path / "a", buffer_ms=3_600_000) as store:
            db = await store.create_db("r", shards=4)
            first = [
                seglog.Record(topic="t", value=b"one-%d" % i, key=b"k%d" % i, ts=TS0 + i) for i in range(200)
            ]
            second = [
                seglog.Record(topic="t", value=b"two-%d" % i, key=b"k%d" % i, ts=TS0 + i) for i in range(200)
            ]
            third = [
                seglog.Record(topic="t", value=b"three-%d" % i, key=b"k%d" % i, ts=TS0 + i)
                for i in range(200)
            ]
            await db.append(first, leader_epoch=1)
            # Likely in one drain: two epochs in one worker batch.
            await asyncio.gather(db.append(second, leader_epoch=2), db.append(third, leader_epoch=3))
            for shard in range(4):
                data = await db.read_frames(shard, 0, max_bytes=1 << 30)
                for pos in _positions(data):
                    h = parse_header(data, pos)
                    values = {
                        r.value.split(b"-")[0] for r in await db.read(shard, h.base_offset, h.record_count)
                    }
                    assert values == {{1: b"one", 2: b"two", 3: b"three"}[h.leader_epoch]}, (shard, h)
                assert [e for e, _ in db.leader_epochs(shard)] == [1, 2, 3]

    run(main())


def test_a_tailing_reader_of_frames_reads_what_the_log_holds_after_rolls_cuts_and_seeks(
    run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read from where the last one ended is one pread from the position it ended at (not
    an index lookup and header scan): its answer must stay the log's after the segment rolls,
    the log is cut back to that offset and written again, or another offset is asked."""
    import seglog.engines.segment as segment_engine

    tail_reads = 0
    real_read_tail = segment_engine._read_tail

    def counting(*args: Any) -> bytes | None:
        nonlocal tail_reads
        got = real_read_tail(*args)
        tail_reads += got is not None
        return got

    monkeypatch.setattr(segment_engine, "_read_tail", counting)

    async def main() -> None:
        async with seglog.open(tmp_path / "a") as store:
            db = await store.create_db("r", shards=1, segment_bytes=8192)
            s = db._engine._shards[0]  # white box: the read-end hint

            async def read(offset: int, max_bytes: int = 1 << 20) -> bytes:
                got = await db.read_frames(0, offset, max_bytes)
                hints, s.read_ends = s.read_ends, ()
                try:  # the general path's answer
                    assert got == await db.read_frames(0, offset, max_bytes)
                finally:
                    s.read_ends = hints
                return got

            pos = 0
            for k in range(30):  # frames of 50 records; segments roll every few
                await db.append(_records(50, k * 50), shard=0)
                pos = _frame_bounds(await read(pos))[-1][1]
            assert pos == 1500 and tail_reads >= 10  # not right after a roll
            before = tail_reads
            await db.append(_records(100, 1500, prefix=b"old"), shard=0)
            assert await db.truncate_to(0, pos, force=True) == pos  # cut back to the reader
            await db.append(_records(20, 1500, prefix=b"new"), shard=0)
            data = await read(pos)
            assert _frame_bounds(data) == [(1500, 1520)]
            assert seglog.record.decode_frames(data).column("value")[0].as_py() == b"new-1500"
            await db.append(_records(20, 1520), shard=0)
            assert _frame_bounds(await read(1510)) == [(1500, 1520), (1520, 1540)]  # mid-frame
            for k in range(3):
                await db.append(_records(20, 1540 + k * 20), shard=0)
            assert _frame_bounds(await read(1540, max_bytes=1)) == [(1540, 1560)]  # one frame
            assert _frame_bounds(await read(1560)) == [(1560, 1580), (1580, 1600)]
            assert tail_reads > before

    run(main())


class _CountingExecutor(ThreadPoolExecutor):
    """A real thread pool that remembers the functions it was given."""

    def __init__(self) -> None:
        super().__init__(2, thread_name_prefix="test-read")
        self.calls: list[Callable[..., Any]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.calls.append(getattr(fn, "func", fn))  # functools.partial: the function inside
        return super().submit(fn, *args, **kwargs)


def test_a_replication_rounds_frames_are_checked_on_the_loop_a_catch_ups_in_a_thread(
    run, tmp_path: Path
) -> None:
    """A follower's tail round (a few KiB) is parsed and CRC-checked without the hop to a
    thread and back (one wake-up less on the acks="all" path); more than
    ``_INLINE_PARSE_BYTES`` goes to a thread. Both paths check the same way."""
    from seglog.engines.frames import parse_frames
    from seglog.engines.segment import _INLINE_PARSE_BYTES

    async def main() -> None:
        async with seglog.open(tmp_path / "a") as a, seglog.open(tmp_path / "b") as b:
            da = await a.create_db("r", shards=1)
            await da.append(_records(50), shard=0)
            big = [seglog.Record("dev/big", b"x" * 1000, key=b"k%d" % i, ts=TS0 + i) for i in range(400)]
            await da.append(big, shard=0)
            counting = _CountingExecutor()
            # The engine opened next works through it (the store shuts it down at close).
            original, b._executor = b._executor, counting
            db_ = await b.create_db("r", shards=1)
            small = await da.read_frames(0, 0, max_bytes=1)  # the first frame alone
            assert 0 < len(small) <= _INLINE_PARSE_BYTES
            bad = bytearray(small)
            bad[-1] ^= 0x01
            with pytest.raises(CorruptFrame):  # checked all the same on the loop
                await db_.append_frames(0, bytes(bad), expected_base=0)
            assert db_.end_offset(0) == 0
            assert await db_.append_frames(0, small, expected_base=0) == 50
            assert parse_frames not in counting.calls
            large = await da.read_frames(0, 50, max_bytes=1 << 20)
            assert len(large) > _INLINE_PARSE_BYTES
            assert await db_.append_frames(0, large, expected_base=50) == 450
            assert parse_frames in counting.calls
            assert await _all_frames(db_, 0) == await _all_frames(da, 0)
        assert original is not None
        original.shutdown()

    run(main())


def test_followers_tailing_a_leader_each_read_on_the_loop_with_a_follower_sized_max_bytes(
    run, tmp_path: Path
) -> None:
    """Two followers and a consumer tail one shard at their own offsets, asking for up to
    4 MiB as followers do: once each has read, each next read continues where its own last
    one ended, is answered on the loop (no hop to a thread on the acks="all" round), and
    is the log's answer; a tail past ``_INLINE_READ_BYTES`` still goes to a thread."""
    from seglog.engines.segment import _INLINE_READ_BYTES, SegmentEngine

    follower_bytes = 4 << 20
    assert follower_bytes > _INLINE_READ_BYTES

    async def main() -> None:
        async with seglog.open(tmp_path / "a") as store:
            counting = _CountingExecutor()
            original, store._executor = store._executor, counting  # the engine opened next uses it
            db = await store.create_db("r", shards=1)
            s = db._engine._shards[0]  # white box: the read-end hints
            ends = {"f1": 0, "f2": 0, "consumer": 0}

            async def tail(reader: str) -> None:
                got = await db.read_frames(0, ends[reader], follower_bytes)
                hints, s.read_ends = s.read_ends, ()
                try:  # the general path's answer (inline: max_bytes within the bound)
                    expected = await db.read_frames(0, ends[reader], _INLINE_READ_BYTES)
                    assert got.startswith(expected)
                    assert got == expected or len(got) > _INLINE_READ_BYTES  # the bound cut it
                finally:
                    s.read_ends = hints
                ends[reader] = _frame_bounds(got)[-1][1]

            await db.append(_records(50), shard=0)
            for reader in ends:  # first reads: the general way (in a thread) sets the hints
                await tail(reader)
            counting.calls.clear()
            for k in range(1, 20):
                await db.append(_records(50, k * 50), shard=0)
                await tail("f1")
                await tail("f2")
                if k % 3 == 0:  # the consumer lags and catches up: its own position
                    await tail("consumer")
            assert SegmentEngine.read_frames_blocking not in [
                getattr(c, "__func__", c) for c in counting.calls
            ]
            assert ends == {"f1": 1000, "f2": 1000, "consumer": 950}
            big = [seglog.Record("dev/big", b"x" * 4000, ts=TS0 + i) for i in range(400)]  # 1.6 MB
            for i in range(0, 400, 100):
                await db.append(big[i : i + 100], shard=0)
            await tail("f1")  # more than the inline bound behind: a thread reads it
            assert SegmentEngine.read_frames_blocking in [getattr(c, "__func__", c) for c in counting.calls]
        original.shutdown()

    run(main())
