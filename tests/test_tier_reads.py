"""Reads of tiered history: ranged fetches of what a read needs, each once (the read cache),
stream iterators through the tier."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import seglog
from seglog.errors import InvalidArgument
from seglog.tiering import LocalTarget, ManifestEntry, ObjectMismatch, TierCacheStats
from seglog.tiering.parquet import ROW_GROUP_ROWS
from seglog.tiering.read_cache import TierReadCache
from seglog.topics import topic_matches
from tests.test_tiering import tier_kwargs

DB = "hist"
# Two row groups per object at least: a segment holds more than ROW_GROUP_ROWS records.
RECORDS = 4 * ROW_GROUP_ROWS
SEGMENT_BYTES = 4 << 20
TS0 = 1_700_000_000_000_000
SITES = 8


def history(start: int, n: int, *, keyed: bool = False) -> pa.Table:
    """``n`` records from ``start``: topics ``site<k>/dev<d>/t`` (k = record % SITES); with
    ``keyed`` the key is ``dev<d>``."""
    i = np.arange(start, start + n)
    columns = {
        "ts": pa.array(TS0 + i, pa.int64()),
        "topic": pa.array([f"site{k % SITES}/dev{k % 97}/t" for k in i.tolist()], pa.string()),
        "value": pa.array([b"v%08d" % k for k in i.tolist()], pa.binary()),
    }
    if keyed:
        columns["key"] = pa.array([b"dev%d" % (k % 97) for k in i.tolist()], pa.binary())
    return pa.table(columns)


async def tiered_db(
    store: seglog.Store, *, lts: list[int] | None = None, keyed: bool = False
) -> tuple[seglog.Database, list[ManifestEntry]]:
    """A one-shard database whose first segments are only in the tier (local copies gone),
    and the tier's entries."""
    db = await store.create_db(
        DB, 1, segment_bytes=SEGMENT_BYTES, local_retention_bytes=0, compression="none", lts_thresholds=lts
    )
    for start in range(0, RECORDS, 10_000):
        await db.append_arrow(history(start, min(10_000, RECORDS - start), keyed=keyed), shard=0)
    entries = await db.tier_now()
    assert len(entries) >= 2, "the test needs several tiered objects"
    assert db.local_start_offset(0) > 2 * ROW_GROUP_ROWS  # most of the history is only in the tier
    assert db.start_offset(0) == 0
    return db, entries


def local_tier_store(tmp_path: Path, **kw: Any) -> seglog.Store:
    """A store over ``tmp_path/data`` tiering to the directory ``tmp_path/tier``."""
    return seglog.open(tmp_path / "data", retention_interval_ms=None, tier=(tmp_path / "tier").as_uri(), **kw)


