"""Every schema of stored records is derived from ``FRAME_SCHEMA`` (plus the offset)."""

from __future__ import annotations

import pyarrow as pa

from seglog.engines.base import READ_SCHEMA as ENGINE_READ_SCHEMA
from seglog.record import FRAME_SCHEMA, OFFSET_FIELD, READ_SCHEMA
from seglog.tiering.parquet import SEGMENT_SCHEMA, TIER_SCHEMA


def test_read_and_segment_schemas_are_offset_plus_frame_schema() -> None:
    assert list(READ_SCHEMA) == [OFFSET_FIELD, *FRAME_SCHEMA]
    assert ENGINE_READ_SCHEMA is READ_SCHEMA
    assert SEGMENT_SCHEMA is READ_SCHEMA


def test_tier_schema_differs_only_in_the_ts_type() -> None:
    assert TIER_SCHEMA.names == READ_SCHEMA.names
    for tier, read in zip(TIER_SCHEMA, READ_SCHEMA, strict=True):
        if tier.name == "ts":
            assert tier.type == pa.timestamp("us", tz="UTC")
            assert tier.nullable == read.nullable
        else:
            assert tier.equals(read)


def test_spark_source_columns_follow_the_tier_schema() -> None:
    from seglog.spark import source

    names = [col.split(" ", 1)[0] for col in source.SOURCE_SCHEMA_DDL.split(", ")]
    assert names == [*TIER_SCHEMA.names, "shard"]
    assert source.SOURCE_SCHEMA_DDL == (
        "offset bigint, ts timestamp, topic string, key binary, value binary, "
        "headers map<string,binary>, stream bigint, shard int"
    )
    not_null = {f.name for f in TIER_SCHEMA if not f.nullable} | {"shard"}
    assert {(name,) for name in not_null} == source._NON_NULL_PATHS
