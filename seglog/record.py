"""Records (TTVs) and the frame codec.

A frame is the unit of writing, replication, checksumming and compression::

    offset  size  field
    0       4     magic  b"SGLF"
    4       4     crc32c of bytes [8, 56) of the header and the whole stored body
    8       1     format version (2; version 1 frames, 56-byte headers, are still read)
    9       1     compression (0 none, 1 zstd)
    10      2     producer epoch (int16, -1 without a producer)
    12      8     base offset (int64)
    20      4     record count (uint32)
    24      4     leader epoch (int32)
    28      8     min ts (int64 µs)
    36      8     max ts (int64 µs)
    44      4     stored body length (uint32)
    48      4     uncompressed body length (uint32)
    52      4     base sequence (int32: the producer's sequence number of the first record, -1)
    56      8     producer id (int64, -1: not written by an idempotent producer)
    64      ...   body, then zero padding to a multiple of 8 bytes

Version 1 frames end their header at 56 with a reserved uint32 where version 2 has the base
sequence, and no producer id. The three producer fields are what the leader checks to drop a
retried batch of an idempotent producer (:mod:`seglog.producer_state`); they travel with the
frame, so every replica can rebuild that state from its own log.

The body is one Arrow IPC record-batch message with :data:`FRAME_SCHEMA`; offsets are
implicit (``base offset + row``). Frames are padded to 8 bytes so that bodies read through
``mmap`` stay aligned and Arrow can use them without copying.
"""

from __future__ import annotations

import datetime as dt
import struct
import time
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import Any, Final, NamedTuple

import crc32c
import numpy as np

# pyarrow imports numpy.ma on its first conversion of a NumPy array (13-40 ms, mostly
# ``inspect`` signatures): done here, at import, rather than inside the first append.
import numpy.ma
import pyarrow as pa
import pyarrow.compute as pc
import zstandard

from seglog._gc import gc_paused
from seglog.errors import (
    CorruptFrame,
    InvalidArgument,
    InvalidHeaders,
    InvalidKey,
    InvalidRecord,
    InvalidTimestamp,
    InvalidTopic,
    InvalidValue,
    RecordTooLarge,
)

try:  # compiled by `pip install` when a C compiler is there (setup.py); optional
    import seglog._columns as _columns
except ImportError:  # pragma: no cover - a build without the extension
    _columns = None  # type: ignore[assignment]

__all__ = [
    "COMPRESSION_NONE",
    "COMPRESSION_ZSTD",
    "DEFAULT_MAX_RECORD_BYTES",
    "DEFAULT_MAX_TS_US",
    "DEFAULT_MIN_TS_US",
    "FRAME_HEADER_BYTES",
    "FRAME_SCHEMA",
    "HEADERS_TYPE",
    "MAX_LEADER_EPOCH",
    "MAX_TOPIC_BYTES",
    "OFFSET_FIELD",
    "READ_SCHEMA",
    "EncodedFrame",
    "FrameHeader",
    "Record",
    "RecordMeta",
    "decode_body",
    "decode_frames",
    "encode_frame",
    "encode_frames",
    "frame_size",
    "now_us",
    "parse_header",
    "records_from_table",
    "records_to_batch",
    "table_to_batch",
    "timestamp_us",
    "validate_record",
    "verify_frame",
]

FRAME_MAGIC: Final = b"SGLF"
FORMAT_VERSION: Final = 2
FORMAT_VERSION_1: Final = 1
NO_PRODUCER: Final = -1
"""The producer id, epoch and base sequence of a frame no idempotent producer wrote."""
COMPRESSION_NONE: Final = 0
COMPRESSION_ZSTD: Final = 1
# The fixed frame header, little-endian, one field per line (the module docstring draws the
# same layout). Offsets are derived from the formats, never written by hand.
_HEADER_BYTE_ORDER: Final = "<"
_HEADER_FIELDS: Final = (
    ("magic", "4s"),  # Magic => b"SGLF"
    ("crc", "I"),  # CRC => uint32 crc32c of the header from ``version`` on, then the stored body
    ("version", "B"),  # FormatVersion => uint8 (FORMAT_VERSION)
    ("compression", "B"),  # Compression => uint8 (COMPRESSION_NONE, COMPRESSION_ZSTD)
    ("producer_epoch", "h"),  # ProducerEpoch => int16 (-1: none; v1: attributes, 0)
    ("base_offset", "q"),  # BaseOffset => int64
    ("record_count", "I"),  # RecordCount => uint32
    ("leader_epoch", "i"),  # LeaderEpoch => int32
    ("min_ts", "q"),  # MinTimestamp => int64 µs
    ("max_ts", "q"),  # MaxTimestamp => int64 µs
    ("body_len", "I"),  # StoredBodyLength => uint32 (after compression)
    ("raw_len", "I"),  # RawBodyLength => uint32 (uncompressed)
    ("base_sequence", "i"),  # BaseSequence => int32 (-1: none; v1: reserved, 0)
    ("producer_id", "q"),  # ProducerId => int64 (-1: none; not in v1)
)
_HEADER = struct.Struct(_HEADER_BYTE_ORDER + "".join(fmt for _, fmt in _HEADER_FIELDS))
FRAME_HEADER_BYTES: Final = _HEADER.size
# A version 1 header: the same fields up to ``producer_id``, which it lacks.
_PRODUCER_ID = struct.Struct(_HEADER_BYTE_ORDER + "q")
_HEADER_V1 = struct.Struct(_HEADER_BYTE_ORDER + "".join(fmt for _, fmt in _HEADER_FIELDS[:-1]))
FRAME_HEADER_BYTES_V1: Final = _HEADER_V1.size
# Each field's byte offset: the size of the formats before it.
_HEADER_OFFSETS: Final = {
    name: struct.calcsize(_HEADER_BYTE_ORDER + "".join(fmt for _, fmt in _HEADER_FIELDS[:i]))
    for i, (name, _) in enumerate(_HEADER_FIELDS)
}
# The CRC covers everything after its own field.
_CRC_START: Final = _HEADER_OFFSETS["version"]
MAX_TOPIC_BYTES: Final = 65535
DEFAULT_MAX_RECORD_BYTES: Final = 1 << 20
# The frame header keeps the leader epoch as an int32; epochs are never negative.
MAX_LEADER_EPOCH: Final = 2**31 - 1
# A frame body is bounded so that a garbage length field read during recovery is rejected
# instead of being trusted.
MAX_FRAME_BODY_BYTES: Final = 256 << 20
_ZSTD_LEVEL: Final = 3
# The ``ts`` range a database accepts by default (``DbConfig.min_ts_us``/``max_ts_us``):
# 2000-01-01T00:00:00Z .. 2200-01-01T00:00:00Z in µs. Seconds, milliseconds (Kafka's unit)
# and nanoseconds since 1970 of any date in that range all fall outside it.
DEFAULT_MIN_TS_US: Final = 946_684_800_000_000
DEFAULT_MAX_TS_US: Final = 7_258_118_400_000_000
_EPOCH: Final = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)

