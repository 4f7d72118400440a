"""The replica-log operations on every engine: same frames, same answers, same errors.

Frames are the same bytes on every engine, so they ship between databases of one engine
and across engines; truncation, leader epochs and the high watermark follow one set of rules.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import seglog
import seglog.record
from seglog.errors import BusyResourceError, CorruptFrame, InvalidArgument, OffsetMismatch
from seglog.record import parse_header
from tests.helpers import read_all

TS0 = 1_700_000_000_000_000
ENGINES = ["segment", "lmdb", "memory"]
DURABLE = ["segment", "lmdb"]
# (leader engine, follower engine): each engine with itself, and across engines both ways.
PAIRS = [*((e, e) for e in ENGINES), ("segment", "lmdb"), ("lmdb", "segment"), ("memory", "lmdb")]


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


def _epochs_in(data: bytes) -> list[int]:
    out, pos = [], 0
    while pos < len(data):
        h = parse_header(data, pos)
        out.append(h.leader_epoch)
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


async def _append_epoch(
    db: seglog.Database, records: list[seglog.Record], epoch: int, shard: int = 0
) -> None:
    await db.append(records, shard=shard, leader_epoch=epoch)


async def _ship(src: seglog.Database, dst: seglog.Database, shard: int, max_bytes: int = 5000) -> None:
    offset = dst.end_offset(shard)
    while offset < src.end_offset(shard):
        chunk = await src.read_frames(shard, offset, max_bytes=max_bytes)
        offset = await dst.append_frames(shard, chunk, expected_base=offset)


@pytest.mark.parametrize(("leader", "follower"), PAIRS)
def test_frames_shipped_byte_for_byte_answer_every_read_alike(
    run, tmp_path: Path, leader: str, follower: str
) -> None:
    async def main() -> None:
        async with seglog.open(tmp_path / "a") as a, seglog.open(tmp_path / "b") as b:
            da = await a.create_db("r", shards=4, engine=leader, segment_bytes=16384)
            dbb = await b.create_db("r", shards=4, engine=follower, segment_bytes=16384)
            for k in range(4):
                await da.append(_records(300, k * 300))
            await _append_epoch(da, _records(200, 5000), 3, shard=2)
            for shard in range(4):
                await _ship(da, dbb, shard)
                assert await _all_frames(dbb, shard) == await _all_frames(da, shard)
                assert dbb.leader_epochs(shard) == da.leader_epochs(shard)
                ra, rb = await read_all(da, shard), await read_all(dbb, shard)
                assert [(r.offset, r.key, r.value, r.ts) for r in ra] == [
                    (r.offset, r.key, r.value, r.ts) for r in rb
                ]
                for key in (b"k0", b"k7", b"k49", b"nope"):
                    ka = await da.read_key(key, shard=shard)
                    kb = await dbb.read_key(key, shard=shard)
                    assert [r.offset for r in ka] == [r.offset for r in kb]
                for ts in (TS0, TS0 + 333, TS0 + 5100, TS0 + 10**9):
                    assert await da.offset_for_time(shard, ts) == await dbb.offset_for_time(shard, ts)
            assert dbb.leader_epochs(2) == [(0, 0), (3, dbb.end_offset(2) - 200)]
            assert _epochs_in(await _all_frames(dbb, 2))[-1] == 3
        if follower in DURABLE:
            async with seglog.open(tmp_path / "b") as b:  # and after a reopen
                dbb = await b.open_db("r")
                assert sum(dbb.end_offset(s) for s in range(4)) == 1400
                assert dbb.leader_epochs(2) == [(0, 0), (3, dbb.end_offset(2) - 200)]

    run(main())


@pytest.mark.parametrize("engine", ENGINES)
def test_append_frames_rejects_gaps_overlaps_and_corruption_writing_nothing(
    run, tmp_path: Path, engine: str
) -> None:
    async def main() -> None:
        async with seglog.open(tmp_path / "a") as a, seglog.open(tmp_path / "b") as b:
            da = await a.create_db("r", shards=1, engine=engine)
            dbb = await b.create_db("r", shards=1, engine=engine)
            for k in range(3):
                await da.append(_records(100, k * 100))
            data = await da.read_frames(0, 0, max_bytes=1 << 20)
            assert _frame_bounds(data) == [(0, 100), (100, 200), (200, 300)]
            assert (
                await da.read_frames(0, 150, max_bytes=1)
                == data[parse_header(data, 0).size :][: parse_header(data, parse_header(data, 0).size).size]
            )  # from the frame holding 150, at least one frame
            assert await da.read_frames(0, 300, max_bytes=100) == b""
            with pytest.raises(seglog.OffsetOutOfRange):
                await da.read_frames(0, 301, max_bytes=100)
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
            assert [r.offset for r in await dbb.read_key(b"k1", shard=0)] == [1, 51]
            assert await dbb.append_frames(0, data[first:], expected_base=100) == 300
            assert await _all_frames(dbb, 0) == data
        if engine in DURABLE:
            async with seglog.open(tmp_path / "b") as b:
                dbb = await b.open_db("r")
                assert await _all_frames(dbb, 0) == data

    run(main())


@pytest.mark.parametrize("engine", ENGINES)
def test_truncate_to_cuts_at_a_frame_boundary_and_appends_continue(run, tmp_path: Path, engine: str) -> None:
    async def main() -> list[tuple[int, bytes]]:
        async with seglog.open(tmp_path / "a") as store:
            db = await store.create_db("r", shards=1, engine=engine, segment_bytes=8192)
            for k in range(20):
                await db.append(_records(50, k * 50))
            held = await db.read_arrow(0, 0, max_records=1000)
            assert await db.truncate_to(0, 275) == 250  # frames hold 50 records
            assert db.end_offset(0) == 250
            assert held.num_rows == 1000 and held.column("value")[999].as_py() == b"v-999"
            assert [r.offset for r in await db.read_key(b"k3", shard=0)] == list(range(3, 250, 50))
            assert await db.read_key(b"k0", shard=0) != []
            assert await db.offset_for_time(0, TS0 + 900) == 250
            assert await db.offset_for_time(0, TS0 + 120) == 120
            with pytest.raises(seglog.OffsetOutOfRange):
                await db.truncate_to(0, 251)
            assert await db.truncate_to(0, 250) == 250  # at the end: nothing to do
            assert await db.truncate_to(0, 200) == 200  # at a boundary: exactly there
            res = await db.append(_records(10, 3, prefix=b"new"), shard=0)
            assert res[0].offset == 200
            assert [r.offset for r in await db.read_key(b"k3", shard=0)] == [3, 53, 103, 153, 200]
            assert await db.offset_for_time(0, TS0 + 3) == 3
            rows = [(r.offset, r.value) for r in await read_all(db, 0)]
            assert len(rows) == 210 and rows[200] == (200, b"new-3")
            return rows

    before = run(main())

    if engine in DURABLE:

        async def reopen() -> None:
            async with seglog.open(tmp_path / "a") as store:
                db = await store.open_db("r")
                assert [(r.offset, r.value) for r in await read_all(db, 0)] == before
                assert [r.offset for r in await db.read_key(b"k3", shard=0)] == [3, 53, 103, 153, 200]

        run(reopen())


@pytest.mark.parametrize("engine", ENGINES)
def test_truncate_refuses_concurrent_truncation_appends_and_bad_offsets(
    run, tmp_path: Path, engine: str
) -> None:
    async def main() -> None:
        async with seglog.open(tmp_path / "a") as store:
            db = await store.create_db("r", shards=2, engine=engine)
            for k in range(10):
                await db.append(_records(10, k * 10), shard=1)
            with pytest.raises(seglog.OffsetOutOfRange):
                await db.truncate_to(1, 101)
            with pytest.raises(InvalidArgument):
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
            data = await db.read_frames(1, 30, max_bytes=1 << 20)
            cut, shipped = await asyncio.gather(
                db.truncate_to(1, 30), db.append_frames(1, data, expected_base=30), return_exceptions=True
            )
            # Refused while the cut runs, or (parsed off the loop, so it may finish after the
            # cut) appended at the new end: never interleaved with it.
            assert cut == 30 and (isinstance(shipped, BusyResourceError) or shipped == 40), shipped
            assert db.end_offset(1) == (30 if isinstance(shipped, BaseException) else 40)
            assert await db.truncate_to(1, 0) == 0
            assert db.end_offset(1) == 0 and await db.read(1, 0) == []
            assert (await db.append(_records(5), shard=1))[0].offset == 0
            assert db.end_offset(0) == 0 and await db.truncate_to(0, 0) == 0  # an empty shard

    run(main())


@pytest.mark.parametrize("engine", ENGINES)
def test_leader_epochs_answer_like_kafka_and_are_cut_with_the_log(run, tmp_path: Path, engine: str) -> None:
    async def main() -> None:
        async with seglog.open(tmp_path / "a") as a, seglog.open(tmp_path / "b") as b:
            da = await a.create_db("r", shards=1, engine=engine)
            dbb = await b.create_db("r", shards=1, engine=engine)
            await da.append(_records(100))
            assert da.leader_epochs(0) == []  # every frame has epoch 0
            assert da.end_offset_for_epoch(0, 0) == (0, 100) and da.end_offset_for_epoch(0, 2) == (-1, -1)
            await _append_epoch(da, _records(100, 100), 3)
            await _append_epoch(da, _records(50, 200), 5)
            await _append_epoch(da, _records(10, 250), 4)  # a stale leader's stamp records nothing
            assert da.leader_epochs(0) == [(0, 0), (3, 100), (5, 200)]
            with pytest.raises(InvalidArgument):
                await _append_epoch(da, _records(1), -1)
            data = await da.read_frames(0, 0, max_bytes=1 << 20)
            assert _epochs_in(data) == [0, 3, 5, 4]
            await dbb.append_frames(0, data, expected_base=0)
            assert dbb.leader_epochs(0) == [(0, 0), (3, 100), (5, 200)]
            for epoch, answer in (
                (0, (0, 100)),
                (1, (0, 100)),
                (3, (3, 200)),
                (4, (3, 200)),
                (5, (5, 260)),
                (6, (-1, -1)),
            ):
                assert dbb.end_offset_for_epoch(0, epoch) == answer, epoch
                assert da.end_offset_for_epoch(0, epoch) == answer, epoch
            # Kafka's UNDEFINED_EPOCH, below what Database accepts: the engines answer alike.
            assert dbb._engine.end_offset_for_epoch(0, -1) == (-1, -1)
            with pytest.raises(InvalidArgument):
                dbb._engine.end_offset_for_epoch(0, -2)
            assert await dbb.truncate_to(0, 150) == 100  # frames of 100 and 50 records
            assert dbb.leader_epochs(0) == [(0, 0)]
            assert dbb.end_offset_for_epoch(0, 0) == (0, 100)
            assert dbb.end_offset_for_epoch(0, 3) == (-1, -1)  # above the latest epoch (Kafka)
            await _append_epoch(dbb, _records(10, 100), 7)
            assert dbb.leader_epochs(0) == [(0, 0), (7, 100)]
            assert dbb.end_offset_for_epoch(0, 5) == (0, 100)
            # The start moving past whole epochs drops them (Kafka's truncateFromStart).
            await da.truncate_before(0, 220)
            assert da.leader_epochs(0) == [(5, 220)]
            assert da.end_offset_for_epoch(0, 3) == (3, 220)  # below the first entry (KIP-279)
            # An empty cache: a first epoch at the log start needs no epoch-0 entry.
            dc = await a.create_db("c", shards=1, engine=engine)
            await _append_epoch(dc, _records(5), 2)
            assert dc.leader_epochs(0) == [(2, 0)]
        if engine in DURABLE:
            async with seglog.open(tmp_path / "a") as a, seglog.open(tmp_path / "b") as b:
                da, dbb = await a.open_db("r"), await b.open_db("r")
                assert da.leader_epochs(0) == [(5, 220)]
                assert dbb.leader_epochs(0) == [(0, 0), (7, 100)]
                assert dbb.end_offset_for_epoch(0, 7) == (7, 110)

    run(main())


@pytest.mark.parametrize("engine", ENGINES)
def test_high_watermark_moves_up_caps_reads_and_guards_truncation(run, tmp_path: Path, engine: str) -> None:
    async def main() -> None:
        async with seglog.open(tmp_path / "a") as store:
            db = await store.create_db("r", shards=1, engine=engine)
            for k in range(10):
                await db.append(_records(10, k * 10))
            assert db.high_watermark(0) == 0
            assert db.update_high_watermark(0, 60) and not db.update_high_watermark(0, 50)
            assert not db.update_high_watermark(0, 60)
            with pytest.raises(seglog.OffsetOutOfRange):
                db.update_high_watermark(0, 101)
            assert db.high_watermark(0) == 60
            capped = await db._engine.read_arrow(0, 40, 1000, upper=db.high_watermark(0))
            assert capped.column("offset").to_pylist() == list(range(40, 60))
            assert (await db._engine.read_arrow(0, 60, 1000, upper=60)).num_rows == 0
            with pytest.raises(InvalidArgument, match="high watermark"):
                await db.truncate_to(0, 50)
            assert db.end_offset(0) == 100
            assert await db.truncate_to(0, 70) == 70
            assert db.high_watermark(0) == 60
            await db.append(_records(5, 70))  # a write after the move (lmdb: written with it)
        if engine not in DURABLE:
            return
        async with seglog.open(tmp_path / "a") as store:
            db = await store.open_db("r")
            assert db.high_watermark(0) == 60
            assert await db.truncate_to(0, 30, force=True) == 30
            assert db.high_watermark(0) == 30  # reset to the cut
            assert db.update_high_watermark(0, 30) is False
        async with seglog.open(tmp_path / "a") as store:
            db = await store.open_db("r")
            assert db.high_watermark(0) == 30 and db.end_offset(0) == 30
            assert db.update_high_watermark(0, 20) is False
            await db.append(_records(10, 30))
            assert db.update_high_watermark(0, 35)  # no write after it: written at close
        async with seglog.open(tmp_path / "a") as store:
            db = await store.open_db("r")
            assert db.high_watermark(0) == 35

    run(main())


def test_lmdb_keeps_frames_epochs_and_watermark_in_one_environment(run, tmp_path: Path) -> None:
    """No side files: the lmdb engine's replica state is in its environment, and survives reopen."""

    async def main() -> None:
        async with seglog.open(tmp_path / "a") as store:
            db = await store.create_db("r", shards=2, engine="lmdb")
            await db.append(_records(100), shard=1)
            await _append_epoch(db, _records(100, 100), 2, shard=1)
            db.update_high_watermark(1, 150)
            await _append_epoch(db, _records(100, 200), 3, shard=1)
            assert await db.truncate_to(1, 250, force=True) == 200
        assert not list(tmp_path.rglob("leader-epoch-checkpoint"))
        assert not list(tmp_path.rglob("*.log"))
        async with seglog.open(tmp_path / "a") as store:
            db = await store.open_db("r")
            assert db.leader_epochs(1) == [(0, 0), (2, 100)]
            assert db.high_watermark(1) == 150 and db.end_offset(1) == 200
            assert db.end_offset_for_epoch(1, 3) == (-1, -1)
            assert db.end_offset_for_epoch(1, 2) == (2, 200)
            assert db.leader_epochs(0) == [] and db.high_watermark(0) == 0

    run(main())
