"""A frame's index tags: its distinct stream ids ascending, or the mixed tag past the cap."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from seglog.engines.segment import _MIXED as MIXED
from seglog.engines.segment import MAX_FRAME_TAGS, _frame_tags


@pytest.fixture(params=["compiled", "numpy"])
def tag_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways of finding a frame's streams: the compiled module's and NumPy's."""
    from seglog.topics import streams

    if request.param == "numpy":
        monkeypatch.setattr(streams, "_topic_cache", None)
    else:
        assert streams._topic_cache is not None, "the compiled module is not built"
    return str(request.param)


@pytest.mark.parametrize("span", [1, 2, 17, 4095, 4096, 100_000, 1 << 31])
def test_tags_are_the_distinct_streams_whatever_their_span(span: int, tag_path: str) -> None:
    rng = np.random.default_rng(span)
    for _ in range(300):
        lo = int(rng.integers(0, (1 << 32) - span))
        streams = (lo + rng.integers(0, span, int(rng.integers(1, 400)))).astype(np.uint32)
        want = np.unique(streams)
        if len(want) > MAX_FRAME_TAGS:
            want = MIXED
        got = _frame_tags(pa.record_batch({"stream": pa.array(streams)}))
        assert got.dtype == np.uint32 and np.array_equal(got, want)


@pytest.mark.parametrize("distinct", [1, 2, MAX_FRAME_TAGS - 1, MAX_FRAME_TAGS, MAX_FRAME_TAGS + 1, 40])
def test_tags_at_and_past_the_cap_in_runs_and_shuffled(distinct: int, tag_path: str) -> None:
    """Rows drawn from ``distinct`` ids anywhere in uint32, in runs (sorted) and shuffled:
    up to the cap the ids come back ascending, past it the mixed tag."""
    rng = np.random.default_rng(distinct)
    for _ in range(100):
        pool = rng.choice(1 << 32, distinct, replace=False).astype(np.uint32)
        streams = np.concatenate([pool, rng.choice(pool, int(rng.integers(0, 500)))])
        want = MIXED if distinct > MAX_FRAME_TAGS else np.sort(pool)
        for order in (np.sort(streams), rng.permutation(streams)):
            got = _frame_tags(pa.record_batch({"stream": pa.array(order)}))
            assert got.dtype == np.uint32 and np.array_equal(got, want)


def test_a_frame_of_stream_zero_and_one_with_nulls() -> None:
    assert _frame_tags(pa.record_batch({"stream": pa.array(np.zeros(5, np.uint32))})).tolist() == [0]
    nulls = pa.array([3, None, 1, 3], pa.uint32())
    assert _frame_tags(pa.record_batch({"stream": nulls})).tolist() == [1, 3]


def test_the_shared_zero_streams_column_is_known_without_reading_it() -> None:
    """What ``zero_streams`` hands out (and slices of it) is recognised as all zeros; anything
    else, zeros included, is read — so a stamped column reusing no shared buffer is never
    mistaken for stream 0."""
    from seglog.record import is_zero_streams, zero_streams

    shared = zero_streams(1000)
    assert is_zero_streams(shared) and is_zero_streams(shared.slice(300, 10))
    assert not is_zero_streams(pa.array(np.zeros(1000, np.uint32)))
    stamped = pa.array(np.array([3, 1, 3], np.uint32))
    assert not is_zero_streams(stamped)
    assert np.array_equal(_frame_tags(pa.record_batch({"stream": shared})), [0])
    assert np.array_equal(_frame_tags(pa.record_batch({"stream": stamped})), [1, 3])
    longer = zero_streams(200_000)  # outgrows the shared array: a new one is built
    assert is_zero_streams(longer) and not is_zero_streams(shared)
    assert np.array_equal(_frame_tags(pa.record_batch({"stream": shared})), [0])
