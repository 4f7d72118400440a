from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import seglog
from seglog._routing import routing_hash, routing_hashes, shard_for


@settings(max_examples=100, deadline=None)
@given(st.lists(st.none() | st.binary(max_size=80), min_size=1, max_size=40), st.integers(0, 5))
def test_vectorised_hash_equals_scalar(values: list[bytes | None], cut: int) -> None:
    arr = pa.array(values, pa.binary()).slice(min(cut, len(values) - 1))
    want = [routing_hash(v or b"") for v in arr.to_pylist()]
    assert routing_hashes(arr).tolist() == want


def test_topics_hash_as_utf8_and_spread_evenly() -> None:
    topics = [f"sensors/é{i}/temp" for i in range(4000)]
    assert routing_hashes(pa.array(topics)).tolist() == [routing_hash(t.encode()) for t in topics]
    counts = Counter(shard_for(f"dev{i}".encode(), 4) for i in range(4000))
    assert min(counts.values()) > 900


# Pinned routing: computed once from seglog._routing (2026-11-23) and written out literally.
# Existing databases route every key and topic with this function, so a change to any value
# here silently moves keys to other shards: it needs a migration, not a new expected value.
PINNED_SHARD_COUNTS = (1, 2, 3, 4, 7, 16, 4096, 10000)
PINNED: list[tuple[bytes, int, tuple[int, ...]]] = [
    # (routing bytes, routing_hash, shard for each of PINNED_SHARD_COUNTS)
    (b"", 0x0000000000000000, (0, 0, 0, 0, 0, 0, 0, 0)),
    (b"\x00", 0x0000000000000000, (0, 0, 0, 0, 0, 0, 0, 0)),  # leading NULs do not change the hash
    (b"a", 0x685FDF50E51FA977, (0, 1, 0, 3, 4, 7, 2423, 2855)),
    (b"device-42", 0xDDE419BCF053274D, (0, 1, 0, 1, 5, 13, 1869, 861)),
    (b"sensors/1/2/temp", 0xE2BA8FF666CE3FFB, (0, 1, 1, 3, 3, 11, 4091, 5163)),
    (b"\xff" * 8, 0x37B2765C7499C84D, (0, 1, 2, 1, 5, 13, 2125, 7389)),
    ("é".encode(), 0x2CAA8742FCE6AE61, (0, 1, 1, 1, 5, 1, 3681, 8353)),
    ("sensors/é/温度".encode(), 0xEA894AF8B5A169C6, (0, 0, 0, 2, 2, 6, 2502, 6198)),
    ("🚀".encode(), 0xA5CF5760617CA8E5, (0, 1, 0, 1, 4, 5, 2277, 1813)),
    (b"x" * 1000, 0xFCF8DA67BCC31003, (0, 1, 2, 3, 5, 3, 3, 9443)),
    (bytes(range(256)) * 4, 0x6BE6D96E88EE8B25, (0, 1, 2, 1, 0, 5, 2853, 4549)),
    ("κλειδί-".encode() * 50, 0xBC0D33EBCBCFD7BE, (0, 0, 0, 2, 2, 14, 1982, 7662)),
    (b"k" * 100_000, 0x01715E0CC090E887, (0, 1, 2, 3, 6, 7, 2183, 2743)),
]
_IDS = [f"{i}-{len(data)}B" for i, (data, _, _) in enumerate(PINNED)]


@pytest.mark.parametrize(("data", "want_hash", "want_shards"), PINNED, ids=_IDS)
def test_pinned_routing_hash_and_shards(data: bytes, want_hash: int, want_shards: tuple[int, ...]) -> None:
    assert routing_hash(data) == want_hash
    assert tuple(shard_for(data, n) for n in PINNED_SHARD_COUNTS) == want_shards


def test_pinned_vectorised_hashes() -> None:
    values = [data for data, _, _ in PINNED]
    want = [h for _, h, _ in PINNED]
    assert routing_hashes(pa.array(values, pa.binary())).tolist() == want
    # A sliced column (non-zero offset) and a reversed order hash the same bytes the same way.
    assert routing_hashes(pa.array([b"pad", *values], pa.binary()).slice(1)).tolist() == want
    assert routing_hashes(pa.array(values[::-1], pa.binary())).tolist() == want[::-1]
    texts = [data.decode() for data, _, _ in PINNED if _is_utf8(data)]
    assert routing_hashes(pa.array(texts, pa.string())).tolist() == [h for d, h, _ in PINNED if _is_utf8(d)]


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


def _topic_ok(data: bytes) -> bool:
    return (
        0 < len(data) <= 65535
        and _is_utf8(data)
        and b"\x00" not in data
        and b"+" not in data
        and b"#" not in data
    )


@pytest.mark.parametrize("shards", [7, 16])
def test_pinned_routing_end_to_end(run, data_dir: Path, shards: int) -> None:
    column = PINNED_SHARD_COUNTS.index(shards)

    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("r", shards=shards)
            keyed = [seglog.Record(topic="t", key=data, value=b"v") for data, _, _ in PINNED]
            got = [m.shard for m in await db.append(keyed)]
            assert got == [want[column] for _, _, want in PINNED]
            topics = [(data, want) for data, _, want in PINNED if _topic_ok(data)]
            by_topic = [seglog.Record(topic=data.decode(), value=b"v") for data, _ in topics]
            got = [m.shard for m in await db.append(by_topic)]
            assert got == [want[column] for _, want in topics]

    run(main())
