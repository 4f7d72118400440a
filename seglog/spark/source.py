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
``open_log``, ``scan_log``
    Test aids, see below.

Schema: the tier schema (``offset bigint, ts timestamp, topic string, key binary,
value binary, headers map<string,binary>, stream bigint``) plus ``shard int`` -- the same
columns, in the same order, as ``spark.read.parquet("<root>/<db>")`` (Spark has no uint32,
so ``stream`` is a bigint in both).

Planning reads the manifest and makes one Spark partition per committed object.
Topic filters go through streams when the database stamps them: each object's metadata
names the learned structure of its streams (:data:`~seglog.tiering.parquet.STREAMS_METADATA_KEY`),
so a task works out which streams ``mqtt_filter`` (and ``topic =`` / ``IN`` pushed down)
cannot match, skips the row groups whose ``stream`` statistics (min/max) hold only such
streams, and drops their rows before the exact topic test. Pruning pays off when streams are
clustered in offset order (a burst per device, a stream per segment); interleaved streams
cost the filter only. Objects without that metadata (no streams) are filtered row by row.
``pushFilters`` takes comparisons, ``=``, ``IN`` on ``shard``, ``offset`` and ``ts`` and
those plus ``LIKE 'prefix%'`` on ``topic``: objects whose manifest ranges cannot match are
never opened, and accepted filters are applied exactly to the rows read (row groups are
skipped by Parquet statistics), so Spark does not re-evaluate them. ``mqtt_filter`` keeps
rows whose topic matches with MQTT semantics, vectorised: a literal-prefix test, then an
anchored regular expression equivalent to :func:`seglog.topics.topic_matches`.

Each object's sha256 is checked against the manifest before it is decoded.

Option ``open_log`` (a local file path) makes every task append the key of each object it
opens, one per line: an honest count of objects touched, used by the tests. Option
``scan_log`` likewise appends ``<key> <row groups decoded> <row groups in the object>
<rows decoded>`` per object opened.
"""

from __future__ import annotations

import datetime as dt
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

from seglog.errors import InvalidArgument, InvalidTopicFilter
from seglog.record import HEADERS_TYPE
from seglog.tiering.manifest import Manifest, ManifestEntry
from seglog.tiering.parquet import STREAMS_METADATA_KEY, TIER_SCHEMA, decode_stream_structures
from seglog.tiering.targets import ObjectInfo, TierTarget, open_target, verify_bytes
from seglog.topics.filters import (
    filter_literal_prefix,
    filter_to_regex,
    is_wildcard_filter,
    validate_topic_filter,
)
from seglog.topics.lts import varying_filter_for

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


def _topic_alternatives(mqtt_filter: str | None, preds: Sequence[_Predicate]) -> list[list[str]]:
    """The topic conditions a row must meet, each a list of MQTT filters one of which must match.

    ``mqtt_filter`` is one condition; ``topic = v`` and ``topic IN (...)`` are others (a topic
    name is a filter matching itself, or a superset when it holds ``+``/``#``). Values that
    are not valid filters make no condition: they can only be tested row by row.
    """
    out = [[mqtt_filter]] if mqtt_filter is not None else []
    for column, op, value in preds:
        if column != "topic" or op not in ("==", "in"):
            continue
        values = [value] if op == "==" else list(value)
        try:
            for v in values:
                validate_topic_filter(v)
        except InvalidTopicFilter:
            continue
        out.append(values)
    return out


def _excluded_streams(metadata: dict[bytes, bytes] | None, alternatives: list[list[str]]) -> frozenset[int]:
    """The streams of an object that no row meeting every topic condition can be in.

    Only streams the object's metadata names are considered: a stream id it does not name
    (or an object without the metadata) is never excluded.
    """
    if not alternatives or not metadata or STREAMS_METADATA_KEY.encode() not in metadata:
        return frozenset()
    structures = decode_stream_structures(metadata[STREAMS_METADATA_KEY.encode()])
    return frozenset(
        sid
        for sid, (levels, special) in structures.items()
        if any(all(varying_filter_for(levels, special, f) is None for f in fs) for fs in alternatives)
    )


def _stat_range(stats: Any, column: str) -> tuple[int, int] | None:
    """A row group's (min, max) of an integer column (``ts`` in µs), or None without statistics."""
    if stats is None or not stats.has_min_max:
        return None
    lo, hi = stats.min, stats.max
    if column == "ts":
        lo, hi = _to_micros(lo), _to_micros(hi)
        if lo is None or hi is None:
            return None
    return int(lo), int(hi)


def _row_group_may_match(
    row_group: pq.RowGroupMetaData,
    columns: dict[str, int],
    preds: Sequence[_Predicate],
    excluded: frozenset[int],
) -> bool:
    """Whether a row group's statistics allow rows meeting the predicates and not in ``excluded``."""
    for column in ("offset", "ts"):
        found = _stat_range(row_group.column(columns[column]).statistics, column)
        if found is None:
            continue
        lo, hi, allowed = _interval(preds, column)
        if (lo is not None and found[1] < lo) or (hi is not None and found[0] > hi):
            return False
        if allowed is not None and not any(found[0] <= v <= found[1] for v in allowed):
            return False
    if excluded:
        found = _stat_range(row_group.column(columns["stream"]).statistics, "stream")
        if found is not None and found[1] - found[0] < len(excluded):
            return not all(sid in excluded for sid in range(found[0], found[1] + 1))
    return True


def _row_expression(
    preds: Sequence[_Predicate], excluded: frozenset[int] = frozenset()
) -> pc.Expression | None:
    """Builds the pyarrow filter for the row-level (non-shard) predicates and excluded streams."""
    expr: pc.Expression | None = None
    if excluded:
        expr = ~pc.field("stream").isin(pa.array(sorted(excluded), pa.uint32()))
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
    "scan_log",
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
    scan_log: str | None

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
            scan_log=opt("scan_log"),
        )

    def target(self) -> TierTarget:
        return open_target(
            self.root,
            s3_endpoint=self.endpoint,
            access_key=self.access_key,
            secret_key=self.secret_key,
            region=self.region,
        )


def _append_line(path: str | None, line: str) -> None:
    """Appends one line to a test-aid log (one write, so concurrent tasks do not interleave)."""
    if path is None:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


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
        _append_line(self.options.open_log, key)

    def _log_scan(self, line: str) -> None:
        _append_line(self.options.scan_log, line)

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
        parquet = pq.ParquetFile(pa.BufferReader(data))
        excluded = _excluded_streams(
            parquet.schema_arrow.metadata, _topic_alternatives(self.options.mqtt_filter, self.predicates)
        )
        meta = parquet.metadata
        stat_columns = {meta.schema.column(i).path: i for i in range(meta.num_columns)}
        groups = [
            i
            for i in range(meta.num_row_groups)
            if _row_group_may_match(meta.row_group(i), stat_columns, self.predicates, excluded)
        ]
        decoded = sum(meta.row_group(i).num_rows for i in groups)
        self._log_scan(f"{partition.key} {len(groups)} {meta.num_row_groups} {decoded}")
        if not groups:
            return
        table = parquet.read_row_groups(groups).cast(TIER_SCHEMA)
        expr = _row_expression(self.predicates, excluded)
        if expr is not None:
            table = table.filter(expr)
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
