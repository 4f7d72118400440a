"""``spark.read.format("seglog")``: a PySpark data source over a database's tiered objects.

Usage::

    seglog.spark.register(spark)
    df = (spark.read.format("seglog")
          .option("root", "s3://bucket/prefix")       # or file:///abs/dir
          .option("db", "mydb")
          .option("mqtt_filter", "sensors/+/x/#")      # optional
          .option("endpoint", "http://127.0.0.1:9000")  # S3 only, optional
          .option("access_key", "...").option("secret_key", "...")
          .load())

Options (any other name is rejected with the list of these, so a misspelt S3 option cannot
silently fall back to the public AWS endpoint):

``root`` (required; ``.load(uri)`` sets it too)
    The tier: ``file:///abs/dir`` or ``s3://bucket[/prefix]``.
``db`` (required)
    The database name.
``mqtt_filter``
    Keep rows whose topic matches this MQTT filter (``+``/``#`` wildcards).
``endpoint``, ``access_key``, ``secret_key``, ``region``
    S3 connection (MinIO: ``endpoint`` ``http://host:9000``). Unset ones come from the
    ``AWS_*`` environment of the executors / boto3's default chain.
``open_log``
    Test aid, see below.

Schema: the tier schema (``offset bigint, ts timestamp, topic string, key binary,
value binary, headers map<string,binary>, stream bigint``) plus ``shard int`` -- the same
columns, in the same order, as ``spark.read.parquet("<root>/<db>")`` (Spark has no uint32,
so ``stream`` is a bigint in both).

Planning reads the manifest and makes one Spark partition per committed object.
``pushFilters`` takes comparisons, ``=``, ``IN`` on ``shard``, ``offset`` and ``ts`` and
those plus ``LIKE 'prefix%'`` on ``topic``: objects whose manifest ranges cannot match are
never opened, and accepted filters are applied exactly to the rows read (row groups are
skipped by Parquet statistics), so Spark does not re-evaluate them. ``mqtt_filter`` keeps
rows whose topic matches with MQTT semantics, vectorised: a literal-prefix test, then an
anchored regular expression equivalent to :func:`seglog.topics.topic_matches`.

Each object's sha256 is checked against the manifest before it is decoded.

Option ``open_log`` (a local file path) makes every task append the key of each object it
opens, one per line: an honest count of objects touched, used by the tests.
"""

from __future__ import annotations

import datetime as dt
import io
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
    StringStartsWith,
)
from pyspark.sql.types import StructType

from seglog.errors import InvalidArgument
from seglog.record import HEADERS_TYPE
from seglog.tiering.manifest import Manifest, ManifestEntry
from seglog.tiering.parquet import TIER_SCHEMA
from seglog.tiering.targets import ObjectInfo, TierTarget, open_target, verify_bytes
from seglog.topics.filters import filter_literal_prefix, filter_to_regex, is_wildcard_filter

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "OPTIONS",
    "SOURCE_NAME",
    "SOURCE_SCHEMA_DDL",
    "SeglogDataSource",
    "SeglogPartition",
    "SeglogReader",
    "register",
]

SOURCE_NAME = "seglog"
_SHARD_FIELD = pa.field("shard", pa.int32(), nullable=False)
# Spark SQL types of the source's columns (Spark has no unsigned ints: ``stream`` widens).
_DDL_TYPES: dict[pa.DataType, str] = {
    pa.int32(): "int",
    pa.int64(): "bigint",
    pa.uint32(): "bigint",
    pa.timestamp("us", tz="UTC"): "timestamp",
    pa.string(): "string",
    pa.binary(): "binary",
    HEADERS_TYPE: "map<string,binary>",
}
SOURCE_SCHEMA_DDL = ", ".join(f"{f.name} {_DDL_TYPES[f.type]}" for f in [*TIER_SCHEMA, _SHARD_FIELD])
BATCH_ROWS = 64 * 1024
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)

# Pushed-down predicates in a picklable form: (column, op, value); ts values in µs.
_Predicate = tuple[str, str, Any]
_OPS: dict[type[Filter], str] = {
    EqualTo: "==",
    EqualNullSafe: "==",
    GreaterThan: ">",
    GreaterThanOrEqual: ">=",
    LessThan: "<",
    LessThanOrEqual: "<=",
    In: "in",
    StringStartsWith: "startswith",
}
_INT_COLUMNS = frozenset({"shard", "offset"})
_NON_NULL_PATHS = frozenset((f.name,) for f in [*TIER_SCHEMA, _SHARD_FIELD] if not f.nullable)


def register(spark: SparkSession) -> None:
    """Registers the ``seglog`` data source and enables Python filter pushdown."""
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    spark.dataSource.register(SeglogDataSource)


def _to_micros(value: Any) -> int | None:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:  # Spark sends aware UTC datetimes for TIMESTAMP
            return None
        return (value - _EPOCH) // dt.timedelta(microseconds=1)
    return None


def _literal(column: str, value: Any) -> Any | None:
    """Converts a pushed literal to our representation, or None if unsupported."""
    if column in _INT_COLUMNS:
        return value if type(value) is int else None
    if column == "ts":
        return _to_micros(value)
    if column == "topic":
        return value if isinstance(value, str) else None
    return None


