"""Timestamps: µs since 1970 in a configurable sane range, datetimes accepted, stamping rule."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pytest

import seglog
from seglog import errors
from tests.helpers import T0, segment_files

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
NOW_US = 1_767_225_600_000_000


@pytest.mark.parametrize(
    ("ts", "unit"),
    [
        (NOW_US // 1000, "milliseconds"),
        (NOW_US // 1_000_000, "seconds"),
        (NOW_US * 1000, "nanoseconds"),
        (-5, "negative"),
    ],
)
def test_out_of_range_ts_names_the_likely_unit_and_writes_nothing(
    run, data_dir: Path, ts: int, unit: str
) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t")
            good = [seglog.Record(topic="a", value=b"v", ts=T0) for _ in range(3)]
            with pytest.raises(errors.InvalidTimestamp) as ei:
                await db.append([*good, seglog.Record(topic="a", value=b"v", ts=ts)])
            assert isinstance(ei.value, errors.InvalidRecord) and ei.value.index == 3
            msg = str(ei.value)
            assert unit in msg and f"ts {ts} " in msg and "2000-01-01" in msg and "2200-01-01" in msg
            with pytest.raises(errors.InvalidTimestamp, match=unit):
                await db.append_arrow(
                    pa.table(
                        {"ts": pa.array([T0, ts], pa.int64()), "topic": ["a", "a"], "value": [b"x", b"y"]}
                    )
                )
            assert db.end_offset(0) == 0
            assert all(f.stat().st_size == 0 for f in segment_files(data_dir, "t", 0))

    run(main())


def test_range_is_configurable_and_persisted(run, data_dir: Path) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", min_ts_us=None, max_ts_us=None)
            await db.append([seglog.Record(topic="a", value=b"v", ts=5)])
            await db.configure(min_ts_us=0, max_ts_us=10)
            with pytest.raises(errors.InvalidTimestamp):
                await db.append([seglog.Record(topic="a", value=b"v", ts=11)])
            with pytest.raises(errors.InvalidArgument):
                await db.configure(min_ts_us=20, max_ts_us=10)
            with pytest.raises(errors.InvalidArgument):
                await store.create_db("u", min_ts_us="2000")
        async with seglog.open(data_dir) as store:
            db = await store.open_db("t")
            assert (db.config.min_ts_us, db.config.max_ts_us) == (0, 10)
            assert seglog.DbConfig().min_ts_us == 946_684_800_000_000
            assert seglog.DbConfig().max_ts_us == 7_258_118_400_000_000

    run(main())


def test_datetimes_are_accepted_wherever_a_time_is_taken(run, data_dir: Path) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", shards=1)
            moments = [NOW + dt.timedelta(seconds=i) for i in range(5)]
            metas = await db.append(
                [seglog.Record(topic="a", value=b"%d" % i, ts=m) for i, m in enumerate(moments)]
            )
            assert metas.timestamps.tolist() == [NOW_US + i * 1_000_000 for i in range(5)]
            assert await db.offset_for_time(0, NOW + dt.timedelta(seconds=2)) == 2
            # Naive datetimes are UTC.
            assert await db.offset_for_time(0, dt.datetime(2026, 1, 1, 0, 0, 3)) == 3
            with pytest.raises(errors.InvalidArgument, match="datetime"):
                await db.offset_for_time(0, "2026-01-01")  # type: ignore[arg-type]
            # Arrow timestamps of any unit are converted to µs.
            table = pa.table(
                {
                    "ts": pa.array([NOW_US // 1000 + 10_000], pa.timestamp("ms", tz="UTC")),
                    "topic": ["a"],
                    "value": [b"arrow"],
                }
            )
            await db.append_arrow(table)
            rec = (await db.read(0, 5, 1))[0]
            assert rec.ts == NOW_US + 10_000_000 and rec.value == b"arrow"
            # A datetime assigned after construction is converted at append too.
            late = seglog.Record(topic="a", value=b"late")
            late.ts = NOW  # type: ignore[assignment]
            m = await db.append(late)
            assert m[0].ts == NOW_US
        async with seglog.follow(data_dir, "t", 0, from_time_us=NOW + dt.timedelta(seconds=4)) as f:
            table = await f.read_available()
            assert table.column("offset").to_pylist()[0] == 4

    run(main())


def test_records_without_ts_are_stamped_with_increasing_microseconds(run, data_dir: Path) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", shards=3)
            before = seglog.now_us()
            metas = await db.append([seglog.Record(topic=f"t/{i % 7}", value=b"v") for i in range(10_000)])
            after = seglog.now_us()
            ts = metas.timestamps.tolist()
            assert before <= ts[0] <= after
            assert ts == list(range(ts[0], ts[0] + 10_000))  # input order, 1 µs apart
            table = await db.append_arrow(pa.table({"topic": ["a"] * 1000, "value": [b"v"] * 1000}))
            assert table.num_rows == 1000
            got = [r.ts for s in range(3) for r in await db.read(s, 0, 20_000) if r.topic == "a"]
            assert sorted(got) == list(range(min(got), min(got) + 1000))

    run(main())
