"""Key summaries of many frames computed at once are those of one frame at a time."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from seglog.index.keys import MAX_INLINE_KEY_BYTES, DistinctKeys, distinct_keys, distinct_keys_many


def _column(rng: np.random.Generator, n: int, *, long_keys: bool) -> pa.Array:
    """Keys of a frame: repeats, nulls (sometimes all), empty keys, as a slice of a bigger array."""
    nulls = float(rng.choice([0.0, 0.2, 1.0], p=[0.5, 0.4, 0.1]))
    keys: list[bytes | None] = []
    for _ in range(n):
        if rng.random() < nulls:
            keys.append(None)
        elif long_keys and rng.random() < 0.05:
            keys.append(b"L" * (MAX_INLINE_KEY_BYTES + int(rng.integers(1, 50))))
        else:
            keys.append(b"k%d" % int(rng.integers(0, 30)) if rng.random() < 0.95 else b"")
    pad = int(rng.integers(0, 3))
    return pa.array([b"x"] * pad + keys + [b"y"] * pad, pa.binary()).slice(pad, n)


def _same(a: DistinctKeys | None, b: DistinctKeys | None) -> None:
    if a is None or b is None:
        assert a is b
        return
    assert a.offsets.dtype == b.offsets.dtype and np.array_equal(a.offsets, b.offsets)
    assert a.data == b.data


@pytest.mark.parametrize("seed", range(60))
def test_many_frames_at_once_match_one_frame_at_a_time(seed: int) -> None:
    rng = np.random.default_rng(seed)
    columns = [
        _column(rng, int(rng.integers(0, 40)), long_keys=seed % 6 == 0)
        for _ in range(int(rng.integers(1, 70)))
    ]
    got = distinct_keys_many(columns)
    assert len(got) == len(columns)
    for column, summary in zip(columns, got, strict=True):
        _same(summary, distinct_keys(column))


def test_other_key_types_are_summarized_as_one_frame_does() -> None:
    columns = [pa.array([b"a", None, b"b", b"a"], pa.large_binary())] * 5 + [pa.array([b"c"], pa.binary())]
    for column, summary in zip(columns, distinct_keys_many(columns), strict=True):
        _same(summary, distinct_keys(column))
