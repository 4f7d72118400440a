"""The stamper's vectorised ``(shard, topic) -> stream`` cache gives exactly what the tries give.

A reference learns every row with a plain :class:`~seglog.topics.LTS` per shard, one topic at a
time in offset order (EMQX's rules); the stamper must return the same stream ids for random
topic sets with repeats, new topics mid-batch, many shards, cuts, and hash collisions forced
by cache keys of a few bits.
"""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seglog.errors import InvalidArgument
from seglog.topics import LTS
from seglog.topics.streams import StreamStamper, topic_hashes

LONG = "x" * 70  # over 64 bytes: read by length class
LEVELS = ["a", "b", "dev1", "dev22", "sensor", "é", "", LONG, "t" * 9, "0123456"]


def _topic(rng: random.Random) -> str:
    levels = [rng.choice(LEVELS) for _ in range(rng.randint(1, 5))]
    topic = "/".join(levels) or "z"
    return ("$SYS/" + topic) if rng.random() < 0.1 else topic


class _Reference:
    """Per-shard tries fed row by row, with the history a cut replays."""

    def __init__(self, shards: int, thresholds: list[int]) -> None:
        self.thresholds = thresholds
        self.history: list[list[str]] = [[] for _ in range(shards)]
        self.tries = [LTS(thresholds, cache_size=0) for _ in range(shards)]

    def stamp(self, topics: list[str], shards: list[int]) -> list[int]:
        out = []
        for topic, shard in zip(topics, shards, strict=True):
            self.history[shard].append(topic)
            out.append(self.tries[shard].learn_stream(topic))
        return out

    def cut(self, shard: int, offset: int) -> None:
        kept = self.history[shard][:offset]
        self.history[shard] = []
        self.tries[shard] = LTS(self.thresholds, cache_size=0)
        self.stamp(kept, [shard] * len(kept))


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    shards=st.sampled_from([1, 3, 16]),
    key_bits=st.sampled_from([64, 3, 1]),
    thresholds=st.sampled_from([[100, 10], [2, 1], [3]]),
    pool_size=st.integers(1, 60),
    batches=st.integers(1, 12),
)
def test_cache_gives_the_tries_streams(
    seed: int, shards: int, key_bits: int, thresholds: list[int], pool_size: int, batches: int
) -> None:
    rng = random.Random(seed)
    pool = list({_topic(rng) for _ in range(pool_size)})
    stamper = StreamStamper(shards, thresholds, key_bits=key_bits)
    ref = _Reference(shards, thresholds)
    ends = [0] * shards
    for _ in range(batches):
        if rng.random() < 0.3:  # new topics join mid-run, some mid-batch
            pool += [_topic(rng) for _ in range(rng.randint(1, 10))]
        n = rng.randint(1, 80)
        topics = [rng.choice(pool) for _ in range(n)]
        if shards == 1 or rng.random() < 0.3:
            shard = rng.randrange(shards)
            got = stamper.stamp(pa.array(topics, pa.string()), shard, ends[shard])
            ends[shard] += n
            want = ref.stamp(topics, [shard] * n)
        else:
            routes = [rng.randrange(shards) for _ in range(n)]
            offsets = []
            for r in routes:
                offsets.append(ends[r])
                ends[r] += 1
            array = pa.array(["pad", *topics], pa.string()).slice(1)  # a sliced column too
            got = stamper.stamp(array, np.array(routes, np.int32), np.array(offsets, np.int64))
            want = ref.stamp(topics, routes)
        assert got.dtype == np.uint32
        assert got.tolist() == want
        if rng.random() < 0.2:  # a failed write's offsets handed out again
            shard = rng.randrange(shards)
            offset = rng.randint(0, ends[shard])
            stamper.cut(shard, offset)
            ref.cut(shard, offset)
            ends[shard] = offset
    for shard in range(shards):
        assert stamper.lts_bytes(shard) == ref.tries[shard].to_bytes()


def test_known_topics_skip_the_tries() -> None:
    """A fleet re-sending its topics is served by the cache alone; forced collisions are still exact."""
    topics = [f"fleet/site{i % 7}/dev{i:05d}/temp" for i in range(2000)] + ["a", LONG + "/b", "é"]
    column = pa.array(topics, pa.string())
    routes = np.arange(len(topics), dtype=np.int32) % 4
    stamper = StreamStamper(4, [100, 10])
    first = stamper.stamp(column, routes, np.arange(len(topics), dtype=np.int64))
    assert stamper.trie_rows == len(topics)
    assert stamper.cached_topics == len(topics)
    order = np.random.default_rng(1).permutation(len(topics))
    again = stamper.stamp(
        column.take(pa.array(order)), routes[order], np.arange(len(topics), 2 * len(topics))
    )
    assert again.tolist() == first[order].tolist()
    assert stamper.trie_rows == len(topics)  # no row walked a trie

    tiny = StreamStamper(4, [100, 10], key_bits=2)  # 3 keys: nearly every topic collides
    first_tiny = tiny.stamp(column, routes, np.arange(len(topics), dtype=np.int64))
    again_tiny = tiny.stamp(
        column.take(pa.array(order)), routes[order], np.arange(len(topics), 2 * len(topics))
    )
    assert first_tiny.tolist() == first.tolist() and again_tiny.tolist() == again.tolist()
    assert tiny.cached_topics <= 3
    assert tiny.trie_rows > 2 * len(topics) - 10


def test_topic_hashes_depend_on_the_bytes_only() -> None:
    rng = random.Random(7)
    values = [
        "".join(rng.choice("ab/é+") for _ in range(rng.choice([0, 1, 7, 8, 9, 16, 17, 64, 65, 300])))
        for _ in range(500)
    ]
    h = topic_hashes(pa.array(values, pa.string()))
    by_value: dict[str, int] = {}
    for value, x in zip(values, h.tolist(), strict=True):
        assert by_value.setdefault(value, x) == x
    assert len(set(by_value.values())) == len(by_value)  # no collision among these
    for i in range(0, 500, 37):
        assert topic_hashes(pa.array(values, pa.string()).slice(i, 40)).tolist() == h[i : i + 40].tolist()
        assert (
            topic_hashes(pa.array(values[i : i + 40], pa.large_string())).tolist() == h[i : i + 40].tolist()
        )
        assert topic_hashes(pa.array(values[i : i + 1], pa.string())).tolist() == h[i : i + 1].tolist()
    assert topic_hashes(pa.array([], pa.string())).tolist() == []


def test_key_bits_are_checked() -> None:
    with pytest.raises(InvalidArgument):
        StreamStamper(1, [100, 10], key_bits=0)