HEADERS_TYPE: Final = pa.map_(pa.string(), pa.binary())
FRAME_SCHEMA: Final = pa.schema(
    [
        pa.field("ts", pa.int64(), nullable=False),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary(), nullable=False),
        pa.field("headers", HEADERS_TYPE),
        pa.field("stream", pa.uint32(), nullable=False),
    ]
)
"""The stored columns of a record: the schema of every frame body. All other schemas of
records (reads, tiered segments, Parquet, Spark) are derived from this one."""
OFFSET_FIELD: Final = pa.field("offset", pa.int64(), nullable=False)
"""A record's offset: implicit in a frame (base offset + row), a column once read."""
READ_SCHEMA: Final = pa.schema([OFFSET_FIELD, *FRAME_SCHEMA])
"""Records as reads return them: :data:`OFFSET_FIELD`, then the :data:`FRAME_SCHEMA` columns."""

assert FRAME_HEADER_BYTES == 64 and FRAME_HEADER_BYTES_V1 == 56
# Every frame (a body of at least one byte, padded to 8) is at least this long, so reading
# FRAME_HEADER_BYTES at a frame's start never runs past a version 1 frame.
assert FRAME_HEADER_BYTES_V1 + 8 == FRAME_HEADER_BYTES
MAX_PRODUCER_EPOCH: Final = 2**15 - 1
MAX_SEQUENCE: Final = 2**31 - 1


def now_us() -> int:
    """Wall-clock time in integer microseconds since the epoch."""
    return time.time_ns() // 1000


def timestamp_us(value: object, what: str = "ts") -> int:
    """A time as int µs since 1970: an ``int`` as is, a :class:`datetime.datetime` converted.

    A naive datetime is taken as UTC.

    Raises:
        InvalidArgument: ``value`` is neither.
    """
    if type(value) is int:
        return value
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return (value - _EPOCH) // dt.timedelta(microseconds=1)
    if isinstance(value, np.integer):
        return int(value)
    raise InvalidArgument(f"{what} must be an int (µs since 1970) or a datetime, not {type(value).__name__}")


def _iso(us: int) -> str:
    try:
        return (_EPOCH + dt.timedelta(microseconds=us)).strftime("%Y-%m-%dT%H:%M:%SZ")
    except OverflowError:
        return "out of datetime range"


def _unit_hint(value: int, lo: int | None, hi: int | None) -> str:
    def ok(v: int) -> bool:
        return (lo is None or v >= lo) and (hi is None or v <= hi)

    if value < 0:
        return "; a negative ts is before 1970"
    for unit, us, fix in (
        ("milliseconds", value * 1000, "multiply by 1000"),
        ("seconds", value * 1_000_000, "multiply by 1000000"),
        ("nanoseconds", value // 1000, "divide by 1000"),
    ):
        if ok(us):
            return f"; it looks like {unit} since 1970 ({fix}, or pass a datetime)"
    return ""


def _check_ts_range(ts: pa.Array, lo: int | None, hi: int | None) -> None:
    """Raise :class:`InvalidTimestamp` for the first ``ts`` outside ``[lo, hi]`` (vectorised)."""
    if (lo is None and hi is None) or len(ts) == 0:
        return
    if _columns is not None and not ts.null_count:
        start = ts.offset * 8
        view = memoryview(ts.buffers()[1])[start : start + len(ts) * 8]
        if _columns.ts_in_range(
            view, len(ts), _INT64_MIN if lo is None else lo, _INT64_MAX if hi is None else hi
        ):
            return
    arr = ts.to_numpy(zero_copy_only=False)  # no nulls here: zero-copy
    if (lo is None or int(arr.min()) >= lo) and (hi is None or int(arr.max()) <= hi):
        return
    bad = np.zeros(len(arr), bool)
    if lo is not None:
        bad |= arr < lo
    if hi is not None:
        bad |= arr > hi
    idx = int(np.argmax(bad))
    raise InvalidTimestamp(_ts_range_message(int(arr[idx]), lo, hi), index=idx)


def _ts_range_message(value: int, lo: int | None, hi: int | None) -> str:
    low = "-inf" if lo is None else f"{lo} ({_iso(lo)})"
    high = "+inf" if hi is None else f"{hi} ({_iso(hi)})"
    return (
        f"ts {value} is outside the accepted range [{low}, {high}] of µs since 1970 "
        f"(DbConfig min_ts_us/max_ts_us){_unit_hint(value, lo, hi)}"
    )


def _stamps(base: int, n: int) -> pa.Array:
    """The ``ts`` of rows appended without one: ``base`` + row index (increasing µs)."""
    return pa.array(np.arange(base, base + n, dtype=np.int64))


class Record:
    """One Topic-Timestamp-Value record.

    Args:
        topic: MQTT topic name (UTF-8, no wildcards, no NUL, 1..65535 bytes).
        value: The payload.
        ts: Microseconds since 1970 (UTC), or a :class:`datetime.datetime` (naive means
            UTC); when ``None``, the append assigns ``now_us()`` plus the record's index in
            the call, so records stamped by one call keep their order in time.
        key: Optional routing and lookup key.
        headers: Optional MQTT 5 style properties, ``str -> bytes``.
        shard: Set on records read back (or to force a shard on append).
        offset: Set on records read back.
    """

    __slots__ = ("headers", "key", "offset", "shard", "topic", "ts", "value")

    def __init__(
        self,
        topic: str,
        value: bytes,
        ts: int | dt.datetime | None = None,
        key: bytes | None = None,
        headers: dict[str, bytes] | None = None,
        shard: int | None = None,
        offset: int | None = None,
    ) -> None:
        self.topic = topic
        self.value = value
        if type(ts) is not int and isinstance(ts, dt.datetime):
            ts = timestamp_us(ts)
        self.ts: int | None = ts  # anything else is rejected at append, with its index
        self.key = key
        self.headers = headers
        self.shard = shard
        self.offset = offset

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Record):
            return NotImplemented
        return (
            self.topic == other.topic
            and self.value == other.value
            and self.ts == other.ts
            and self.key == other.key
            and (self.headers or None) == (other.headers or None)
            and self.shard == other.shard
            and self.offset == other.offset
        )

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        parts = [f"topic={self.topic!r}", f"value={self.value[:32]!r}"]
        for name in ("ts", "key", "headers", "shard", "offset"):
            v = getattr(self, name)
            if v is not None:
                parts.append(f"{name}={v!r}")
        return f"Record({', '.join(parts)})"


