from __future__ import annotations

import struct

import crc32c
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seglog import record
from seglog.errors import CorruptFrame
from seglog.record import (
    COMPRESSION_NONE,
    COMPRESSION_ZSTD,
    FRAME_HEADER_BYTES,
    MAX_TOPIC_BYTES,
    Record,
    decode_body,
    decode_frames,
    encode_frame,
    parse_header,
    records_from_table,
    records_to_batch,
    verify_frame,
)

topic_level = st.text(
    alphabet=st.characters(blacklist_characters="+#/\x00", blacklist_categories=("Cs",)),
    min_size=0,
    max_size=12,
)
topics = st.lists(topic_level, min_size=1, max_size=5).map("/".join).filter(lambda t: t != "")
records = st.builds(
    Record,
    topic=topics,
    value=st.binary(max_size=300),
    ts=st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1),
    key=st.none() | st.binary(max_size=40),
    headers=st.none() | st.dictionaries(st.text(max_size=8), st.binary(max_size=16), max_size=3),
)


def _round_trip(recs: list[Record], compression: int, base: int) -> list[Record]:
    batch = records_to_batch(recs)
    frame = encode_frame(batch, base, compression=compression, leader_epoch=7)
    buf = b"".join(bytes(b) for b in frame.buffers)
    assert len(buf) == frame.size and len(buf) % 8 == 0
    header = parse_header(buf, 0)
    assert header == frame.header
    assert (header.base_offset, header.record_count, header.leader_epoch) == (base, len(recs), 7)
    assert header.min_ts == min(r.ts for r in recs) and header.max_ts == max(r.ts for r in recs)  # type: ignore[type-var]
    verify_frame(buf, 0, header)
    decoded = decode_body(buf, 0, header)
    table = pa.Table.from_batches([decoded]).add_column(
        0, "offset", pa.array(range(base, base + len(recs)), pa.int64())
    )
    return records_from_table(table, shard=3)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(records, min_size=1, max_size=20),
    st.sampled_from([COMPRESSION_NONE, COMPRESSION_ZSTD]),
    st.integers(0, 1 << 40),
)
def test_frame_round_trip(recs: list[Record], compression: int, base: int) -> None:
    out = _round_trip(recs, compression, base)
    for i, (a, b) in enumerate(zip(recs, out, strict=True)):
        assert b.offset == base + i and b.shard == 3
        assert (b.topic, b.value, b.ts, b.key) == (a.topic, a.value, a.ts, a.key)
        assert (b.headers or None) == (a.headers or None)


