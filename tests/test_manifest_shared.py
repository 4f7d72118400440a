"""Shared tier manifests: one writer per shard (its leader), conditional saves merged across
writers, fencing by epoch, and per-shard recovery at claim; on a local directory and MinIO."""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from seglog.errors import InvalidArgument, TierFenced
from seglog.tiering import (
    EntryState,
    Manifest,
    ManifestEntry,
    ObjectInfo,
    TierTarget,
    object_key,
    segment_stats,
    segment_table_to_parquet,
    upload_segment,
)
from tests.helpers import read_all
from tests.tier_fixtures import make_segment_table

DB = "shared"
TS0 = 1_700_000_000_000_000
ROWS = 50


@pytest.fixture
def target(tier_target: TierTarget) -> TierTarget:
    return tier_target


def seg(k: int) -> object:
    return make_segment_table(k * ROWS, ROWS, ts0_us=TS0 + k * 1000)


def committed_ranges(m: Manifest, shard: int) -> list[tuple[int, int]]:
    return [(e.base_offset, e.end_offset) for e in m.committed(shard)]


def test_leaders_of_different_shards_share_one_manifest(target: TierTarget) -> None:
    a = Manifest.load_shared(target, DB)
    b = Manifest.load_shared(target, DB)
    a.claim(target, 0, 1)
    b.claim(target, 1, 1)
    for k in range(3):  # interleaved: every save of one meets the other's newer copy
        upload_segment(target, a, 0, seg(k))  # type: ignore[arg-type]
        upload_segment(target, b, 1, seg(k))  # type: ignore[arg-type]
    expected = [(k * ROWS, k * ROWS + ROWS - 1) for k in range(3)]
    reader = Manifest.load_shared(target, DB)  # what a third node (or Spark's side) sees
    assert committed_ranges(reader, 0) == expected and committed_ranges(reader, 1) == expected
    assert reader.writer_epoch(0) == 1 and reader.writer_epoch(1) == 1
    assert committed_ranges(a, 1) != expected  # a has not looked since b's last save
    a.refresh(target)
    assert committed_ranges(a, 1) == expected
    # A plain (single-writer) load reads the same document.
    assert committed_ranges(Manifest.load(target, DB), 1) == expected
    with pytest.raises(InvalidArgument, match="does not write"):
        upload_segment(target, a, 1, seg(5))  # type: ignore[arg-type]


def test_a_replaced_leader_is_fenced_and_writes_nothing(target: TierTarget) -> None:
    old = Manifest.load_shared(target, DB)
    old.claim(target, 0, 1)
    upload_segment(target, old, 0, seg(0))  # type: ignore[arg-type]
    new = Manifest.load_shared(target, DB)
    new.claim(target, 0, 2)  # the new leader, epoch 2
    upload_segment(target, new, 0, seg(1))  # type: ignore[arg-type]
    stale = seg(2)
    with pytest.raises(TierFenced):
        upload_segment(target, old, 0, stale)  # type: ignore[arg-type]
    assert old.owned() == {}
    # Its intent never reached the manifest, so its object was never put.
    stats = segment_stats(stale)  # type: ignore[arg-type]
    assert target.head(object_key(DB, 0, stats.base_offset, stats.end_offset)) is None
    now = Manifest.load_shared(target, DB)
    assert committed_ranges(now, 0) == [(0, ROWS - 1), (ROWS, 2 * ROWS - 1)]
    with pytest.raises(TierFenced):
        old.claim(target, 0, 1)  # an old epoch cannot take it back
    assert now.writer_epoch(0) == 2


def test_claiming_a_shard_recovers_what_its_last_writer_left_half_done(target: TierTarget) -> None:
    """The previous leader put an object but died before committing it, and left another
    entry ``uploading`` whose object never arrived; the next leader resolves both."""
    old = Manifest.load_shared(target, DB)
    old.claim(target, 0, 1)
    landed, lost = seg(0), seg(1)
    for table, put in ((landed, True), (lost, False)):
        stats = segment_stats(table)  # type: ignore[arg-type]
        data = segment_table_to_parquet(table)  # type: ignore[arg-type]
        key = object_key(DB, 0, stats.base_offset, stats.end_offset)
        old.begin_upload(
            ManifestEntry.for_upload(0, stats, ObjectInfo(key, len(data), hashlib.sha256(data).hexdigest()))
        )
        old.save(target)
        if put:
            target.put(key, data)
    new = Manifest.load_shared(target, DB)
    assert [e.state for e in new.entries()] == [EntryState.UPLOADING, EntryState.UPLOADING]
    actions = new.claim(target, 0, 2)
    assert [a.split()[0] for a in actions] == ["committed", "dropped"]
    assert committed_ranges(Manifest.load_shared(target, DB), 0) == [(0, ROWS - 1)]


