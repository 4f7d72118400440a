"""Sealed segment <-> Parquet object conversion, and tier object naming.

A tiered object holds the records of one sealed segment of one shard, sorted by offset,
zstd-compressed, with column statistics (so readers can skip row groups by offset, time
or topic). Objects live at ``<db>/shard=<n>/<base:020d>-<end:020d>.parquet``; the
``shard=<n>`` directory makes ``spark.read.parquet("<root>/<db>")`` discover an integer
``shard`` partition column.
"""

from __future__ import annotations

import io
import itertools
import json
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from seglog.errors import InvalidArgument, TierError
from seglog.record import HEADERS_TYPE, READ_SCHEMA

__all__ = [
    "HEADERS_TYPE",
    "ROW_GROUP_ROWS",
    "SEGMENT_SCHEMA",
    "STREAMS_METADATA_KEY",
    "TIER_SCHEMA",
    "SegmentStats",
    "StreamStructures",
    "decode_stream_structures",
    "encode_stream_structures",
    "footer_metadata",
    "object_key",
    "parquet_part_spans",
    "parquet_to_segment_table",
    "parse_object_key",
    "segment_stats",
    "segment_table_to_parquet",
    "to_segment_table",
]

SEGMENT_SCHEMA = READ_SCHEMA
"""In-memory form of a segment's records (``ts`` in int64 µs since the epoch): the read schema."""

_TS_INDEX = SEGMENT_SCHEMA.get_field_index("ts")
TIER_SCHEMA = SEGMENT_SCHEMA.set(
    _TS_INDEX, SEGMENT_SCHEMA.field(_TS_INDEX).with_type(pa.timestamp("us", tz="UTC"))
)
"""Schema of tiered Parquet objects (``ts`` as a UTC timestamp so Spark sees a TIMESTAMP)."""

ROW_GROUP_ROWS = 64 * 1024
"""Rows per Parquet row group: ~8 MiB of 100-byte values, fine-grained for offset seeks."""

ZSTD_LEVEL = 3

STREAMS_METADATA_KEY = "seglog.streams"
"""Schema metadata key of a tiered object whose database stamps streams: the learned
structure of every stream id in the object (:func:`encode_stream_structures`), so a reader
can tell which streams an MQTT filter may match without the shard's LTS."""

StreamStructures = Mapping[int, tuple[tuple[str, ...], bool]]
"""Per stream id: its learned levels and whether it lives under the ``$`` root."""


def encode_stream_structures(structures: StreamStructures) -> str:
    """The value of :data:`STREAMS_METADATA_KEY`: JSON ``{"<id>": [[level, ...], special]}``.

    Args:
        structures: Per stream id, its learned levels (``+`` where topics vary) and whether
            it lives under the ``$`` root.
    """
    return json.dumps(
        {str(sid): [list(levels), special] for sid, (levels, special) in sorted(structures.items())},
        separators=(",", ":"),
    )


def decode_stream_structures(value: str | bytes) -> dict[int, tuple[tuple[str, ...], bool]]:
    """Inverse of :func:`encode_stream_structures`.

    Raises:
        TierError: The value is not what :func:`encode_stream_structures` writes.
    """
    try:
        raw = json.loads(value)
        out: dict[int, tuple[tuple[str, ...], bool]] = {}
        for sid, (levels, special) in raw.items():
            if not all(isinstance(level, str) for level in levels) or not isinstance(special, bool):
                raise TypeError(f"bad structure of stream {sid}")
            out[int(sid)] = (tuple(levels), special)
    except (ValueError, TypeError, AttributeError) as exc:
        raise TierError(f"bad {STREAMS_METADATA_KEY} metadata in a tier object: {exc}") from exc
    return out


_DB_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")  # used with fullmatch: "$" accepts a final "\n"
_KEY_RE = re.compile(
    r"(?P<db>[^/\n]+)/shard=(?P<shard>\d+)/(?P<base>\d{20})-(?P<end>\d{20})\.parquet"
)  # fullmatch


