"""Buffered rows of many-shard appends: kept per request (not per shard), read and flushed exactly."""

from __future__ import annotations

import gc
import random
from pathlib import Path

import numpy as np
import pyarrow as pa

import seglog
from seglog.engines.pending_rows import PendingPart, PendingRows, ShardArrays
from seglog.record import FRAME_SCHEMA, HEADERS_TYPE, encode_frame, records_to_batch
from seglog.segment.producer_state import ProducerColumns
from tests.helpers import read_all


def _part(shards: list[int], arrays: ShardArrays, tag: int) -> PendingPart:
    """A request of rows for ``shards`` (one row per entry, in that order), offsets assigned."""
    routes = np.array(shards, np.int32)
    offsets = np.empty(len(routes), np.int64)
    for i, s in enumerate(shards):
        offsets[i] = arrays.next_offsets[s]
        arrays.next_offsets[s] += 1
    batch = records_to_batch(
        [
            seglog.Record(topic="t", value=b"%d-%d-%d" % (tag, s, o), key=b"k")
            for s, o in zip(shards, offsets, strict=True)
        ]
    )
    ids, first = np.unique(routes, return_index=True)
    counts = np.bincount(routes, minlength=int(ids.max()) + 1)[ids]
    # Every third request is an idempotent producer's (producer id = its tag, sequence =
    # 1000 * tag + its row): the fields must follow their rows through collect's sort.
    n = len(routes)
    stamps = (
        ProducerColumns(
            np.full(n, tag, np.int64), np.zeros(n, np.int16), (1000 * tag + np.arange(n)).astype(np.int32)
        )
        if tag % 3 == 0
        else None
    )
    return PendingPart.make(
        batch, routes, offsets, ids.astype(np.int64), offsets[first], counts.astype(np.int64), stamps
    )


def _values(batch: pa.RecordBatch) -> list[bytes]:
    return [v for v in batch.column("value").to_pylist()]


def test_snapshot_and_collect_return_each_shards_rows_in_offset_order() -> None:
    rng = random.Random(7)
    arrays = ShardArrays.zeros(8)
    pending = PendingRows(arrays, np.arange(8, dtype=np.int64))
    expected: dict[int, list[bytes]] = {s: [] for s in range(8)}
    expected_pids: dict[int, list[int]] = {s: [] for s in range(8)}
    expected_seqs: dict[int, list[int]] = {s: [] for s in range(8)}
    for tag in range(30):
        shards = [rng.randrange(8) for _ in range(rng.randrange(2, 40))]
        part = _part(shards, arrays, tag)
        pending.add(part)
        for i, (s, o) in enumerate(zip(shards, part.offset_col.tolist(), strict=True)):
            expected[s].append(b"%d-%d-%d" % (tag, s, o))
            expected_pids[s].append(tag if tag % 3 == 0 else -1)
            expected_seqs[s].append(1000 * tag + i if tag % 3 == 0 else -1)
    assert pending.count == sum(1 for v in expected.values() if v)
    for s in range(8):
        stop = int(arrays.durable_ends[s])
        assert stop == len(expected[s])
        start, parts = pending.snapshot(s, stop)
        assert start == 0
        assert [v for _, b in parts for v in _values(b)] == expected[s]
        # From a recent offset only the parts reaching it come back; their rows stay exact.
        lower = max(0, stop - 3)
        _, recent = pending.snapshot(s, stop, lower)
        got = [(base + i, v) for base, b in recent for i, v in enumerate(_values(b))]
        assert [v for o, v in got if o >= lower] == expected[s][lower:]
        assert len(recent) <= len(parts)
    # Flush shard 3 alone, then everything: shard 3's rows are not collected twice.
    three = pending.collect(np.array([3]), np.array([0]))
    assert _values(three[0][0]) == expected[3]
    pending.done(3)
    rest = [s for s in range(8) if s != 3 and expected[s]]
    batches = pending.collect(np.array(rest), np.zeros(len(rest), np.int64))
    for s, (b, stamps) in zip(rest, batches, strict=True):
        assert _values(b) == expected[s]
        assert stamps is not None
        assert stamps.pid.tolist() == expected_pids[s] and stamps.seq.tolist() == expected_seqs[s]
        pending.done(s)
    assert pending.count == 0 and pending.nbytes == 0 and pending.since is None
    assert pending.snapshot(0, 10) == (10, [])


def test_buffered_appends_do_not_keep_python_objects_per_shard(tmp_path: Path, run) -> None:
    """Objects the collector tracks grow with the appends, not with appends x shards touched."""

    async def main() -> None:
        async with seglog.open(tmp_path / "data", buffer_ms=3_600_000) as store:
            db = await store.create_db("t", shards=1024)
            table = records_to_batch(
                [seglog.Record(topic="t", value=b"v" * 20, key=b"device-%05d" % i) for i in range(4096)]
            )
            await db.append_arrow(table)  # warm-up: caches, first requests
            gc.collect()
            before = len(gc.get_objects())
            for _ in range(20):
                await db.append_arrow(table)  # ~1000 shards each
            gc.collect()
            grown = len(gc.get_objects()) - before
            assert grown < 20 * 50, f"{grown} tracked objects for 20 appends over ~1000 shards each"
            # And the rows are all there, read from the buffer before any flush.
            assert db._engine._writers[0]._pending.count > 1000  # type: ignore[attr-defined]
            total = sum(db.end_offset(s) for s in range(1024))
            assert total == 21 * 4096
            rows = await read_all(db, 5)
            assert len(rows) == db.end_offset(5) and all(r.shard == 5 for r in rows)

    run(main())


def test_frames_cut_from_a_large_batch_carry_only_their_rows() -> None:
    """A slice of a batch whose all-null headers came from pa.nulls serialises compactly."""
    records = [seglog.Record(topic="t", value=b"x" * 100, key=b"k") for _ in range(20_000)]
    batch = records_to_batch(records)
    foreign = batch.set_column(
        FRAME_SCHEMA.get_field_index("headers"), FRAME_SCHEMA.field("headers"), pa.nulls(20_000, HEADERS_TYPE)
    )
    whole = encode_frame(batch.slice(0, 200), 0).size
    for source in (batch, foreign):
        frame = encode_frame(source.slice(5000, 200), 5000)
        assert frame.size <= whole + 64, frame.size  # not the parent's 20,000 rows of offsets


def test_shard_numbers_fit_the_16_bit_sort_keys() -> None:
    """Appends and flushes sort shard numbers as int16 (numpy's radix sort): every shard fits."""
    from seglog.db_config import MAX_SHARDS

    assert np.iinfo(np.int16).max >= MAX_SHARDS - 1