def _translate(f: Filter) -> _Predicate | None:
    if isinstance(f, IsNotNull):
        # These columns are never null: the filter is always true.
        return ("", "notnull", None) if f.attribute in _NON_NULL_PATHS else None
    op = _OPS.get(type(f))
    if op is None:
        return None
    attribute: tuple[str, ...] = f.attribute  # type: ignore[attr-defined]
    if len(attribute) != 1:
        return None
    column = attribute[0]
    if column not in ("shard", "offset", "ts", "topic"):
        return None
    if op == "startswith" and column != "topic":
        return None
    raw: Any = f.value  # type: ignore[attr-defined]
    if op == "in":
        values = [_literal(column, v) for v in raw]
        if not values or any(v is None for v in values):
            return None
        return (column, op, tuple(values))
    value = _literal(column, raw)
    return None if value is None else (column, op, value)


def _interval(preds: Sequence[_Predicate], column: str) -> tuple[int | None, int | None, set[int] | None]:
    """Returns (lo, hi, allowed set) for an integer column, all bounds inclusive."""
    lo: int | None = None
    hi: int | None = None
    allowed: set[int] | None = None
    for col, op, value in preds:
        if col != column:
            continue
        if op == "==":
            value_set = {value}
        elif op == "in":
            value_set = set(value)
        else:
            value_set = None
            if op in (">", ">="):
                bound = value + 1 if op == ">" else value
                lo = bound if lo is None else max(lo, bound)
            else:
                bound = value - 1 if op == "<" else value
                hi = bound if hi is None else min(hi, bound)
        if value_set is not None:
            allowed = value_set if allowed is None else allowed & value_set
    return lo, hi, allowed


def _entry_may_match(entry: ManifestEntry, preds: Sequence[_Predicate]) -> bool:
    s_lo, s_hi, s_set = _interval(preds, "shard")
    if s_set is not None and entry.shard not in s_set:
        return False
    if (s_lo is not None and entry.shard < s_lo) or (s_hi is not None and entry.shard > s_hi):
        return False
    o_lo, o_hi, o_set = _interval(preds, "offset")
    if not entry.overlaps_offsets(o_lo, o_hi):
        return False
    if o_set is not None and not any(entry.base_offset <= o <= entry.end_offset for o in o_set):
        return False
    t_lo, t_hi, t_set = _interval(preds, "ts")
    if not entry.overlaps_time(t_lo, t_hi):
        return False
    return t_set is None or any(entry.min_ts <= t <= entry.max_ts for t in t_set)


def _row_expression(preds: Sequence[_Predicate]) -> pc.Expression | None:
    """Builds the pyarrow filter for the row-level (non-shard) predicates."""
    expr: pc.Expression | None = None
    for column, op, value in preds:
        if column in ("shard", ""):
            continue  # shard: exact at planning time; "": IS NOT NULL, always true
        col_type = TIER_SCHEMA.field(column).type
        conv: Any
        if op == "in":
            raw = pa.array(value, pa.int64()) if column == "ts" else pa.array(value)
            conv = raw.cast(col_type)
        elif column == "ts":
            conv = pa.scalar(value, pa.int64()).cast(col_type)
        else:
            conv = value
        field = pc.field(column)
        if op == "==":
            term = field == conv
        elif op == ">":
            term = field > conv
        elif op == ">=":
            term = field >= conv
        elif op == "<":
            term = field < conv
        elif op == "<=":
            term = field <= conv
        elif op == "in":
            term = field.isin(conv)
        else:  # startswith
            term = pc.starts_with(field, pattern=value)
        expr = term if expr is None else expr & term
    return expr


OPTIONS: tuple[str, ...] = (
    "root",
    "db",
    "mqtt_filter",
    "endpoint",
    "access_key",
    "secret_key",
    "region",
    "open_log",
)


@dataclass(frozen=True)
class _ReadOptions:
    root: str
    db: str
    mqtt_filter: str | None
    endpoint: str | None
    access_key: str | None
    secret_key: str | None
    region: str | None
    open_log: str | None

    @classmethod
    def parse(cls, options: Any) -> _ReadOptions:
        def opt(name: str) -> str | None:
            value = options.get(name)
            return str(value) if value not in (None, "") else None

        unknown = sorted({str(k).lower() for k in options} - set(OPTIONS) - {"path"})
        if unknown:
            raise InvalidArgument(
                f"unknown option(s) of the seglog source: {', '.join(map(repr, unknown))}; "
                f"valid options: {', '.join(OPTIONS)}"
            )
        root, db = opt("root") or opt("path"), opt("db")
        if root is None or db is None:
            raise InvalidArgument("the seglog source needs options 'root' and 'db'")
        mqtt_filter = opt("mqtt_filter")
        if mqtt_filter is not None:
            filter_to_regex(mqtt_filter)  # validates: InvalidTopicFilter
        return cls(
            root=root,
            db=db,
            mqtt_filter=mqtt_filter,
            endpoint=opt("endpoint"),
            access_key=opt("access_key"),
            secret_key=opt("secret_key"),
            region=opt("region"),
            open_log=opt("open_log"),
        )

    def target(self) -> TierTarget:
        return open_target(
            self.root,
            s3_endpoint=self.endpoint,
            access_key=self.access_key,
            secret_key=self.secret_key,
            region=self.region,
        )