def test_max_sizes_round_trip() -> None:
    big_topic = "a/" + "é" * ((MAX_TOPIC_BYTES - 2) // 2)
    assert len(big_topic.encode()) <= MAX_TOPIC_BYTES
    recs = [Record(topic=big_topic, value=b"\xff" * (1 << 20), ts=1), Record(topic="x", value=b"", ts=2)]
    out = _round_trip(recs, COMPRESSION_ZSTD, 0)
    assert out[0].topic == big_topic and out[0].value == recs[0].value and out[1].value == b""


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_any_flipped_byte_is_detected(data: st.DataObject) -> None:
    recs = [Record(topic="s/1", value=b"v" * 50, ts=5, key=b"k"), Record(topic="s/2", value=b"w", ts=6)]
    frame = encode_frame(records_to_batch(recs), 10)
    buf = bytearray(b"".join(bytes(b) for b in frame.buffers))
    body_end = FRAME_HEADER_BYTES + frame.header.body_len
    i = data.draw(st.integers(0, body_end - 1))
    buf[i] ^= data.draw(st.integers(1, 255))
    with pytest.raises(CorruptFrame):
        h = parse_header(buf, 0)
        verify_frame(buf, 0, h)


def test_header_offsets_are_the_packed_layout() -> None:
    """The offsets derived with ``struct.calcsize`` are where ``_HEADER.pack`` puts each field."""
    fields = record._HEADER_FIELDS
    values = [
        b"SGLF",
        0x01020304,
        5,
        6,
        -0x0708,
        -(2**40) - 9,
        0x0A0B0C0D,
        -14,
        2**50 + 15,
        2**51 + 16,
        17,
        18,
        19,
        -(2**60) - 20,
    ]
    packed = record._HEADER.pack(*values)
    assert len(packed) == FRAME_HEADER_BYTES == 64
    offsets = record._HEADER_OFFSETS
    assert list(offsets) == [name for name, _ in fields]
    for (name, fmt), value in zip(fields, values, strict=True):
        assert struct.unpack_from("<" + fmt, packed, offsets[name]) == (value,), name
    ends = [*list(offsets.values())[1:], FRAME_HEADER_BYTES]
    assert all(
        end - start == struct.calcsize("<" + fmt)
        for (_, fmt), start, end in zip(fields, offsets.values(), ends, strict=True)
    )
    assert record._CRC_START == offsets["crc"] + 4 == 8
    # The table in the module docstring shows the same offsets.
    documented = [
        int(line.split()[0]) for line in (record.__doc__ or "").splitlines() if line[:5].strip().isdigit()
    ]
    assert documented[: len(fields)] == list(offsets.values())


def test_frame_header_bytes_are_unchanged() -> None:
    recs = [Record(topic="a/b", value=b"v%d" % i, ts=1_700_000_000_000_000 + i) for i in range(3)]
    frame = encode_frame(records_to_batch(recs), 1234567890123, leader_epoch=-5)
    header = bytes(frame.buffers[0])
    # magic | crc (depends on the Arrow body) | version, compression, producer epoch, base
    # offset, count, epoch, min ts, max ts | body lengths (depend on the Arrow body) | base
    # sequence, producer id (-1: no producer)
    assert header[:4] == b"SGLF"
    assert header[8:44].hex() == "0200ffffcb04fb711f01000003000000fbffffff00401e18240a060002401e18240a0600"
    assert struct.unpack_from("<II", header, 44) == (len(bytes(frame.buffers[1])),) * 2
    assert header[52:] == b"\xff" * 12
    assert (
        crc32c.crc32c(frame.buffers[1], crc32c.crc32c(header[8:])) == struct.unpack_from("<I", header, 4)[0]
    )


def _as_version_1(frame: bytes) -> bytes:
    """The same frame as format version 1 wrote it: a 56-byte header, reserved fields 0."""
    v1 = bytearray(frame[:52]) + b"\0" * 4 + frame[FRAME_HEADER_BYTES:]
    v1[8] = 1
    v1[10:12] = b"\0\0"
    struct.pack_into("<I", v1, 4, crc32c.crc32c(bytes(v1[8:])))
    return bytes(v1)


def test_version_1_frames_are_still_read() -> None:
    """Logs written before the producer fields (56-byte headers) read, verify and decode."""
    recs = [Record(topic="a/b", value=b"v%d" % i, ts=1_700_000_000_000_000 + i) for i in range(3)]
    frames = [encode_frame(records_to_batch(recs), base) for base in (10, 13)]
    v2 = [b"".join(bytes(b) for b in f.buffers) for f in frames]
    v1 = [_as_version_1(f) for f in v2]
    assert [len(a) - len(b) for a, b in zip(v2, v1, strict=True)] == [8, 8]
    buf = v1[0] + v2[1]  # a log written across the upgrade
    first = parse_header(buf, 0)
    assert (first.version, first.header_bytes, first.size) == (1, 56, len(v1[0]))
    assert (first.producer_id, first.producer_epoch, first.base_sequence) == (-1, -1, -1)
    second = parse_header(buf, first.size)
    assert (second.version, second.header_bytes) == (2, 64)
    table = decode_frames(buf)
    assert table.column("offset").to_pylist() == list(range(10, 16))
    assert table.column("value").to_pylist() == [r.value for r in recs] * 2
    flipped = bytearray(buf)
    flipped[60] ^= 1  # a body byte of the version 1 frame
    with pytest.raises(CorruptFrame):
        decode_frames(bytes(flipped))


def test_producer_fields_round_trip_and_are_checksummed() -> None:
    recs = [Record(topic="a/b", value=b"v", ts=1_700_000_000_000_000)]
    frame = encode_frame(records_to_batch(recs), 7, producer=(2**40 + 3, 5, 2**31 - 9))
    buf = b"".join(bytes(b) for b in frame.buffers)
    header = parse_header(buf)
    assert header == frame.header
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (2**40 + 3, 5, 2**31 - 9)
    damaged = bytearray(buf)
    damaged[57] ^= 1  # inside the producer id
    with pytest.raises(CorruptFrame):
        verify_frame(bytes(damaged), 0, parse_header(bytes(damaged)))