class RecordMeta(NamedTuple):
    """Where an appended record went."""

    shard: int
    offset: int
    ts: int


class FrameHeader(NamedTuple):
    """The decoded fixed header of a frame."""

    crc: int
    version: int
    compression: int
    base_offset: int
    record_count: int
    leader_epoch: int
    min_ts: int
    max_ts: int
    body_len: int
    raw_len: int
    producer_id: int = NO_PRODUCER
    producer_epoch: int = NO_PRODUCER
    base_sequence: int = NO_PRODUCER

    @property
    def next_offset(self) -> int:
        """The offset right after this frame's last record."""
        return self.base_offset + self.record_count

    @property
    def header_bytes(self) -> int:
        """Bytes of the fixed header: where the body starts."""
        return FRAME_HEADER_BYTES if self.version == FORMAT_VERSION else FRAME_HEADER_BYTES_V1

    @property
    def size(self) -> int:
        """Bytes the frame takes on disk, padding included."""
        return self.header_bytes + ((self.body_len + 7) & ~7)


class EncodedFrame(NamedTuple):
    """A frame ready for ``writev``: header bytes, body buffer and padding."""

    header: FrameHeader
    buffers: tuple[Any, ...]

    @property
    def size(self) -> int:
        """Bytes on disk."""
        return self.header.size


def frame_size(body_len: int) -> int:
    """Bytes on disk of a frame (of the current format) whose stored body is ``body_len`` bytes."""
    return FRAME_HEADER_BYTES + ((body_len + 7) & ~7)


_PADDING = tuple(b"\0" * n for n in range(8))


# --- validation and conversion to Arrow ------------------------------------------------


def _check_topics(topics: pa.Array, first_bad: Any) -> None:
    if topics.null_count:
        raise InvalidTopic("topic must be a non-empty str", index=first_bad(pc.is_null(topics)))
    n = len(topics)
    if n == 0:
        return
    _validity, offsets_buf, data_buf = topics.buffers()
    if _columns is not None and data_buf is not None:
        # One compiled pass; only a batch with a bad topic takes the NumPy path to name it.
        start = topics.offset * 4
        view = memoryview(offsets_buf)[start : start + (n + 1) * 4]
        if _columns.check_topics(view, data_buf, n, MAX_TOPIC_BYTES):
            return
    offsets = np.frombuffer(offsets_buf, np.int32, n + 1, topics.offset * 4)
    lengths = np.diff(offsets)
    if lengths.min() == 0:
        raise InvalidTopic("topic must not be empty", index=int(np.argmin(lengths)))
    if lengths.max() > MAX_TOPIC_BYTES:
        raise InvalidTopic(
            f"topic is longer than {MAX_TOPIC_BYTES} UTF-8 bytes",
            index=int(np.argmax(lengths > MAX_TOPIC_BYTES)),
        )
    # memchr over the whole character buffer; only a hit pays for the exact per-row search.
    raw = memoryview(data_buf)[offsets[0] : offsets[-1]].tobytes()
    if b"+" in raw or b"#" in raw or b"\0" in raw:
        bad = pc.match_substring_regex(topics, r"[+#\x00]")
        raise InvalidTopic(
            "topic name must not contain '+', '#' or U+0000 (wildcards belong in filters)",
            index=first_bad(bad),
        )


def _first_true(mask: pa.Array) -> int:
    return int(pc.index(mask, True).as_py())


def _check_values(values: pa.Array, max_record_bytes: int) -> None:
    if values.null_count:
        raise InvalidValue("value must be bytes", index=_first_true(pc.is_null(values)))
    n = len(values)
    if not n:
        return
    # From the offsets buffer: numpy's per-call cost is a fraction of pyarrow.compute's.
    offsets = np.frombuffer(values.buffers()[1], np.int32, n + 1, values.offset * 4)
    if (
        int(offsets[-1]) - int(offsets[0]) > max_record_bytes
        and int(np.diff(offsets).max()) > max_record_bytes
    ):
        idx = _first_true(pc.greater(pc.binary_length(values), max_record_bytes))
        raise RecordTooLarge(f"value is larger than max_record_bytes={max_record_bytes}", index=idx)


