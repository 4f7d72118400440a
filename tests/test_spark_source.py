"""The ``seglog`` PySpark data source, S3A reads from MinIO, and the demo pipeline.

All tests share one SparkSession (the ``spark`` fixture): JVM start-up dominates.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

import seglog
from seglog import Record
from seglog.spark.pipeline import site_minute_stats, write_site_minute_chart
from seglog.tiering import LocalTarget, Manifest, TierTarget, open_target, upload_segment
from seglog.tiering.parquet import ROW_GROUP_ROWS
from seglog.topics import DEFAULT_LTS_THRESHOLDS, topic_matches
from tests.tier_fixtures import MinioServer, make_segment_table

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.slow

DB = "demo"
TS0 = 1_700_000_040_000_000  # a whole minute, in µs
SHARDS = 3
SEGMENTS = 3
ROWS = 200  # per segment; one record per second


def ts_literal(offset_s: int) -> str:
    when = dt.datetime.fromtimestamp(TS0 / 1e6 + offset_s, tz=dt.UTC)
    return f"TIMESTAMP '{when:%Y-%m-%d %H:%M:%S}+00:00'"


def fill_tier(target: TierTarget) -> dict[tuple[int, int], str]:
    """Tiers SHARDS x SEGMENTS segments; returns {(shard, segment): key}."""
    manifest = Manifest.load(target, DB)
    keys = {}
    for shard in range(SHARDS):
        for seg in range(SEGMENTS):
            table = make_segment_table(seg * ROWS, ROWS, ts0_us=TS0 + seg * ROWS * 1_000_000)
            keys[shard, seg] = upload_segment(target, manifest, shard, table).key
    return keys


@pytest.fixture(scope="module")
def local_tier(tmp_path_factory: pytest.TempPathFactory) -> tuple[LocalTarget, dict[Any, str]]:
    target = LocalTarget(tmp_path_factory.mktemp("spark") / "tier")
    return target, fill_tier(target)


def rows_of(df: DataFrame) -> list[tuple[Any, ...]]:
    """Collects rows as plain tuples sorted by (shard, offset); maps -> sorted items."""
    out = []
    for r in df.collect():
        d = r.asDict()
        d["headers"] = None if d["headers"] is None else sorted(d["headers"].items())
        out.append(tuple(d[c] for c in df.columns))
    shard_i, offset_i = df.columns.index("shard"), df.columns.index("offset")
    return sorted(out, key=lambda t: (t[shard_i], t[offset_i]))


def seglog_df(spark: SparkSession, root: str, **options: str) -> DataFrame:
    reader = spark.read.format("seglog").option("root", root).option("db", DB)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def test_source_equals_plain_parquet(
    spark: SparkSession, local_tier: tuple[LocalTarget, dict[Any, str]], tmp_path: Path
) -> None:
    target, keys = local_tier
    log = tmp_path / "opened.log"
    ours = seglog_df(spark, target.uri, open_log=str(log))
    plain = spark.read.parquet(target.url(DB))
    assert ours.schema == plain.schema
    ours_rows = rows_of(ours)
    assert len(ours_rows) == SHARDS * SEGMENTS * ROWS
    assert ours_rows == rows_of(plain)
    assert sorted(log.read_text().split()) == sorted(keys.values())
    assert ours.rdd.getNumPartitions() == len(keys)  # one Spark partition per object
    empty = spark.read.format("seglog").option("root", target.uri).option("db", "nope").load()
    assert empty.count() == 0


# (SQL filter, segments expected to be opened as (shard, segment) pairs)
PUSHDOWN_CASES = [
    ("shard = 1", {(1, s) for s in range(SEGMENTS)}),
    ("shard = 2 AND offset >= 250 AND offset < 420", {(2, 1), (2, 2)}),
    (f"ts >= {ts_literal(450)}", {(sh, 2) for sh in range(SHARDS)}),
    (f"ts < {ts_literal(100)} AND shard > 0", {(1, 0), (2, 0)}),
    ("shard IN (0, 2) AND offset = 5", {(0, 0), (2, 0)}),
    (f"ts IN ({ts_literal(5)}, {ts_literal(405)}) AND shard = 0", {(0, 0), (0, 2)}),
    (f"ts = {ts_literal(250)}", {(sh, 1) for sh in range(SHARDS)}),
    ("offset IN (5, 405) AND shard <= 0", {(0, 0), (0, 2)}),
    ("topic LIKE 'sensors/so%' AND offset <= 100", {(sh, 0) for sh in range(SHARDS)}),
    (
        "topic = 'sensors/north/dev1/temp' AND offset BETWEEN 199 AND 200",
        {(sh, s) for sh in range(SHARDS) for s in (0, 1)},
    ),
    ("topic > 'sensors/s' AND shard = 0", {(0, s) for s in range(SEGMENTS)}),
    ("offset > 100000", set()),
]


def test_pushdown_prunes_objects(
    spark: SparkSession, local_tier: tuple[LocalTarget, dict[Any, str]], tmp_path: Path
) -> None:
    target, keys = local_tier
    plain = spark.read.parquet(target.url(DB))
    for i, (where, expected) in enumerate(PUSHDOWN_CASES):
        log = tmp_path / f"opened-{i}.log"
        log.touch()
        df = seglog_df(spark, target.uri, open_log=str(log)).where(where)
        got = rows_of(df)
        assert got == rows_of(plain.where(where)), where
        opened = sorted(log.read_text().split())
        assert opened == sorted(keys[k] for k in expected), where
        # Every filter was taken by the source: Spark plans no Filter of its own.
        plan = df._jdf.queryExecution().executedPlan().toString()
        assert " Filter " not in plan, (where, plan)


def test_not_pushed_filters_still_apply(
    spark: SparkSession, local_tier: tuple[LocalTarget, dict[Any, str]]
) -> None:
    target, _ = local_tier
    where = "NOT (shard = 1) AND (offset < 4 OR offset > 596) AND key IS NOT NULL"
    df = seglog_df(spark, target.uri).where(where)
    got = rows_of(df)
    assert got == rows_of(spark.read.parquet(target.url(DB)).where(where))
    # Records with offset % 3 == 0 have a key.
    assert [(r[-1], r[0]) for r in got] == [(0, 0), (0, 3), (0, 597), (2, 0), (2, 3), (2, 597)]
    assert " Filter " in df._jdf.queryExecution().executedPlan().toString()


def test_mqtt_filter(spark: SparkSession, local_tier: tuple[LocalTarget, dict[Any, str]]) -> None:
    target, _ = local_tier
    all_rows = rows_of(spark.read.parquet(target.url(DB)))
    topic_i = 2
    for mqtt_filter in ["sensors/+/dev1/#", "sensors/south/+/hum", "#", "$SYS/#", "+/+", "none"]:
        got = rows_of(seglog_df(spark, target.uri, mqtt_filter=mqtt_filter))
        expected = [r for r in all_rows if topic_matches(mqtt_filter, r[topic_i])]
        assert got == expected, mqtt_filter
    assert not any(r[topic_i].startswith("$") for r in rows_of(seglog_df(spark, target.uri, mqtt_filter="#")))
    with pytest.raises(Exception, match="InvalidTopicFilter"):
        seglog_df(spark, target.uri, mqtt_filter="sensors/#/x").count()


def test_s3a_parquet_and_source_on_minio(
    spark: SparkSession, minio: MinioServer, bucket: str, tmp_path: Path
) -> None:
    target = open_target(
        f"s3://{bucket}/tier",
        s3_endpoint=minio.endpoint,
        access_key=minio.access_key,
        secret_key=minio.secret_key,
    )
    keys = fill_tier(target)
    assert target.url(DB) == f"s3a://{bucket}/tier/{DB}"
    plain = spark.read.parquet(target.url(DB))
    plain_rows = rows_of(plain)
    assert len(plain_rows) == SHARDS * SEGMENTS * ROWS
    log = tmp_path / "opened.log"
    ours = seglog_df(
        spark,
        target.uri,
        endpoint=minio.endpoint,
        access_key=minio.access_key,
        secret_key=minio.secret_key,
        open_log=str(log),
    )
    assert rows_of(ours) == plain_rows
    assert sorted(log.read_text().split()) == sorted(keys.values())
    pruned = ours.where("shard = 0 AND offset >= 400")
    assert rows_of(pruned) == rows_of(plain.where("shard = 0 AND offset >= 400"))


def test_pipeline_and_chart(
    spark: SparkSession, local_tier: tuple[LocalTarget, dict[Any, str]], tmp_path: Path
) -> None:
    target, _ = local_tier
    stats = site_minute_stats(spark, target.uri, DB)
    assert stats.column_names == ["site", "minute", "messages", "avg_value", "max_value"]

    # The same numbers computed in plain Python from the parquet rows.
    table = pa.concat_tables(
        make_segment_table(seg * ROWS, ROWS, ts0_us=TS0 + seg * ROWS * 1_000_000)
        for _ in range(SHARDS)
        for seg in range(SEGMENTS)
    )
    groups: dict[tuple[str, int], list[float]] = defaultdict(list)
    for r in table.to_pylist():
        if topic_matches("sensors/+/+/+", r["topic"]):
            minute = r["ts"] // 60_000_000 * 60_000_000
            groups[r["topic"].split("/")[1], minute].append(float(r["value"]))
    got = stats.to_pylist()
    assert len(got) == len(groups)
    for row in got:
        minute_us = int(row["minute"].timestamp()) * 1_000_000
        values = groups[row["site"], minute_us]
        assert row["messages"] == len(values)
        assert math.isclose(row["avg_value"], sum(values) / len(values))
        assert row["max_value"] == max(values)
    assert [(r["site"], r["minute"]) for r in got] == sorted((r["site"], r["minute"]) for r in got)

    png = write_site_minute_chart(stats, tmp_path / "chart.png")
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000


def test_source_honours_the_retention_floor(spark: SparkSession, tmp_path: Path) -> None:
    """Objects wholly below a shard's log start are not opened; a straddling one is cut at it."""
    target = LocalTarget(tmp_path / "tier")
    keys = fill_tier(target)
    manifest = Manifest.load(target, DB)
    floor = ROWS + 17  # inside shard 1's second object
    assert manifest.raise_log_start(1, floor)
    manifest.save(target)
    log = tmp_path / "opened.log"
    df = seglog_df(spark, target.uri, open_log=str(log))
    got = sorted((r["shard"], r["offset"]) for r in df.select("shard", "offset").collect())
    want = sorted((s, o) for s in range(SHARDS) for o in range(SEGMENTS * ROWS) if s != 1 or o >= floor)
    assert got == want
    assert keys[1, 0] not in log.read_text().split()


