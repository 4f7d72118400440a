from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seglog.errors import CorruptFrame
from seglog.record import (
    COMPRESSION_NONE,
    COMPRESSION_ZSTD,
    FRAME_HEADER_BYTES,
    MAX_TOPIC_BYTES,
    Record,
    decode_body,
    encode_frame,
    parse_header,
    records_from_table,
    records_to_batch,
    verify_frame,
)

topic_level = st.text(
    alphabet=st.characters(blacklist_characters="+#/\x00", blacklist_categories=("Cs",)), min_size=0, max_size=12
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
    table = pa.Table.from_batches([decoded]).add_column(0, "offset", pa.array(range(base, base + len(recs)), pa.int64()))
    return records_from_table(table, shard=3)


@settings(max_examples=150, deadline=None)
@given(st.lists(records, min_size=1, max_size=20), st.sampled_from([COMPRESSION_NONE, COMPRESSION_ZSTD]), st.integers(0, 1 << 40))
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