def _headers_array(headers: Sequence[Any]) -> pa.Array:
    rows: list[list[tuple[str, bytes]] | None] = []
    for i, h in enumerate(headers):
        if h is None:
            rows.append(None)
            continue
        if not isinstance(h, dict):
            raise InvalidHeaders("headers must be a dict[str, bytes] or None", index=i)
        for k, v in h.items():
            if type(k) is not str or not isinstance(v, bytes):
                raise InvalidHeaders("headers must map str to bytes", index=i)
        rows.append(list(h.items()))
    return pa.array(rows, type=HEADERS_TYPE)


def validate_record(
    topic: object,
    value: object,
    key: object = None,
    ts: object = None,
    headers: object = None,
    *,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    min_ts_us: int | None = None,
    max_ts_us: int | None = None,
) -> tuple[int | None, int]:
    """Check one record's fields by the rules of :func:`records_to_batch`, without Arrow.

    For callers that take records one at a time (the network producer): the same checks and
    error classes as a one-record :func:`records_to_batch` (messages without the ``record
    N:`` prefix; ``index`` is None), at a fraction of its cost.
    ``tests/test_client_producer.py`` holds the two to agreement.

    Returns:
        ``(ts, size)``: ``ts`` as µs (a datetime converted; ``None`` stays ``None``) and the
        record's payload bytes (topic UTF-8 + value + key + headers), a buffer-size estimate.

    Raises:
        InvalidRecord: The subclass :func:`records_to_batch` raises for the same record.
    """
    if type(topic) is not str:
        raise InvalidTopic("topic must be a str")
    if type(ts) is not int and isinstance(ts, dt.datetime):
        ts = timestamp_us(ts)
    if not isinstance(value, bytes):
        raise InvalidValue(f"value must be bytes, not {type(value).__name__}")
    if key is not None and not isinstance(key, bytes):
        raise InvalidKey(f"key must be bytes or None, not {type(key).__name__}")
    if ts is not None and type(ts) is not int:
        raise InvalidRecord("ts must be an int (µs since 1970), a datetime or None")
    try:
        raw = topic.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidTopic("topic is not valid UTF-8 text (lone surrogate)") from None
    if not raw:
        raise InvalidTopic("topic must not be empty")
    if len(raw) > MAX_TOPIC_BYTES:
        raise InvalidTopic(f"topic is longer than {MAX_TOPIC_BYTES} UTF-8 bytes")
    if b"+" in raw or b"#" in raw or b"\0" in raw:
        raise InvalidTopic("topic name must not contain '+', '#' or U+0000 (wildcards belong in filters)")
    if len(value) > max_record_bytes:
        raise RecordTooLarge(f"value is larger than max_record_bytes={max_record_bytes}")
    if ts is not None:
        if not -(1 << 63) <= ts < (1 << 63):
            raise InvalidRecord("ts does not fit in int64")
        if (min_ts_us is not None and ts < min_ts_us) or (max_ts_us is not None and ts > max_ts_us):
            raise InvalidTimestamp(_ts_range_message(ts, min_ts_us, max_ts_us))
    size = len(raw) + len(value) + (0 if key is None else len(key))
    if headers is not None:
        if not isinstance(headers, dict):
            raise InvalidHeaders("headers must be a dict[str, bytes] or None")
        for k, v in headers.items():
            if type(k) is not str or not isinstance(v, bytes):
                raise InvalidHeaders("headers must map str to bytes")
            size += len(k) + len(v)
    return ts, size