class SeglogPartition(InputPartition):
    """One committed tier object to read."""

    def __init__(self, entry: ManifestEntry, log_start: int = 0) -> None:
        """Args: entry: the committed manifest entry of the object; log_start: the shard's
        retention floor (rows below it were deleted by retention and are skipped)."""
        super().__init__(entry.key)
        self.log_start = log_start
        self.key = entry.key
        self.shard = entry.shard
        self.base_offset = entry.base_offset
        self.end_offset = entry.end_offset
        self.rows = entry.rows
        self.size = entry.bytes
        self.checksum = entry.checksum


class SeglogDataSource(DataSource):
    """The ``seglog`` PySpark data source (batch reads of tiered objects)."""

    @classmethod
    def name(cls) -> str:
        """Returns ``"seglog"``."""
        return SOURCE_NAME

    def schema(self) -> str:
        """Returns the DDL of the source's columns (tier schema + ``shard``)."""
        return SOURCE_SCHEMA_DDL

    def reader(self, schema: StructType) -> SeglogReader:
        """Returns a reader producing ``schema``'s columns."""
        return SeglogReader(_ReadOptions.parse(self.options), schema)


class SeglogReader(DataSourceReader):
    """Plans one partition per committed object and reads them as Arrow batches.

    Attributes:
        predicates: Pushed-down filters as ``(column, op, value)`` (``ts`` in µs).
        planned_keys: Keys of the objects planned by the last :meth:`partitions` call.
    """

    def __init__(self, options: _ReadOptions, schema: StructType) -> None:
        """Args: options: parsed source options; schema: the requested output schema."""
        self.options = options
        self.schema = schema
        self.predicates: list[_Predicate] = []
        self.planned_keys: list[str] = []

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        """Accepts filters on shard/offset/ts/topic; yields the ones Spark must apply."""
        for f in filters:
            pred = _translate(f)
            if pred is None:
                yield f
            else:
                self.predicates.append(pred)

    def partitions(self) -> list[SeglogPartition]:
        """Returns one partition per committed object that may hold matching rows."""
        target = self.options.target()
        try:
            manifest = Manifest.load(target, self.options.db)
        finally:
            target.close()
        entries = [
            e
            for e in manifest.committed()
            if _entry_may_match(e, self.predicates) and e.end_offset >= manifest.log_start(e.shard)
        ]
        self.planned_keys = [e.key for e in entries]
        return [SeglogPartition(e, manifest.log_start(e.shard)) for e in entries]

    def _log_open(self, key: str) -> None:
        if self.options.open_log is None:
            return
        fd = os.open(self.options.open_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (key + "\n").encode())
        finally:
            os.close(fd)

    def _mqtt_mask(self, column: pa.ChunkedArray) -> pa.Array | None:
        topic_filter = self.options.mqtt_filter
        if topic_filter is None:
            return None
        topics = column.combine_chunks()
        if not is_wildcard_filter(topic_filter):
            return pc.equal(topics, topic_filter)
        prefix = filter_literal_prefix(topic_filter)
        regex = filter_to_regex(topic_filter)
        if not prefix:
            return pc.match_substring_regex(topics, regex)
        # Cheap prefix test first; the regex runs only where the prefix matched.
        mask = pc.starts_with(topics, prefix)
        candidates = pc.filter(topics, mask)
        matched = pc.match_substring_regex(candidates, regex)
        return pc.replace_with_mask(mask, mask, matched)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Opens the partition's object and yields its matching rows as Arrow batches."""
        from pyspark.sql.pandas.types import to_arrow_schema

        if not isinstance(partition, SeglogPartition):
            return  # Spark plans a single None partition when there are no objects
        self._log_open(partition.key)
        target = self.options.target()
        try:
            data = target.get(partition.key)
        finally:
            target.close()
        verify_bytes(partition.key, data, ObjectInfo(partition.key, partition.size, partition.checksum))
        table = pq.read_table(io.BytesIO(data), schema=TIER_SCHEMA, filters=_row_expression(self.predicates))
        if partition.log_start > partition.base_offset:
            table = table.filter(pc.greater_equal(table.column("offset"), partition.log_start))
        mask = self._mqtt_mask(table.column("topic"))
        if mask is not None:
            table = table.filter(mask)
        if table.num_rows == 0:
            return
        table = table.append_column(
            _SHARD_FIELD,
            pa.array(np.full(table.num_rows, partition.shard, dtype=np.int32)),
        )
        out_schema = to_arrow_schema(self.schema)
        columns = [table.column(f.name).cast(f.type) for f in out_schema]
        table = pa.Table.from_arrays(columns, schema=out_schema)
        yield from table.to_batches(max_chunksize=BATCH_ROWS)