def test_unknown_option_is_rejected_with_the_valid_ones(
    spark: SparkSession, local_tier: tuple[LocalTarget, dict[Any, str]]
) -> None:
    target, _ = local_tier
    # A misspelt S3 option used to be ignored (and the public AWS endpoint used instead).
    with pytest.raises(Exception, match="s3_endpoint") as ei:
        seglog_df(spark, target.uri, s3_endpoint="http://127.0.0.1:9").collect()
    assert "valid options: root, db, mqtt_filter, endpoint" in str(ei.value)


# --- topic filters through streams --------------------------------------------------------

PHASE_ROWS = ROW_GROUP_ROWS  # one Parquet row group per phase of the workload


def stream_workload() -> list[Record]:
    """Three bursts, one per fleet and metric, each a row group of one shard's object."""
    out = []
    for phase, (fleet, metric) in enumerate((("a", "temp"), ("b", "rpm"), ("c", "temp"))):
        t0 = TS0 + phase * PHASE_ROWS
        out += [
            Record(f"fleet/{fleet}/dev{i % 40}/{metric}", b"%d" % i, ts=t0 + i) for i in range(PHASE_ROWS)
        ]
    return out


def tier_workload(
    tmp_path: Path, db_name: str, *, streams: bool, tier_uri: str | None = None, **s3: str
) -> str:
    """Writes :func:`stream_workload` to a one-shard database, seals and tiers it; the tier URI.

    The tier is a local directory unless ``tier_uri`` (with ``s3_endpoint`` etc.) names one.
    """
    tier_uri = tier_uri or f"file://{tmp_path / 'tier'}"

    async def write() -> None:
        async with seglog.open(tmp_path / "data", tier=tier_uri, fsync="never", **s3) as store:  # type: ignore[arg-type]
            db = await store.create_db(
                db_name, shards=1, lts_thresholds=DEFAULT_LTS_THRESHOLDS if streams else None
            )
            records = stream_workload()
            for k in range(0, len(records), 8192):
                await db.append(records[k : k + 8192])
            await db.seal()
            assert len(await db.tier_now()) == 1

    asyncio.run(write())
    return tier_uri