def records_to_batch(
    records: Sequence[Record],
    *,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    default_ts_us: int | None = None,
    stream: int = 0,
    min_ts_us: int | None = None,
    max_ts_us: int | None = None,
) -> pa.RecordBatch:
    """Validate records and convert them into one Arrow batch with :data:`FRAME_SCHEMA`.

    Records without ``ts`` get ``default_ts_us`` (default ``now_us()``) plus their index.

    Raises:
        InvalidRecord: (a subclass naming the problem and the record's index) when any
            record is invalid, e.g. :class:`InvalidTimestamp` for a ``ts`` outside
            ``[min_ts_us, max_ts_us]`` (``None``: unbounded); nothing is converted.
    """
    n = len(records)
    fast = _gathered(records, max_record_bytes, default_ts_us, min_ts_us, max_ts_us)
    if fast is not None:
        ts, topics, keys, values = fast
        streams = zero_streams(n) if stream == 0 else pa.repeat(pa.scalar(stream, pa.uint32()), n)
        return _frame_batch(
            ts=ts, topic=topics, key=keys, value=values, headers=null_headers(n), stream=streams
        )
    try:
        topics_py = [r.topic for r in records]
        values_py = [r.value for r in records]
        keys_py = [r.key for r in records]
        ts_py = [r.ts for r in records]
        headers_py = [r.headers for r in records]
    except AttributeError as exc:
        raise InvalidRecord(f"expected seglog.Record objects: {exc}") from None
    if set(map(type, topics_py)) - {str}:
        raise InvalidTopic(
            "topic must be a str", index=next(i for i, t in enumerate(topics_py) if type(t) is not str)
        )
    value_types = set(map(type, values_py))
    if value_types - {bytes} and not all(isinstance(v, bytes) for v in values_py):
        idx = next(i for i, v in enumerate(values_py) if not isinstance(v, bytes))
        raise InvalidValue(f"value must be bytes, not {type(values_py[idx]).__name__}", index=idx)
    key_types = set(map(type, keys_py)) - {bytes, type(None)}
    if key_types and not all(k is None or isinstance(k, bytes) for k in keys_py):
        idx = next(i for i, k in enumerate(keys_py) if not (k is None or isinstance(k, bytes)))
        raise InvalidKey(f"key must be bytes or None, not {type(keys_py[idx]).__name__}", index=idx)
    ts_types = set(map(type, ts_py)) - {int, type(None)}
    if ts_types and any(issubclass(t, dt.datetime) for t in ts_types):
        ts_py = [timestamp_us(t) if isinstance(t, dt.datetime) else t for t in ts_py]
        ts_types = set(map(type, ts_py)) - {int, type(None)}
    if ts_types:
        idx = next(i for i, t in enumerate(ts_py) if not (t is None or type(t) is int))
        raise InvalidRecord("ts must be an int (µs since 1970), a datetime or None", index=idx)
    try:
        topics = pa.array(topics_py, type=pa.string())
    except UnicodeEncodeError:
        idx = next(i for i, t in enumerate(topics_py) if not _encodable(t))
        raise InvalidTopic("topic is not valid UTF-8 text (lone surrogate)", index=idx) from None
    _check_topics(topics, _first_true)
    values = pa.array(values_py, type=pa.binary())
    _check_values(values, max_record_bytes)
    try:
        ts = pa.array(ts_py, type=pa.int64())
    except OverflowError:
        raise InvalidRecord("ts does not fit in int64") from None
    if ts.null_count:
        ts = pc.coalesce(ts, _stamps(now_us() if default_ts_us is None else default_ts_us, n))
    _check_ts_range(ts, min_ts_us, max_ts_us)
    keys = pa.array(keys_py, type=pa.binary())
    headers = null_headers(n) if headers_py.count(None) == n else _headers_array(headers_py)
    streams = zero_streams(n) if stream == 0 else pa.repeat(pa.scalar(stream, pa.uint32()), n)
    return _frame_batch(ts=ts, topic=topics, key=keys, value=values, headers=headers, stream=streams)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _gathered(
    records: Sequence[Record],
    max_record_bytes: int,
    default_ts_us: int | None,
    min_ts_us: int | None,
    max_ts_us: int | None,
) -> tuple[pa.Array, pa.Array, pa.Array, pa.Array] | None:
    """``ts, topic, key, value`` of the plain case (exact ``Record`` objects, no headers, all
    valid) in one compiled pass over the records; ``None`` otherwise (or without the
    extension): :func:`records_to_batch` then converts them itself and raises its errors."""
    if _columns is None or not records or not isinstance(records, list | tuple):
        return None
    lo = _INT64_MIN if min_ts_us is None else min_ts_us
    hi = _INT64_MAX if max_ts_us is None else max_ts_us
    got = _columns.gather(records, Record, MAX_TOPIC_BYTES, max_record_bytes, lo, hi)
    if got is None:
        return None
    t_off, t_data, v_off, v_data, k_off, k_data, k_valid, k_nulls, ts_buf, ts_valid, ts_nulls = got
    n = len(records)
    topics = pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(t_off), pa.py_buffer(t_data)])
    values = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(v_off), pa.py_buffer(v_data)])
    keys = pa.Array.from_buffers(
        pa.binary(),
        n,
        [None if k_valid is None else pa.py_buffer(k_valid), pa.py_buffer(k_off), pa.py_buffer(k_data)],
        null_count=k_nulls,
    )
    ts = pa.Array.from_buffers(
        pa.int64(),
        n,
        [None if ts_valid is None else pa.py_buffer(ts_valid), pa.py_buffer(ts_buf)],
        null_count=ts_nulls,
    )
    if ts_nulls:
        # Stamped here as the Python path stamps them; only the stamps are still unchecked.
        ts = pc.coalesce(ts, _stamps(now_us() if default_ts_us is None else default_ts_us, n))
        _check_ts_range(ts, min_ts_us, max_ts_us)
    return ts, topics, keys, values


_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1

_HEADERS_COLUMN: Final = FRAME_SCHEMA.get_field_index("headers")

_SHARED_ROWS: Final = 1 << 16


class _SharedColumn:
    """A constant column built once (and again, longer, when a longer one is asked for);
    the columns handed out are slices of it."""

    def __init__(self, make: Callable[[int], pa.Array]) -> None:
        self._make = make
        self._array: pa.Array | None = None
        self._data: pa.Buffer | None = None

    def take(self, n: int) -> pa.Array:
        array = self._array
        if array is None or len(array) < n:
            array = self._array = self._make(max(n, _SHARED_ROWS))
            self._data = array.buffers()[1]
        return array.slice(0, n)

    def holds(self, column: pa.Array) -> bool:
        """Whether ``column`` is a slice of the current array (compared by data buffer; an
        array replaced by a longer one no longer counts, which only costs the caller a read)."""
        data = self._data
        if data is None:
            return False
        mine = column.buffers()[1]
        return mine is not None and mine.address == data.address


def _null_map(n: int) -> pa.Array:
    # From buffers: ``pa.array([None] * n)`` builds a list of n Nones (1-20 ms at 64k rows,
    # in the first append of a process).
    return pa.MapArray.from_arrays(
        pa.array(np.zeros(n + 1, np.int32)),
        pa.array([], HEADERS_TYPE.key_type),
        pa.array([], HEADERS_TYPE.item_type),
        type=HEADERS_TYPE,
        mask=pa.array(np.ones(n, np.bool_)),
    )


# All-null headers columns are slices of one array: ``pa.nulls`` of a map type makes Arrow IPC
# write offsets for every row of the parent into each frame cut from it.
_NULL_HEADERS: Final = _SharedColumn(_null_map)
_ZERO_STREAMS: Final = _SharedColumn(lambda n: pa.array(np.zeros(n, np.uint32)))


def null_headers(n: int) -> pa.Array:
    """An all-null headers column of ``n`` rows that serialises compactly, also when sliced."""
    return _NULL_HEADERS.take(n)


