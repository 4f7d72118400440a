"""Frames of many shards encoded at once are byte for byte those encoded one shard at a time."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from seglog.engines.frames import encode_rows, encode_shard_rows
from seglog.record import (
    COMPRESSION_NONE,
    COMPRESSION_ZSTD,
    FRAME_SCHEMA,
    EncodedFrame,
    encode_frame,
    encode_frames,
    null_headers,
)
from seglog.segment.producer_state import ProducerColumns


def _batch(rng: np.random.Generator, n: int, *, streams: int, big_values: bool = False) -> pa.RecordBatch:
    """``n`` rows of FRAME_SCHEMA with random timestamps, keys (some null), values and streams."""
    sizes = rng.integers(0, 3000 if big_values else 40, n)
    data = rng.integers(0, 256, int(sizes.sum()), dtype=np.uint8)
    offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int32)
    value = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    keys = [None if k < 0 else b"k%d" % k for k in rng.integers(-2, 50, n).tolist()]
    # Runs of one stream, long or short, so the one-shard path cuts some shards at stream changes.
    stream = np.repeat(rng.integers(0, streams, n), rng.integers(1, 200, n))[:n].astype(np.uint32)
    columns = {
        "ts": pa.array(rng.integers(-(2**40), 2**40, n), pa.int64()),
        "topic": pa.array([f"t/{t}" for t in rng.integers(0, 5, n).tolist()], pa.string()),
        "key": pa.array(keys, pa.binary()),
        "value": value,
        "headers": null_headers(n),
        "stream": pa.array(stream, pa.uint32()),
    }
    return pa.RecordBatch.from_arrays(list(columns.values()), schema=FRAME_SCHEMA)


def _stamps(rng: np.random.Generator, n: int) -> ProducerColumns:
    """Producer fields in runs: some rows without a producer, sequences that skip now and then."""
    pid = np.repeat(rng.integers(-1, 3, n), rng.integers(1, 30, n))[:n].astype(np.int64)
    epoch = np.repeat(rng.integers(0, 2, n), rng.integers(5, 60, n))[:n].astype(np.int16)
    seq = (np.cumsum(rng.integers(1, 3, n) * (rng.random(n) < 0.1) + 1) + 100).astype(np.int32)
    return ProducerColumns(pid, epoch, seq)


def _same(a: list[EncodedFrame], b: list[EncodedFrame]) -> None:
    assert [f.header for f in a] == [f.header for f in b]
    assert [b"".join(bytes(x) for x in f.buffers) for f in a] == [
        b"".join(bytes(x) for x in f.buffers) for f in b
    ]


@pytest.mark.parametrize("seed", range(40))
def test_many_shards_at_once_match_one_shard_at_a_time(seed: int) -> None:
    rng = np.random.default_rng(seed)
    shards = int(rng.integers(1, 20))
    # Mostly a tailed flush's few rows per shard; some seeds long enough to be cut.
    top = 300 if seed % 4 == 0 else 40
    counts = rng.integers(1, top, shards)
    n = int(counts.sum())
    rows = _batch(rng, n, streams=3 if seed % 2 else 1, big_values=seed % 10 == 5)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    offsets = rng.integers(0, 2**40, shards).tolist()
    stamps = _stamps(rng, n) if seed % 3 else None
    compression = COMPRESSION_ZSTD if seed % 5 == 1 else COMPRESSION_NONE
    epoch = int(rng.integers(0, 9))
    # Small bounds (cut frames, the one-shard path) only in some seeds: most take the batched path.
    choices = [2_000, 30_000, 1 << 30] if seed % 4 == 0 else [1 << 30]
    frame_bytes = [None if seed % 7 == 0 else int(rng.choice(choices)) for _ in range(shards)]
    got = encode_shard_rows(
        rows,
        starts,
        counts,
        offsets,
        stamps,
        compression=compression,
        leader_epoch=epoch,
        frame_bytes=frame_bytes,
    )
    assert len(got) == shards
    for i in range(shards):
        a, c = int(starts[i]), int(counts[i])
        want_frames, want_batches = encode_rows(
            rows.slice(a, c),
            offsets[i],
            None if stamps is None else stamps.slice(a, a + c),
            compression=compression,
            leader_epoch=epoch,
            frame_bytes=frame_bytes[i],
        )
        frames, batches = got[i]
        _same(frames, want_frames)
        assert [b.to_pylist() for b in batches] == [b.to_pylist() for b in want_batches]


@pytest.mark.parametrize("seed", range(20))
def test_encode_frames_matches_encode_frame_on_any_slices(seed: int) -> None:
    """Slices that overlap, leave gaps or come out of order, with and without producers."""
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(1, 400))
    batch = _batch(rng, n, streams=4)
    k = int(rng.integers(1, 12))
    starts = rng.integers(0, n, k)
    lengths = np.array([int(rng.integers(1, n - s + 1)) for s in starts.tolist()])
    bases = rng.integers(0, 2**50, k).tolist()
    producers = [
        None
        if rng.random() < 0.3
        else (int(rng.integers(0, 2**40)), int(rng.integers(0, 99)), int(rng.integers(0, 2**30)))
        for _ in range(k)
    ]
    compression = COMPRESSION_ZSTD if seed % 3 == 0 else COMPRESSION_NONE
    got = encode_frames(
        batch,
        starts.tolist(),
        lengths.tolist(),
        bases,
        compression=compression,
        leader_epoch=3,
        producers=producers,
    )
    want = [
        encode_frame(batch.slice(a, b), base, compression=compression, leader_epoch=3, producer=p)
        for a, b, base, p in zip(starts.tolist(), lengths.tolist(), bases, producers, strict=True)
    ]
    _same(got, want)


def test_a_headers_column_that_carries_its_parents_children_is_compacted_as_one_frame_does() -> None:
    rng = np.random.default_rng(1)
    batch = _batch(rng, 300, streams=1)
    # pa.nulls makes a map column with one child entry per row: a slice would carry them all.
    batch = batch.set_column(
        4, FRAME_SCHEMA.field("headers"), pa.nulls(300, FRAME_SCHEMA.field("headers").type)
    )
    got = encode_frames(batch, [0, 100, 250], [100, 150, 50], [5, 105, 255])
    want = [
        encode_frame(batch.slice(a, b), base) for a, b, base in ((0, 100, 5), (100, 150, 105), (250, 50, 255))
    ]
    _same(got, want)