def test_concurrent_leaders_lose_no_entry(target: TierTarget) -> None:
    """Four writers of four shards upload at once; every save is a conditional put, so an
    entry one of them committed is never overwritten by another's older copy."""
    writers = [Manifest.load_shared(target, DB) for _ in range(4)]
    for shard, m in enumerate(writers):
        m.claim(target, shard, 7)

    def upload_all(shard: int) -> None:
        for k in range(5):
            upload_segment(target, writers[shard], shard, seg(k))  # type: ignore[arg-type]

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(upload_all, range(4)))
    final = Manifest.load_shared(target, DB)
    for shard in range(4):
        assert len(committed_ranges(final, shard)) == 5, shard
    assert final.seq >= 4 + 4 * 5 * 2  # every claim and both saves of every upload landed


def test_a_deposed_leader_cuts_its_diverged_tail_below_what_the_new_leader_tiered(
    run, tmp_path: Path
) -> None:
    """Store level, as two nodes would: the new leader (epoch 2) tiered offsets up to 150; the
    old one (its unreplicated tail of epoch 1 at 100..110) must still cut that tail to follow,
    though it lies below the shared tier's end (a standalone store refuses such a cut)."""
    import seglog
    from tests.test_replica_log import _append_epoch, _records

    tier = (tmp_path / "tier").as_uri()

    async def main() -> None:
        opts = {"tier": tier, "tier_shared": True, "retention_interval_ms": None}
        async with seglog.open(tmp_path / "new", **opts) as a, seglog.open(tmp_path / "old", **opts) as b:
            new = await a.create_db(DB, shards=1, segment_bytes=4096)
            old = await b.create_db(DB, shards=1, segment_bytes=4096)
            await _append_epoch(old, _records(100), 0)
            await new.append_frames(0, await old.read_frames(0, 0, max_bytes=1 << 20), expected_base=0)
            await _append_epoch(old, _records(10, 100, prefix=b"lost"), 1)  # never replicated
            await _append_epoch(new, _records(50, 100, prefix=b"kept"), 2)
            await new.seal()
            new.update_high_watermark(0, 150)
            new.tier_leads(lambda: {0: 2})
            old.tier_leads(lambda: {})
            assert [e.end_offset for e in await new.tier_now()][-1] == 149
            assert await old.tier_now() == []  # a follower uploads nothing; it reads the manifest
            assert old.tier_stats()[0].tier_objects > 0
            assert await old.truncate_to(0, 100, force=True) == 100
            await old.append_frames(0, await new.read_frames(0, 100, max_bytes=1 << 20), expected_base=100)
            assert [r.value for r in await read_all(old, 0)] == [r.value for r in await read_all(new, 0)]

    run(main())


def test_a_refresh_parses_the_tier_copy_only_when_it_changed(
    target: TierTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every tier pass of every node refreshes the database's manifest: a copy it already
    merged (or saved itself) is not parsed again, since parsing grows with the history."""
    a = Manifest.load_shared(target, DB)
    b = Manifest.load_shared(target, DB)
    a.claim(target, 0, 1)
    b.claim(target, 1, 1)
    upload_segment(target, a, 0, seg(0))  # type: ignore[arg-type]
    parsed: list[int] = []
    real = Manifest._parse

    def counting(text: str | bytes, db: str | None) -> dict[str, object]:
        parsed.append(1)
        return real(text, db)

    monkeypatch.setattr(Manifest, "_parse", staticmethod(counting))
    a.refresh(target)
    a.refresh(target)
    assert parsed == []  # a saved the copy the tier holds
    upload_segment(target, b, 1, seg(0))  # type: ignore[arg-type]
    parsed.clear()  # b's saves met a's copy and merged it
    assert a.refresh(target) == []
    assert len(parsed) == 1 and committed_ranges(a, 1) == [(0, ROWS - 1)]
    a.refresh(target)
    assert len(parsed) == 1