def zero_streams(n: int) -> pa.Array:
    """A ``stream`` column of ``n`` zeros (a slice of one array built once)."""
    return _ZERO_STREAMS.take(n)


def is_zero_streams(column: pa.Array) -> bool:
    """Whether ``column`` is (a slice of) what :func:`zero_streams` handed out: all zeros,
    known without reading it (``False`` says nothing)."""
    return _ZERO_STREAMS.holds(column)


def _carries_children(column: pa.Array) -> bool:
    """Whether an all-null map column holds child buffers it does not need (``pa.nulls`` makes
    them one entry per row; IPC writes them, for a slice those of the whole parent)."""
    return any(b is not None and b.size > 64 for b in column.buffers()[2:])


def table_to_batch(
    data: pa.Table | pa.RecordBatch,
    *,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    default_ts_us: int | None = None,
    min_ts_us: int | None = None,
    max_ts_us: int | None = None,
) -> pa.RecordBatch:
    """Validate caller columns (``ts, topic, key, value[, headers][, stream]``) into a frame batch.

    ``ts`` and ``key`` may be missing or null (``ts`` is then assigned as in
    :func:`records_to_batch`); ``ts`` may be an integer column (µs since 1970) or an Arrow
    timestamp of any unit. The column types are cast to the frame schema. Raises the same
    errors as :func:`records_to_batch`.
    """
    if isinstance(data, pa.Table):
        batches = data.combine_chunks().to_batches()
        data = batches[0] if batches else _empty_like(data)
    names = set(data.schema.names)
    unknown = names - set(READ_SCHEMA.names)
    if unknown:
        raise InvalidRecord(f"unexpected columns {sorted(unknown)}")
    for required in ("topic", "value"):
        if required not in names:
            raise InvalidRecord(f"missing column {required!r}")
    n = data.num_rows

    def column(name: str, typ: pa.DataType, error: type[InvalidRecord]) -> pa.Array:
        arr = data.column(name)
        if arr.type == typ:
            return arr
        if name in ("value", "key") and not (
            pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type) or pa.types.is_null(arr.type)
        ):
            raise error(f"column {name!r} must be binary, not {arr.type}")
        try:
            return arr.cast(typ)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise error(f"column {name!r} of type {arr.type} is not convertible to {typ}") from exc

    topics = column("topic", pa.string(), InvalidTopic)
    _check_topics(topics, _first_true)
    values = column("value", pa.binary(), InvalidValue)
    _check_values(values, max_record_bytes)
    if "ts" in names:
        ts_type = data.column("ts").type
        if pa.types.is_timestamp(ts_type):
            ts = data.column("ts").cast(pa.timestamp("us", ts_type.tz), safe=False).cast(pa.int64())
        else:
            ts = column("ts", pa.int64(), InvalidRecord)
        if ts.null_count:
            ts = pc.coalesce(ts, _stamps(now_us() if default_ts_us is None else default_ts_us, n))
    else:
        ts = _stamps(now_us() if default_ts_us is None else default_ts_us, n)
    _check_ts_range(ts, min_ts_us, max_ts_us)
    keys = column("key", pa.binary(), InvalidKey) if "key" in names else pa.nulls(n, pa.binary())
    headers = column("headers", HEADERS_TYPE, InvalidHeaders) if "headers" in names else null_headers(n)
    streams = column("stream", pa.uint32(), InvalidRecord) if "stream" in names else zero_streams(n)
    return _frame_batch(ts=ts, topic=topics, key=keys, value=values, headers=headers, stream=streams)


def _frame_batch(**columns: pa.Array) -> pa.RecordBatch:
    """A batch with :data:`FRAME_SCHEMA` from its columns given by name."""
    return pa.RecordBatch.from_arrays([columns[name] for name in FRAME_SCHEMA.names], schema=FRAME_SCHEMA)


def _empty_like(table: pa.Table) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], type=f.type) for f in table.schema], schema=table.schema)


# --- frames ----------------------------------------------------------------------------


_ZSTD_COMPRESSOR = zstandard.ZstdCompressor(level=_ZSTD_LEVEL)


def encode_frame(
    batch: pa.RecordBatch,
    base_offset: int,
    *,
    compression: int = COMPRESSION_NONE,
    leader_epoch: int = 0,
    producer: tuple[int, int, int] | None = None,
) -> EncodedFrame:
    """Encode one batch (with :data:`FRAME_SCHEMA`) as a frame starting at ``base_offset``.

    ``producer``: ``(producer id, producer epoch, base sequence)`` of an idempotent
    producer's rows (checked by the caller), or ``None``.
    """
    if batch.num_rows == 0:
        raise InvalidArgument("a frame holds at least one record")
    headers = batch.column(_HEADERS_COLUMN)
    if headers.null_count == batch.num_rows and _carries_children(headers):
        # A slice of an all-null map made elsewhere (pa.nulls) would carry its parent's
        # offsets into the frame: the frame gets a compact one of its own.
        batch = batch.set_column(
            _HEADERS_COLUMN, FRAME_SCHEMA.field(_HEADERS_COLUMN), null_headers(batch.num_rows)
        )
    raw = batch.serialize()
    raw_len = raw.size
    if compression == COMPRESSION_ZSTD:
        body: Any = _ZSTD_COMPRESSOR.compress(raw)
        body_len = len(body)
    elif compression == COMPRESSION_NONE:
        body = raw
        body_len = raw_len
    else:
        raise InvalidArgument(f"unknown compression code {compression}")
    if body_len > MAX_FRAME_BODY_BYTES:
        raise InvalidArgument(f"frame body of {body_len} bytes exceeds {MAX_FRAME_BODY_BYTES}")
    ts = batch.column("ts")  # never null in a frame batch
    ts_values = np.frombuffer(ts.buffers()[1], np.int64, batch.num_rows, ts.offset * 8)
    min_ts = int(ts_values.min())
    max_ts = int(ts_values.max())
    return _sealed(
        body,
        body_len,
        raw_len,
        compression,
        base_offset,
        batch.num_rows,
        leader_epoch,
        min_ts,
        max_ts,
        producer,
    )