def row_groups_of(e: ManifestEntry) -> int:
    return -(-e.rows // ROW_GROUP_ROWS)


def read_whole_bytes(entries: list[ManifestEntry]) -> tuple[int, int]:
    """(requests, bytes) that reading all of ``entries`` fetches: each footer and row group
    once (the page indexes between them are never read)."""
    requests = sum(1 + row_groups_of(e) for e in entries)
    size = sum(
        e.parts[-1].end - e.parts[-1].start + sum(p.end - p.start for p in e.parts[: row_groups_of(e)])
        for e in entries
    )
    return requests, size


async def read_sequentially(db: seglog.Database, stop: int, page: int) -> tuple[pa.Table, int]:
    tables, offset, calls = [], 0, 0
    while offset < stop:
        t = await db.read_arrow(0, offset, min(page, stop - offset))
        assert t.num_rows, offset
        tables.append(t)
        offset += t.num_rows
        calls += 1
    return pa.concat_tables(tables), calls


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_a_sequential_read_of_tiered_history_fetches_each_part_once(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    kw = tier_kwargs(kind, tmp_path, request)

    async def main() -> None:
        async with seglog.open(tmp_path / "data", retention_interval_ms=None, **kw) as store:
            db, entries = await tiered_db(store)
            cold = db.local_start_offset(0)
            objects = len(entries)
            row_groups = sum(-(-e.rows // ROW_GROUP_ROWS) for e in entries)
            assert row_groups > objects  # objects of several row groups
            got, calls = await read_sequentially(db, cold, 1000)
            assert got.column("offset").to_pylist() == list(range(cold))
            assert got.column("value").to_pylist() == history(0, cold).column("value").to_pylist()
            stats = store.tier_cache_stats()
            assert stats is not None
            assert calls >= 50 * objects  # many reads per object ...
            # ... one ranged fetch of each footer and row group
            assert (stats.downloads, stats.downloaded_bytes) == read_whole_bytes(entries)
            assert stats.row_groups_decoded == row_groups  # ... and each row group decoded once
            assert 0 < stats.cached_bytes <= stats.capacity_bytes

    asyncio.run(main())


def test_without_a_cache_every_read_fetches_its_footer_and_row_group(tmp_path: Path) -> None:
    """``tier_cache_bytes=0`` keeps nothing: what the counters count is real downloads."""

    async def main() -> None:
        async with local_tier_store(tmp_path, tier_cache_bytes=0) as store:
            db, entries = await tiered_db(store)
            _, calls = await read_sequentially(db, 20_000, 1000)
            stats = store.tier_cache_stats()
            assert stats is not None
            assert calls == 20
            assert stats.downloads == 2 * calls  # the footer, then the row group
            first = entries[0]
            per_call = first.parts[0].end + first.parts[-1].end - first.parts[-1].start
            assert stats.downloaded_bytes == calls * per_call < calls * first.bytes
            assert stats.cached_bytes == 0

    asyncio.run(main())


def test_a_small_cache_evicts_within_its_capacity_and_still_saves_downloads(tmp_path: Path) -> None:
    # Each object (~0.2 MB of Parquet here) fits, a decoded row group (~1 MB) barely: the cache
    # evicts all the time, stays within the capacity, and objects still come from it.
    capacity = 1 << 20

    async def main() -> None:
        async with local_tier_store(tmp_path, tier_cache_bytes=capacity) as store:
            db, entries = await tiered_db(store)
            cold = db.local_start_offset(0)
            got, calls = await read_sequentially(db, cold, 5000)
            assert got.column("offset").to_pylist() == list(range(cold))
            stats = store.tier_cache_stats()
            assert stats is not None
            assert 0 < stats.cached_bytes <= capacity
            assert stats.downloads < calls / 4  # without a cache: one per call
            assert stats.row_groups_decoded > len(entries) * 2  # row groups were evicted and decoded again

    asyncio.run(main())


def test_the_cache_capacity_is_checked(tmp_path: Path) -> None:
    for bad in (-1, True, 1.5, "1"):
        with pytest.raises(InvalidArgument, match="tier_cache_bytes"):
            seglog.open(tmp_path / "d", tier=(tmp_path / "t").as_uri(), tier_cache_bytes=bad)  # type: ignore[arg-type]
    assert seglog.open(tmp_path / "d").tier_cache_stats() is None  # no tier, no cache


async def read_filter(db: seglog.Database, topic_filter: str, n: int) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for stream in db.get_streams(topic_filter):
        it = db.make_iterator(stream, topic_filter)
        while True:
            it, t = await db.next_arrow(it, n)
            if not t.num_rows:
                break
            out.extend(zip(t.column("offset").to_pylist(), t.column("topic").to_pylist(), strict=True))
    return out


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_stream_iterators_read_records_that_are_only_in_the_tier(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    kw: dict[str, Any] = tier_kwargs(kind, tmp_path, request)
    data = tmp_path / "data"
    filters = ["site3/#", "+/dev5/t", "site1/+/t", "#"]

    async def main() -> None:
        async with seglog.open(data, retention_interval_ms=None, **kw) as store:
            db, _ = await tiered_db(store, lts=[100, 0, 100])
            cold = db.local_start_offset(0)
            everything, _ = await read_sequentially(db, RECORDS, 50_000)
            topics = everything.column("topic").to_pylist()
            for f in filters:
                want = Counter((o, t) for o, t in enumerate(topics) if topic_matches(f, t))
                got = await read_filter(db, f, 3000)
                assert Counter(got) == want, f
                assert any(o < cold for o, _ in got), "records only in the tier were read"
            # An iterator saved inside the tiered part goes on there after a restart.
            (stream,) = db.get_streams("site2/#")
            it, first = await db.next_arrow(db.make_iterator(stream, "site2/#"), 500)
            saved = it.to_bytes()
            assert first.column("offset")[-1].as_py() < cold
        async with seglog.open(data, retention_interval_ms=None, **kw) as store:
            db = await store.open_db(DB)
            it = seglog.Iterator.from_bytes(saved)
            rest: list[int] = first.column("offset").to_pylist()
            while True:
                it, t = await db.next_arrow(it, 4000)
                if not t.num_rows:
                    break
                rest.extend(t.column("offset").to_pylist())
            assert rest == [o for o, t in enumerate(topics) if t.startswith("site2/")]

    asyncio.run(main())


def test_concurrent_reads_of_one_cached_object_agree(tmp_path: Path) -> None:
    """Reads run in worker threads; many at once decode row groups of the same cached object."""

    async def main() -> None:
        async with local_tier_store(tmp_path) as store:
            db, _ = await tiered_db(store)
            cold = db.local_start_offset(0)
            starts = [(k * 7919) % (cold - 500) for k in range(48)]
            tables = await asyncio.gather(*(db.read_arrow(0, s, 500) for s in starts))
            expected = history(0, cold).column("value")
            for s, t in zip(starts, tables, strict=True):
                assert t.column("offset").to_pylist() == list(range(s, s + 500))
                assert t.column("value").to_pylist() == expected.slice(s, 500).to_pylist()
            first = store.tier_cache_stats()
            again = await asyncio.gather(*(db.read_arrow(0, s, 500) for s in starts))
            assert [t.equals(u) for t, u in zip(tables, again, strict=True)] == [True] * len(starts)
            later = store.tier_cache_stats()
            assert first is not None and later is not None
            assert later.downloads == first.downloads  # all of it cached by the first round

    asyncio.run(main())


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_key_reads_of_tiered_history_use_the_cache_and_keep_nothing_new(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """``read_key`` over tiered objects scans them all: a cold cache is not filled by it (it
    would evict what readers use), a warm one serves it without downloads or decodes."""
    kw = tier_kwargs(kind, tmp_path, request)

    async def main() -> None:
        async with seglog.open(tmp_path / "data", retention_interval_ms=None, **kw) as store:
            db, entries = await tiered_db(store, keyed=True)
            everything = history(0, RECORDS, keyed=True)

            async def check_key(d: int) -> None:
                got = await db.read_key_arrow(0, b"dev%d" % d)
                want = [k for k in range(RECORDS) if k % 97 == d]
                assert got.column("offset").to_pylist() == want
                assert got.column("value").to_pylist() == everything.column("value").take(want).to_pylist()

            def stats() -> TierCacheStats:
                s = store.tier_cache_stats()
                assert s is not None
                return s

            await check_key(5)  # cold: each part fetched once, nothing kept
            assert (stats().downloads, stats().downloaded_bytes) == read_whole_bytes(entries)
            assert stats().cached_bytes == 0
            cold = db.local_start_offset(0)
            got, _ = await read_sequentially(db, cold, 1000)  # a reader fills the cache
            assert got.column("value").to_pylist() == everything.column("value").slice(0, cold).to_pylist()
            warm = stats()
            assert warm.downloads == 2 * read_whole_bytes(entries)[0]
            for d in (42, 96):  # warm: served from the cache, which it leaves as it was
                await check_key(d)
            after = stats()
            assert (after.downloads, after.row_groups_decoded, after.cached_bytes) == (
                warm.downloads,
                warm.row_groups_decoded,
                warm.cached_bytes,
            )

    asyncio.run(main())


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_a_read_fetches_only_the_footer_and_the_row_group_it_needs(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A consumer that seeks into a tiered object does not wait for the whole object."""
    kw = tier_kwargs(kind, tmp_path, request)

    async def main() -> None:
        async with seglog.open(tmp_path / "data", retention_interval_ms=None, **kw) as store:
            db, entries = await tiered_db(store)
            first = entries[0]
            assert row_groups_of(first) >= 2
            deep = ROW_GROUP_ROWS + 100  # in row group 1 of the first object
            t = await db.read_arrow(0, deep, 10)
            assert t.column("offset").to_pylist() == list(range(deep, deep + 10))
            assert t.column("value").to_pylist() == history(deep, 10).column("value").to_pylist()
            stats = store.tier_cache_stats()
            assert stats is not None
            footer, group = first.parts[-1], first.parts[1]
            assert stats.downloads == 2  # the footer, then row group 1
            assert stats.downloaded_bytes == (footer.end - footer.start) + (group.end - group.start)
            assert stats.downloaded_bytes < first.bytes / 2
            t = await db.read_arrow(0, 5, 10)  # row group 0: one more fetch, the footer is cached
            assert t.column("offset").to_pylist() == list(range(5, 15))
            after = store.tier_cache_stats()
            assert after is not None and after.downloads == 3

    asyncio.run(main())


def test_a_rotted_row_group_fails_its_reads_and_spares_the_others(tmp_path: Path) -> None:
    """Each fetched part is checked against its CRC32C before Parquet decodes it."""

    async def main() -> None:
        async with local_tier_store(tmp_path, tier_cache_bytes=0) as store:
            db, entries = await tiered_db(store)
            first = entries[0]
            group = first.parts[1]
            path = tmp_path / "tier" / first.key
            raw = bytearray(path.read_bytes())
            raw[(group.start + group.end) // 2] ^= 0x40
            path.write_bytes(bytes(raw))
            with pytest.raises(ObjectMismatch, match="CRC32C"):
                await db.read_arrow(0, ROW_GROUP_ROWS + 100, 10)
            t = await db.read_arrow(0, 100, 10)  # row group 0 of the same object is intact
            assert t.column("value").to_pylist() == history(100, 10).column("value").to_pylist()

    asyncio.run(main())


def test_objects_tiered_before_ranged_reads_are_read_whole(tmp_path: Path) -> None:
    """An entry without parts (an older manifest) is downloaded whole and checked by sha256."""

    async def main() -> None:
        async with local_tier_store(tmp_path) as store:
            _, entries = await tiered_db(store)
        old = dataclasses.replace(entries[0], parts=())
        target = LocalTarget(tmp_path / "tier")
        cache = TierReadCache()
        (t,) = cache.rows(target, old, ROW_GROUP_ROWS + 100, ROW_GROUP_ROWS + 109)
        assert t.column("offset").to_pylist() == list(range(ROW_GROUP_ROWS + 100, ROW_GROUP_ROWS + 110))
        stats = cache.stats()
        assert (stats.downloads, stats.downloaded_bytes) == (1, old.bytes)
        path = tmp_path / "tier" / old.key
        path.write_bytes(path.read_bytes()[:-1] + b"X")
        with pytest.raises(ObjectMismatch):
            list(TierReadCache().rows(target, old, 0, 9))

    asyncio.run(main())
