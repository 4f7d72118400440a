"""The replica fetch body: round trips, errors per part, frames byte for byte, malformed input."""

from __future__ import annotations

import pytest

from seglog.cluster.fetch_wire import FetchPart, decode_reply, encode_reply
from seglog.cluster.replica_wire import PartRequest, decode_request, encode_request
from seglog.errors import InvalidRequest, NotLeader, OffsetOutOfRange


def test_request_round_trip_and_validation() -> None:
    parts = [PartRequest("a", 0, 10, 2), PartRequest("b", 7, 0, 0)]
    body = encode_request(3, parts, wait_ms=500, max_bytes=1 << 20)
    assert decode_request(body) == (3, parts, 500, 1 << 20)
    for bad in (
        b"not json",
        b"[]",
        b'{"follower": 1, "wait_ms": 0, "max_bytes": 1}',
        b'{"follower": -1, "wait_ms": 0, "max_bytes": 1, "shards": []}',
        b'{"follower": 1, "wait_ms": 0, "max_bytes": 0, "shards": []}',
        b'{"follower": 1, "wait_ms": 0, "max_bytes": 1, "shards": [{"db": "a", "shard": 0, "offset": -5, "leader_epoch": 0}]}',
        b'{"follower": 1, "wait_ms": 0, "max_bytes": 1, "shards": [{"shard": 0, "offset": 0, "leader_epoch": 0}]}',
    ):
        with pytest.raises(InvalidRequest):
            decode_request(bad)


def test_reply_round_trip_keeps_frames_and_errors() -> None:
    frames = bytes(range(256)) * 3
    parts = [
        FetchPart("a", 0, frames, high_watermark=5, log_start=0, log_end=9, leader_epoch=2),
        FetchPart("a", 1, error=NotLeader("moved", shard=1, leader=4, leader_epoch=3)),
        FetchPart("b", 2, b"", high_watermark=0, log_start=0, log_end=0, leader_epoch=0),
        FetchPart("b", 3, error=OffsetOutOfRange(99, 0, 10, shard=3)),
    ]
    got = decode_reply(encode_reply(parts))
    assert [(p.db, p.shard) for p in got] == [("a", 0), ("a", 1), ("b", 2), ("b", 3)]
    assert got[0].frames == frames and (got[0].high_watermark, got[0].log_end, got[0].leader_epoch) == (
        5,
        9,
        2,
    )
    assert isinstance(got[1].error, NotLeader)
    assert (got[1].error.leader, got[1].error.leader_epoch) == (4, 3)
    assert got[2].frames == b"" and got[2].error is None
    assert isinstance(got[3].error, OffsetOutOfRange) and got[3].error.end == 10
    body = encode_reply(parts)
    for bad in (b"", body[:-1], body + b"x", b"\x00\x00\x00\x05{bad}"):
        with pytest.raises(InvalidRequest):
            decode_reply(bad)