def _sealed(
    body: Any,
    body_len: int,
    raw_len: int,
    compression: int,
    base_offset: int,
    rows: int,
    leader_epoch: int,
    min_ts: int,
    max_ts: int,
    producer: tuple[int, int, int] | None,
) -> EncodedFrame:
    """A frame around an encoded ``body``: its header (CRC over the header and the body) and padding."""
    pid, pepoch, seq = (NO_PRODUCER, NO_PRODUCER, NO_PRODUCER) if producer is None else producer
    fields = (
        FORMAT_VERSION,
        compression,
        pepoch,
        base_offset,
        rows,
        leader_epoch,
        min_ts,
        max_ts,
        body_len,
        raw_len,
        seq,
        pid,
    )
    packed = _HEADER.pack(FRAME_MAGIC, 0, *fields)
    crc = crc32c.crc32c(body, crc32c.crc32c(memoryview(packed)[_CRC_START:]))
    header_bytes = _HEADER.pack(FRAME_MAGIC, crc, *fields)
    header = FrameHeader(
        crc,
        FORMAT_VERSION,
        compression,
        base_offset,
        rows,
        leader_epoch,
        min_ts,
        max_ts,
        body_len,
        raw_len,
        pid,
        pepoch,
        seq,
    )
    pad = _PADDING[-body_len & 7]
    buffers: tuple[Any, ...] = (header_bytes, body, pad) if pad else (header_bytes, body)
    return EncodedFrame(header, buffers)


def encode_frames(
    batch: pa.RecordBatch,
    starts: Sequence[int],
    lengths: Sequence[int],
    bases: Sequence[int],
    *,
    compression: int = COMPRESSION_NONE,
    leader_epoch: int = 0,
    producers: Sequence[tuple[int, int, int] | None] | None = None,
) -> list[EncodedFrame]:
    """``encode_frame(batch.slice(start, length), base, ...)`` for each slice, byte for byte.

    The per-frame work that does not need the frame's own bytes is done once for all of them:
    the timestamps' minimum and maximum (one NumPy reduction each over the whole batch) and
    the check of the headers column (slices share their parent's buffers). A flush of many
    shards' small frames spent more on that than on serialising the rows.

    Raises:
        InvalidArgument: A slice is empty, or a body exceeds :data:`MAX_FRAME_BODY_BYTES`.
    """
    count = len(starts)
    if not count:
        return []
    lo = np.asarray(starts, np.int64)
    n = np.asarray(lengths, np.int64)
    if bool((n <= 0).any()):
        raise InvalidArgument("a frame holds at least one record")
    headers = batch.column(_HEADERS_COLUMN)
    if compression not in (COMPRESSION_NONE, COMPRESSION_ZSTD) or _carries_children(headers):
        # Rare: let the one-frame path fix the headers column (or refuse the compression).
        return [
            encode_frame(
                batch.slice(a, b),
                base,
                compression=compression,
                leader_epoch=leader_epoch,
                producer=None if producers is None else producers[i],
            )
            for i, (a, b, base) in enumerate(zip(lo.tolist(), n.tolist(), bases, strict=True))
        ]
    ts = batch.column("ts")  # never null in a frame batch
    ts_values = np.frombuffer(ts.buffers()[1], np.int64, batch.num_rows, ts.offset * 8)
    mins = np.minimum.reduceat(ts_values, lo).tolist()
    maxs = np.maximum.reduceat(ts_values, lo).tolist()
    if int(lo[-1] + n[-1]) != batch.num_rows or (count > 1 and bool((lo[1:] != lo[:-1] + n[:-1]).any())):
        # reduceat reduces up to the next start: exact only for slices that tile the batch.
        ends = lo + n
        mins = [int(ts_values[a:b].min()) for a, b in zip(lo.tolist(), ends.tolist(), strict=True)]
        maxs = [int(ts_values[a:b].max()) for a, b in zip(lo.tolist(), ends.tolist(), strict=True)]
    zstd = compression == COMPRESSION_ZSTD
    out: list[EncodedFrame] = []
    for i, (a, rows, base) in enumerate(zip(lo.tolist(), n.tolist(), bases, strict=True)):
        raw = batch.slice(a, rows).serialize()
        raw_len = raw.size
        body: Any = _ZSTD_COMPRESSOR.compress(raw) if zstd else raw
        body_len = len(body) if zstd else raw_len
        if body_len > MAX_FRAME_BODY_BYTES:
            raise InvalidArgument(f"frame body of {body_len} bytes exceeds {MAX_FRAME_BODY_BYTES}")
        producer = None if producers is None else producers[i]
        out.append(
            _sealed(
                body, body_len, raw_len, compression, base, rows, leader_epoch, mins[i], maxs[i], producer
            )
        )
    return out


