"""A frame's index tags: its distinct stream ids ascending, or the mixed tag past the cap."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from seglog.engines.segment import _MIXED as MIXED
from seglog.engines.segment import MAX_FRAME_TAGS, _frame_tags


@pytest.mark.parametrize("span", [1, 2, 17, 4095, 4096, 100_000, 1 << 31])
def test_tags_are_the_distinct_streams_whatever_their_span(span: int) -> None:
    rng = np.random.default_rng(span)
    for _ in range(300):
        lo = int(rng.integers(0, (1 << 32) - span))
        streams = (lo + rng.integers(0, span, int(rng.integers(1, 400)))).astype(np.uint32)
        want = np.unique(streams)
        if len(want) > MAX_FRAME_TAGS:
            want = MIXED
        got = _frame_tags(pa.record_batch({"stream": pa.array(streams)}))
        assert got.dtype == np.uint32 and np.array_equal(got, want)


def test_a_frame_of_stream_zero_and_one_with_nulls() -> None:
    assert _frame_tags(pa.record_batch({"stream": pa.array(np.zeros(5, np.uint32))})).tolist() == [0]
    nulls = pa.array([3, None, 1, 3], pa.uint32())
    assert _frame_tags(pa.record_batch({"stream": nulls})).tolist() == [1, 3]