def scanned(log: Path) -> tuple[int, int, int]:
    """(row groups decoded, row groups in the objects, rows decoded) from a ``scan_log``."""
    lines = [line.split() for line in log.read_text().splitlines()]
    return tuple(sum(int(parts[k]) for parts in lines) for k in (1, 2, 3))  # type: ignore[return-value]


def test_mqtt_filter_prunes_row_groups_by_stream(spark: SparkSession, tmp_path: Path) -> None:
    tier_uri = tier_workload(tmp_path, "fleet", streams=True)
    all_rows = [
        (r["offset"], r["topic"], r["stream"])
        for r in spark.read.format("seglog").option("root", tier_uri).option("db", "fleet").load().collect()
    ]
    assert len(all_rows) == 3 * PHASE_ROWS and len({s for _, _, s in all_rows}) > 3

    def read(log: Path, **options: str) -> DataFrame:
        reader = spark.read.format("seglog").option("root", tier_uri).option("db", "fleet")
        for k, v in {"scan_log": str(log), **options}.items():
            reader = reader.option(k, v)
        return reader.load()

    for k, mqtt_filter in enumerate(["fleet/b/+/rpm", "fleet/+/dev7/temp", "fleet/a/dev3/#", "+/c/#"]):
        log = tmp_path / f"scan{k}.log"
        got = sorted((r["offset"], r["topic"]) for r in read(log, mqtt_filter=mqtt_filter).collect())
        expected = sorted((o, t) for o, t, _ in all_rows if topic_matches(mqtt_filter, t))
        assert got == expected and expected, mqtt_filter
        groups, total, rows = scanned(log)
        assert total == 3, mqtt_filter
        # Streams of fleets the filter cannot match are never decoded: one burst, or two of
        # the three for dev7/temp (fleets a and c).
        assert groups == (2 if "dev7" in mqtt_filter else 1), mqtt_filter
        assert rows == groups * PHASE_ROWS, mqtt_filter
    # Pushed-down topic equality prunes the same way (a topic name is its own filter).
    log = tmp_path / "eq.log"
    got = read(log).filter("topic = 'fleet/b/dev5/rpm'").select("offset").collect()
    assert sorted(r["offset"] for r in got) == sorted(o for o, t, _ in all_rows if t == "fleet/b/dev5/rpm")
    assert scanned(log)[:2] == (1, 3)
    # No topic condition: everything is decoded.
    log = tmp_path / "all.log"
    assert read(log).count() == 3 * PHASE_ROWS and scanned(log) == (3, 3, 3 * PHASE_ROWS)


