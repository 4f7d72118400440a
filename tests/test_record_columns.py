"""The compiled Record conversion (``seglog._columns``) gives exactly the Python path's batches and errors."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import seglog.record as record_module
from seglog.errors import InvalidRecord
from seglog.record import Record, records_to_batch

DEFAULT_TS = 1_700_000_000_000_000


def fast_and_slow(convert: Callable[[], Any]) -> tuple[Any, Any]:
    """``convert()`` with the compiled module and without it: each result or the exception
    raised, as (class, message, index)."""

    def run() -> Any:
        try:
            return convert()
        except InvalidRecord as exc:
            return (type(exc), str(exc), exc.index)

    fast = run()
    saved = record_module._columns
    record_module._columns = None
    try:
        slow = run()
    finally:
        record_module._columns = saved
    return fast, slow


def both(records: Any, **kw: Any) -> tuple[Any, Any]:
    """``records_to_batch`` through the compiled pass and through the Python path."""
    return fast_and_slow(lambda: records_to_batch(records, default_ts_us=DEFAULT_TS, **kw))


def same(fast: Any, slow: Any) -> None:
    if isinstance(fast, pa.RecordBatch):
        assert isinstance(slow, pa.RecordBatch)
        assert fast.schema == slow.schema
        assert fast.equals(slow)
    else:
        assert fast == slow


def test_the_extension_is_built() -> None:
    assert record_module._columns is not None, (
        "seglog._columns was not built (python setup.py build_ext --inplace)"
    )


def test_the_compiled_pass_takes_the_plain_case() -> None:
    recs = [Record("a/b", b"v", key=b"k" if i % 2 else None, ts=DEFAULT_TS + i) for i in range(10)]
    got = record_module._columns.gather(recs, Record, 65535, 1 << 20, -(1 << 63), (1 << 63) - 1)
    assert got is not None and got[7] == 5  # five null keys
    same(*both(recs))


topics = st.text(st.characters(codec="utf-8", exclude_characters="+#\x00"), min_size=1, max_size=20)
records_st = st.lists(
    st.builds(
        Record,
        topics,
        st.binary(max_size=40),
        ts=st.one_of(st.none(), st.integers(DEFAULT_TS - 10**9, DEFAULT_TS + 10**9)),
        key=st.one_of(st.none(), st.binary(max_size=12)),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(records_st, st.integers(0, 3))
def test_random_records_convert_alike(records: list[Record], stream: int) -> None:
    same(*both(records, stream=stream))
    same(*both(tuple(records), stream=stream))


class MyRecord(Record):
    __slots__ = ()


class MyBytes(bytes):
    pass


@pytest.mark.parametrize(
    "bad",
    [
        Record("a/+/b", b"v"),
        Record("a/#", b"v"),
        Record("a\x00b", b"v"),
        Record("", b"v"),
        Record("t" * 65536, b"v"),
        Record("a", b"x" * 101),  # max_record_bytes=100 below
        Record("a", b"v", ts=1),  # out of the default range
        Record("a", b"v", ts=True),  # type: ignore[arg-type]
        Record("a", b"v", ts=2**70),
        Record("a", "text"),  # type: ignore[arg-type]
        Record("a", b"v", key="k"),  # type: ignore[arg-type]
        Record(b"a", b"v"),  # type: ignore[arg-type]
        Record("a\udc80", b"v"),  # not encodable as UTF-8
        ("a", b"v"),
    ],
)
def test_invalid_records_raise_what_the_python_path_raises(bad: Any) -> None:
    records = [Record("ok/1", b"v", ts=DEFAULT_TS)] * 3 + [bad] + [Record("ok/2", b"w")]
    fast, slow = both(
        records,
        max_record_bytes=100,
        min_ts_us=record_module.DEFAULT_MIN_TS_US,
        max_ts_us=record_module.DEFAULT_MAX_TS_US,
    )
    assert not isinstance(fast, pa.RecordBatch)
    assert fast == slow


@pytest.mark.parametrize(
    "odd",
    [
        Record("a", b"v", headers={"h": b"1"}),
        Record("a", b"v", ts=dt.datetime(2024, 1, 2, tzinfo=dt.UTC)),
        MyRecord("a", b"v", ts=DEFAULT_TS),
        Record("a", MyBytes(b"v"), key=MyBytes(b"k")),
        Record("a", b""),
        Record("é/ü", b"v"),
    ],
)
def test_valid_records_off_the_plain_case_convert_alike(odd: Any) -> None:
    same(*both([Record("ok", b"v", ts=DEFAULT_TS + 5), odd, Record("ok", b"w")]))


def both_arrow(table: pa.Table, **kw: Any) -> tuple[Any, Any]:
    """``table_to_batch`` with the compiled checks and with the NumPy ones."""
    return fast_and_slow(lambda: record_module.table_to_batch(table, **kw))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.text(st.characters(codec="utf-8"), min_size=0, max_size=8), min_size=1, max_size=40),
    st.lists(st.integers(-(2**62), 2**62), min_size=1, max_size=40),
    st.integers(0, 10),
    st.integers(0, 5),
)
def test_arrow_checks_agree_with_numpy(topics: list[str], ts: list[int], cut: int, max_value: int) -> None:
    n = min(len(topics), len(ts))
    table = pa.table(
        {
            "ts": pa.array(ts[:n], pa.int64()),
            "topic": pa.array(topics[:n], pa.string()),
            "value": pa.array([b"x" * (i % 7) for i in range(n)], pa.binary()),
        }
    )
    bounds = {"min_ts_us": -(2**61), "max_ts_us": 2**61, "max_record_bytes": max_value}
    same(*both_arrow(table, **bounds))
    sliced = table.slice(min(cut, n - 1))  # arrays with an offset into their buffers
    same(*both_arrow(sliced, **bounds))


def test_the_compiled_arrow_checks_pass_good_columns_and_refuse_bad_ones() -> None:
    cols = record_module._columns
    assert cols is not None

    def topics_ok(topics: list[str], max_bytes: int = 65535) -> bool:
        arr = pa.array(topics, pa.string()).slice(1)  # an offset into the buffers, as slices have
        _, offsets, data = arr.buffers()
        view = memoryview(offsets)[arr.offset * 4 : (arr.offset + len(arr) + 1) * 4]
        return cols.check_topics(view, data, len(arr), max_bytes)

    assert topics_ok(["x+", "a/b", "é/c", "d"])  # the bad row before the slice is not looked at
    for bad in (["x", "a/+"], ["x", "#"], ["x", "a\x00"], ["x", "ok", ""]):
        assert not topics_ok(bad), bad
    assert not topics_ok(["x", "abcd"], max_bytes=3)
    ts = pa.array([5, 10, 20], pa.int64())
    assert cols.ts_in_range(ts.buffers()[1], 3, 5, 20)
    assert not cols.ts_in_range(ts.buffers()[1], 3, 6, 20)
    assert not cols.ts_in_range(ts.buffers()[1], 3, 5, 19)