def object_key(db: str, shard: int, base: int, end: int) -> str:
    """Returns the tier key of the segment of ``shard`` holding offsets ``base..end``.

    Args:
        db: Database name (letters, digits, ``_ . -``; not starting with ``.`` or ``-``).
        shard: Shard number, >= 0.
        base: First offset in the object.
        end: Last offset in the object, **inclusive** (``base + rows - 1`` for a dense
            segment), so ranges of consecutive objects never overlap.

    Returns:
        ``f"{db}/shard={shard}/{base:020d}-{end:020d}.parquet"``.
    """
    if not _DB_NAME_RE.fullmatch(db):
        raise InvalidArgument(f"invalid database name for a tier key: {db!r}")
    if shard < 0 or base < 0 or end < base:
        raise InvalidArgument(f"invalid object range shard={shard} base={base} end={end}")
    return f"{db}/shard={shard}/{base:020d}-{end:020d}.parquet"


def parse_object_key(key: str) -> tuple[str, int, int, int]:
    """Inverse of :func:`object_key`: returns ``(db, shard, base, end)``."""
    m = _KEY_RE.fullmatch(key)
    if m is None:
        raise InvalidArgument(f"not a seglog tier object key: {key!r}")
    return m["db"], int(m["shard"]), int(m["base"]), int(m["end"])


@dataclass(frozen=True, slots=True)
class SegmentStats:
    """Ranges of one segment table, for the manifest.

    Attributes:
        base_offset: Smallest offset.
        end_offset: Largest offset (inclusive).
        min_ts: Smallest ``ts`` (µs since the epoch).
        max_ts: Largest ``ts`` (µs).
        rows: Number of records.
    """

    base_offset: int
    end_offset: int
    min_ts: int
    max_ts: int
    rows: int


def _checked_segment_table(table: pa.Table) -> pa.Table:
    if not isinstance(table, pa.Table):
        raise InvalidArgument(f"expected a pyarrow.Table, not {type(table).__name__}")
    missing = [f.name for f in SEGMENT_SCHEMA if f.name not in table.column_names]
    if missing:
        raise InvalidArgument(f"segment table lacks columns {missing}")
    if table.num_rows == 0:
        raise InvalidArgument("segment table is empty")
    cols = []
    for field in SEGMENT_SCHEMA:
        col = table.column(field.name)
        if not field.nullable and col.null_count:
            raise InvalidArgument(f"column {field.name!r} has nulls")
        try:
            cols.append(col.cast(field.type) if col.type != field.type else col)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise InvalidArgument(f"column {field.name!r} of type {col.type} is not {field.type}") from exc
    return pa.Table.from_arrays(cols, schema=SEGMENT_SCHEMA)


def segment_stats(table: pa.Table) -> SegmentStats:
    """Returns offset/time ranges and row count of a (non-empty) segment table."""
    table = _checked_segment_table(table)
    offsets = pc.min_max(table.column("offset"))
    ts = pc.min_max(table.column("ts"))
    return SegmentStats(
        base_offset=offsets["min"].as_py(),
        end_offset=offsets["max"].as_py(),
        min_ts=ts["min"].as_py(),
        max_ts=ts["max"].as_py(),
        rows=table.num_rows,
    )


def segment_table_to_parquet(table: pa.Table, *, metadata: dict[str, str] | None = None) -> bytes:
    """Encodes a sealed segment's records as one Parquet object.

    Args:
        table: Columns ``offset int64, ts int64 (µs), topic string, key binary (nullable),
            value binary, headers map<string,binary> (nullable), stream uint32``; extra
            columns are dropped, compatible types are cast.
        metadata: Extra key/value pairs for the file's schema metadata.

    Returns:
        The Parquet file: rows sorted by offset, :data:`TIER_SCHEMA`, zstd, statistics on,
        row groups of :data:`ROW_GROUP_ROWS` rows.

    Raises:
        InvalidArgument: If columns are missing, mistyped, null where not allowed, or the
            table is empty.
    """
    table = _checked_segment_table(table)
    offsets = table.column("offset")
    if (
        table.num_rows > 1
        and not pc.all(pc.greater(offsets.slice(1), offsets.slice(0, table.num_rows - 1))).as_py()
    ):
        table = table.sort_by("offset")  # segments come sorted; the copy is paid only when not
    ts = table.column("ts").cast(pa.timestamp("us", tz="UTC"))
    table = table.set_column(table.schema.get_field_index("ts"), TIER_SCHEMA.field("ts"), ts)
    table = table.cast(TIER_SCHEMA)
    if metadata:
        table = table.replace_schema_metadata(
            {**(table.schema.metadata or {}), **{k.encode(): v.encode() for k, v in metadata.items()}}
        )
    sink = pa.BufferOutputStream()
    pq.write_table(
        table,
        sink,
        row_group_size=ROW_GROUP_ROWS,
        compression="zstd",
        compression_level=ZSTD_LEVEL,
        write_statistics=True,
        write_page_index=True,
        use_dictionary=["topic"],
        coerce_timestamps="us",
    )
    out: bytes = sink.getvalue().to_pybytes()
    return out


