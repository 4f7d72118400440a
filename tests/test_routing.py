from __future__ import annotations

from collections import Counter

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

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