def parse_header(buf: Any, pos: int = 0) -> FrameHeader:
    """Decode and sanity-check a frame header at ``buf[pos:]``.

    Raises:
        CorruptFrame: Short buffer, bad magic, unknown version or implausible lengths.
    """
    available = len(buf) - pos
    if available < FRAME_HEADER_BYTES_V1:
        raise CorruptFrame(f"short frame header at position {pos}")
    magic, crc, version, compression, pepoch, base, count, epoch, min_ts, max_ts, body_len, raw_len, seq = (
        _HEADER_V1.unpack_from(buf, pos)
    )
    if magic != FRAME_MAGIC:
        raise CorruptFrame(f"bad frame magic {magic!r} at position {pos}")
    if version == FORMAT_VERSION:
        if available < FRAME_HEADER_BYTES:
            raise CorruptFrame(f"short frame header at position {pos}")
        pid = _PRODUCER_ID.unpack_from(buf, pos + FRAME_HEADER_BYTES_V1)[0]
    elif version == FORMAT_VERSION_1:
        pid = pepoch = seq = NO_PRODUCER
    else:
        raise CorruptFrame(f"unknown frame format version {version} at position {pos}")
    if compression not in (COMPRESSION_NONE, COMPRESSION_ZSTD):
        raise CorruptFrame(f"unknown compression {compression} at position {pos}")
    if body_len > MAX_FRAME_BODY_BYTES or raw_len > MAX_FRAME_BODY_BYTES or count == 0:
        raise CorruptFrame(f"implausible frame lengths at position {pos}")
    return FrameHeader(
        crc, version, compression, base, count, epoch, min_ts, max_ts, body_len, raw_len, pid, pepoch, seq
    )


def verify_frame(buf: Any, pos: int, header: FrameHeader) -> None:
    """Check that the whole frame is present and its CRC matches.

    Raises:
        CorruptFrame: The frame is truncated or its checksum does not match.
    """
    body = pos + header.header_bytes
    end = body + header.body_len
    if len(buf) < end:
        raise CorruptFrame(f"truncated frame at position {pos}")
    view = memoryview(buf)
    crc = crc32c.crc32c(view[pos + _CRC_START : body])
    crc = crc32c.crc32c(view[body:end], crc)
    if crc != header.crc:
        raise CorruptFrame(f"frame CRC mismatch at position {pos} (base offset {header.base_offset})")


def decode_body(buf: Any, pos: int, header: FrameHeader) -> pa.RecordBatch:
    """Decode the Arrow batch of a frame at ``pos`` (zero-copy when uncompressed).

    Raises:
        CorruptFrame: The body is not a valid batch of the frame schema.
    """
    start = pos + header.header_bytes
    body = memoryview(buf)[start : start + header.body_len]
    try:
        if header.compression == COMPRESSION_ZSTD:
            raw = pa.py_buffer(zstandard.ZstdDecompressor().decompress(body, max_output_size=header.raw_len))
        else:
            raw = pa.py_buffer(body)
        batch = pa.ipc.read_record_batch(raw, FRAME_SCHEMA)
    except (pa.ArrowInvalid, zstandard.ZstdError, OSError) as exc:
        raise CorruptFrame(f"undecodable frame body at position {pos}") from exc
    if batch.num_rows != header.record_count:
        raise CorruptFrame(
            f"frame at position {pos} holds {batch.num_rows} rows, header says {header.record_count}"
        )
    return batch


def decode_frames(buf: Any, lower: int = 0, upper: int | None = None) -> pa.Table:
    """The records with offsets in ``[lower, upper)`` of a run of whole frames (a fetch reply).

    Every frame's magic, lengths and CRC are checked; bodies decode zero-copy unless
    compressed. The result has :data:`READ_SCHEMA` (an ``offset`` column first).

    Raises:
        CorruptFrame: A frame fails its checks or the data ends inside one.
    """
    view = memoryview(buf).cast("B")
    batches: list[pa.RecordBatch] = []
    pos = 0
    while pos < len(view):
        header = parse_header(view, pos)
        verify_frame(view, pos, header)
        first = max(lower, header.base_offset)
        last = header.next_offset if upper is None else min(upper, header.next_offset)
        if first < last:
            batch = decode_body(view, pos, header)
            rows = batch.slice(first - header.base_offset, last - first)
            offsets = pa.array(np.arange(first, last, dtype=np.int64))
            batches.append(pa.RecordBatch.from_arrays([offsets, *rows.columns], schema=READ_SCHEMA))
        pos += header.size
    return pa.Table.from_batches(batches, schema=READ_SCHEMA)


# --- back to Python objects ------------------------------------------------------------


def _py_list(column: pa.Array | pa.ChunkedArray) -> list[Any]:
    """A column as a list of Python objects, like ``to_pylist`` but in one pass through NumPy.

    Binary and string columns become object arrays of ``bytes``/``str`` (``None`` for nulls);
    numbers go through NumPy only without nulls (NumPy would turn them into NaN).
    """
    n = len(column)
    nulls = column.null_count
    if nulls == n:
        return [None] * n
    if nulls and not (pa.types.is_binary(column.type) or pa.types.is_string(column.type)):
        return column.to_pylist()  # type: ignore[no-any-return]
    out: list[Any] = column.to_numpy(zero_copy_only=False).tolist()
    return out


def _headers_list(headers: pa.Array | pa.ChunkedArray) -> list[dict[str, bytes] | None]:
    n = len(headers)
    if headers.null_count == n:
        return [None] * n
    return [None if h is None else dict(h) for h in headers.to_pylist()]


def records_from_table(table: pa.Table | pa.RecordBatch, shard: int) -> list[Record]:
    """Build :class:`Record` objects from a read table (with an ``offset`` column).

    Each column becomes a list of Python objects in one bulk conversion; the records are then
    allocated without running ``Record.__init__`` and their slots filled directly (the same
    values ``Record(...)`` would hold).
    """
    n = table.num_rows
    if n == 0:
        return []
    column = table.column
    with gc_paused(n):
        topics = _py_list(column("topic"))
        values = _py_list(column("value"))
        ts = _py_list(column("ts"))
        keys = _py_list(column("key"))
        headers = _headers_list(column("headers"))
        offsets = _py_list(column("offset"))
        out: list[Record] = list(map(_new_object, repeat(Record, n)))
        for r, topic, value, t, key, h, offset in zip(
            out, topics, values, ts, keys, headers, offsets, strict=True
        ):
            r.topic = topic
            r.value = value
            r.ts = t
            r.key = key
            r.headers = h
            r.shard = shard
            r.offset = offset
    return out


_new_object = object.__new__