_PARQUET_MAGIC = b"PAR1"
# The file's tail: the footer's length (little-endian uint32), then the magic.
_TAIL = struct.Struct("<I4s")


def _footer_start(data: bytes | memoryview, *, whole: bool = True) -> int:
    """Where the footer starts in ``data`` (a whole file, or only its tail)."""
    if len(data) < (len(_PARQUET_MAGIC) if whole else 0) + _TAIL.size:
        raise TierError(f"not a Parquet file: {len(data)} bytes")
    footer_bytes, magic = _TAIL.unpack_from(data, len(data) - _TAIL.size)
    start = len(data) - _TAIL.size - footer_bytes
    if magic != _PARQUET_MAGIC or start < (len(_PARQUET_MAGIC) if whole else 0):
        raise TierError("not a Parquet file: bad tail")
    return int(start)


def footer_metadata(tail: bytes | memoryview) -> pq.FileMetaData:
    """Parses a Parquet footer from the file's last bytes (at least the footer, its length and
    the magic); offsets in it stay those of the whole file.

    Raises:
        TierError: ``tail`` does not end in a whole, valid footer.
    """
    start = _footer_start(tail, whole=False)
    try:
        return pq.read_metadata(pa.BufferReader(_PARQUET_MAGIC + bytes(tail[start:])))
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise TierError(f"cannot parse a Parquet footer: {exc}") from exc


def parquet_part_spans(data: bytes | memoryview) -> list[tuple[int, int]]:
    """Cuts a Parquet file into byte spans a reader fetches whole: the file up to the end of
    row group 0, each further row group, what lies between the last one and the footer (the
    page indexes), and the footer with the tail. The spans are contiguous and cover the file,
    so a ranged reader can check every byte it reads against a checksum per span.

    Raises:
        TierError: ``data`` is not a Parquet file.
    """
    footer = _footer_start(data)
    meta = footer_metadata(data)
    ends = []
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        end = 0
        for j in range(rg.num_columns):
            col = rg.column(j)
            first = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
            end = max(end, int(first) + int(col.total_compressed_size))
        ends.append(end)
    cuts = [0]
    for end in [*ends, footer, len(data)]:
        if end > cuts[-1]:
            if end > len(data):
                raise TierError(f"Parquet row group ends at {end}, past the file's {len(data)} bytes")
            cuts.append(end)
    return list(itertools.pairwise(cuts))


def parquet_to_segment_table(
    data: bytes | memoryview,
    *,
    start_offset: int | None = None,
    end_offset: int | None = None,
) -> pa.Table:
    """Decodes a tiered object back into a segment table (:data:`SEGMENT_SCHEMA`).

    Args:
        data: The Parquet object's bytes.
        start_offset: If set, only rows with ``offset >= start_offset`` (row groups
            entirely below are skipped using statistics).
        end_offset: If set, only rows with ``offset <= end_offset`` (inclusive).

    Raises:
        TierError: If the bytes are not a readable seglog Parquet object.
    """
    filters = []
    if start_offset is not None:
        filters.append(("offset", ">=", start_offset))
    if end_offset is not None:
        filters.append(("offset", "<=", end_offset))
    try:
        return to_segment_table(pq.read_table(io.BytesIO(data), filters=filters or None, schema=TIER_SCHEMA))
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise TierError(f"cannot decode tier Parquet object: {exc}") from exc


def to_segment_table(table: pa.Table) -> pa.Table:
    """Rows read from a tiered object (:data:`TIER_SCHEMA`) as a segment table
    (:data:`SEGMENT_SCHEMA`: ``ts`` back to int64 µs, no schema metadata)."""
    ts = table.column("ts").cast(pa.int64())
    table = table.set_column(table.schema.get_field_index("ts"), SEGMENT_SCHEMA.field("ts"), ts)
    return table.select(SEGMENT_SCHEMA.names).cast(SEGMENT_SCHEMA).replace_schema_metadata(None)