def test_mqtt_filter_without_streams_filters_rows(spark: SparkSession, tmp_path: Path) -> None:
    tier_uri = tier_workload(tmp_path, "plain", streams=False)
    log = tmp_path / "scan.log"
    df = (
        spark.read.format("seglog")
        .option("root", tier_uri)
        .option("db", "plain")
        .option("mqtt_filter", "fleet/b/+/rpm")
        .option("scan_log", str(log))
        .load()
    )
    got = sorted(r["offset"] for r in df.select("offset").collect())
    assert got == list(range(PHASE_ROWS, 2 * PHASE_ROWS))
    assert scanned(log) == (3, 3, 3 * PHASE_ROWS)  # no stream metadata: every row group is read


def test_mqtt_filter_prunes_row_groups_on_minio(
    spark: SparkSession, minio: MinioServer, bucket: str, tmp_path: Path
) -> None:
    endpoint, access_key, secret_key = minio
    tier_uri = tier_workload(
        tmp_path,
        DB,
        streams=True,
        tier_uri=f"s3://{bucket}/tier",
        s3_endpoint=endpoint,
        s3_access_key=access_key,
        s3_secret_key=secret_key,
    )
    log = tmp_path / "scan.log"
    df = seglog_df(
        spark,
        tier_uri,
        endpoint=endpoint,
        access_key=access_key,
        secret_key=secret_key,
        mqtt_filter="fleet/b/+/rpm",
        scan_log=str(log),
    )
    assert sorted(r["offset"] for r in df.select("offset").collect()) == list(
        range(PHASE_ROWS, 2 * PHASE_ROWS)
    )
    assert scanned(log) == (1, 3, PHASE_ROWS)
