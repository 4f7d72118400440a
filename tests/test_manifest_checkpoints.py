"""Manifest heads and checkpoints: a save writes what changed, not the whole history; every
reader (tier, local copy, shared writers) sees exactly the state saved; checkpoints are
replaced and collected, including after a save that failed half-way; on a local directory
and MinIO."""

from __future__ import annotations

import gc
import json
import random
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from seglog.errors import TierError
from seglog.tiering import (
    EntryState,
    LocalTarget,
    Manifest,
    ManifestEntry,
    TierTarget,
    manifest_key,
    object_key,
    recover_manifest,
)
from seglog.tiering.db_tier import DbTier
from seglog.tiering.manifest import CHECKPOINT_DIR, HEAD_CHANGES_MAX, checkpoint_seq, local_checkpoint_dir
from seglog.tiering.targets import ObjectInfo, PutData

DB = "cpdb"
ROWS = 10


@pytest.fixture
def target(tier_target: TierTarget) -> TierTarget:
    return tier_target


def entry(shard: int, k: int, state: EntryState = EntryState.COMMITTED) -> ManifestEntry:
    base = k * ROWS
    return ManifestEntry(
        key=object_key(DB, shard, base, base + ROWS - 1),
        shard=shard,
        base_offset=base,
        end_offset=base + ROWS - 1,
        min_ts=base,
        max_ts=base + ROWS - 1,
        rows=ROWS,
        bytes=1000 + k,
        checksum=f"{k:064x}",
        state=state,
    )


def checkpoints(target: TierTarget) -> list[str]:
    return target.list(f"{DB}/{CHECKPOINT_DIR}/")


def head_doc(target: TierTarget) -> dict[str, object]:
    doc: dict[str, object] = json.loads(target.get(manifest_key(DB)))
    return doc


def commit(m: Manifest, e: ManifestEntry) -> None:
    m.begin_upload(e)
    m.mark_committed(e.key)


def test_a_save_writes_the_changes_not_the_history(target: TierTarget, tmp_path: Path) -> None:
    local = tmp_path / "m.json"
    m = Manifest(DB, [entry(s, k) for s in range(4) for k in range(400)])
    m.save(target, local_path=local)
    whole = len(m.to_json())
    assert head_doc(target)["version"] == 2 and len(checkpoints(target)) == 1
    [cp] = checkpoints(target)
    assert len(target.get(cp)) == whole  # the checkpoint is the whole document
    commit(m, entry(0, 400))
    m.save(target, local_path=local)
    head = target.get(manifest_key(DB))
    doc = json.loads(head)
    assert [e["key"] for e in doc["entries"]] == [entry(0, 400).key] and doc["removed"] == []
    assert len(head) * 100 < whole  # one entry and the maps, not 1,601 entries
    assert checkpoints(target) == [cp]  # no new checkpoint for one change
    for copy in (Manifest.load(target, DB), Manifest.load_local(local, DB)):
        assert copy.to_json() == m.to_json() and copy.seq == m.seq


def test_small_manifests_stay_one_document(target: TierTarget) -> None:
    m = Manifest(DB, [entry(0, k) for k in range(HEAD_CHANGES_MAX)])
    m.save(target)
    assert head_doc(target)["version"] == 1 and checkpoints(target) == []
    commit(m, entry(0, HEAD_CHANGES_MAX))
    m.save(target)
    assert head_doc(target)["version"] == 2 and len(checkpoints(target)) == 1
    for k in range(HEAD_CHANGES_MAX - 10, HEAD_CHANGES_MAX + 1):  # back under the line
        m.mark_deleting(entry(0, k).key)
        m.remove(entry(0, k).key)
    m.save(target)
    assert head_doc(target)["version"] == 1
    assert checkpoints(target) == []  # the one the replaced head named is deleted
    assert Manifest.load(target, DB).to_json() == m.to_json()


def test_every_save_loads_back_exactly_and_one_checkpoint_remains(target: TierTarget, tmp_path: Path) -> None:
    """Random commits, deletions and floors over many saves: after each, the tier copy and
    the local copy load to exactly the saved state; checkpoints rotate as heads fill up."""
    rng = random.Random(7)
    local = tmp_path / "m.json"
    m = Manifest(DB)
    next_k = {s: 0 for s in range(3)}
    rotations = set()
    for _ in range(160):
        for _ in range(rng.randrange(1, 12)):
            shard = rng.randrange(3)
            commit(m, entry(shard, next_k[shard]))
            next_k[shard] += 1
        committed = m.entries(EntryState.COMMITTED)
        for e in rng.sample(committed, min(len(committed), rng.randrange(0, 4))):
            m.mark_deleting(e.key)
            if rng.random() < 0.7:
                m.remove(e.key)
        if rng.random() < 0.2:
            shard = rng.randrange(3)
            m.raise_log_start(shard, m.log_start(shard) + 5)
        m.save(target, local_path=local)
        for copy in (Manifest.load(target, DB), Manifest.load_local(local, DB)):
            assert copy.to_json() == m.to_json()
        rotations.update(checkpoints(target))
        assert len(checkpoints(target)) <= 1
        local_files = (
            list(local_checkpoint_dir(local).iterdir()) if local_checkpoint_dir(local).exists() else []
        )
        assert len(local_files) == len(checkpoints(target))
    assert len(rotations) >= 3  # heads filled up and were replaced by new checkpoints
    assert len(m.entries()) > HEAD_CHANGES_MAX * 2


class FailingPuts(LocalTarget):
    """A real local tier whose puts of one key fail while ``failing`` names it."""

    failing: str | None = None

    def put(self, key: str, data: PutData) -> ObjectInfo:
        if self.failing is not None and key.startswith(self.failing):
            raise TierError(f"injected failure putting {key}")
        return super().put(key, data)


def test_a_save_that_fails_half_way_loses_nothing_and_its_leftovers_are_collected(tmp_path: Path) -> None:
    target = FailingPuts(tmp_path / "tier")
    local = tmp_path / "m.json"
    m = Manifest(DB, [entry(0, k) for k in range(HEAD_CHANGES_MAX + 1)])
    m.save(target, local_path=local)
    [first] = checkpoints(target)
    # A save that needs a new checkpoint: it is written, then the head's put fails.
    for k in range(HEAD_CHANGES_MAX + 1, 2 * HEAD_CHANGES_MAX + 10):
        commit(m, entry(0, k))
    target.failing = manifest_key(DB)
    with pytest.raises(TierError, match="injected"):
        m.save(target, local_path=local)
    assert len(checkpoints(target)) == 2  # the new one, named by no tier head yet
    assert json.loads(target.get(manifest_key(DB)))["checkpoint"]["key"] == first
    # A restart: the local copy (saved first) is newer and names the new checkpoint.
    target.failing = None
    again, actions = recover_manifest(target, DB, local_manifest=local)
    assert again.to_json() == m.to_json()
    assert actions == [f"deleted old checkpoint {first}"]
    [second] = checkpoints(target)
    again.save(target, local_path=local)
    assert Manifest.load(target, DB).to_json() == again.to_json()
    # A checkpoint whose own put failed is never named; the state stays saveable.
    for k in range(2 * HEAD_CHANGES_MAX + 10, 3 * HEAD_CHANGES_MAX + 20):
        commit(again, entry(0, k))
    target.failing = f"{DB}/{CHECKPOINT_DIR}/"
    with pytest.raises(TierError, match="injected"):
        again.save(target, local_path=local)
    assert Manifest.load_local(local, DB).seq < again.seq  # the local head was not written
    target.failing = None
    again.save(target, local_path=local)
    assert Manifest.load(target, DB).to_json() == again.to_json()
    assert Manifest.load_local(local, DB).to_json() == again.to_json()
    [third] = checkpoints(target)
    assert third != second
    assert checkpoint_seq(third) is not None and checkpoint_seq(second) is not None


class RotateOnRead(LocalTarget):
    """A real local tier that lets a writer save once, right after a reader read the head."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.hook: Callable[[], None] | None = None

    def get_versioned(self, key: str) -> tuple[bytes, str]:
        got = super().get_versioned(key)
        hook, self.hook = self.hook, None
        if hook is not None:
            hook()
        return got


def test_a_reader_whose_checkpoint_was_replaced_reads_the_new_head(tmp_path: Path) -> None:
    target = RotateOnRead(tmp_path / "tier")
    m = Manifest(DB, [entry(0, k) for k in range(HEAD_CHANGES_MAX + 1)])
    m.save(target)
    [old] = checkpoints(target)
    for k in range(HEAD_CHANGES_MAX + 1, 2 * HEAD_CHANGES_MAX + 5):
        commit(m, entry(0, k))
    target.hook = lambda: m.save(target)  # a new checkpoint, and the old one deleted
    loaded = Manifest.load(target, DB)
    assert old not in checkpoints(target)
    assert loaded.to_json() == m.to_json()


def test_shared_writers_merge_over_checkpoints(target: TierTarget) -> None:
    a = Manifest.load_shared(target, DB)
    b = Manifest.load_shared(target, DB)
    a.claim(target, 0, 1)
    b.claim(target, 1, 1)
    ka = kb = 0
    for round_ in range(12):  # each round: ~50 commits per writer, saved in a few batches
        for _ in range(5):
            for _ in range(10):
                commit(a, entry(0, ka))
                ka += 1
                commit(b, entry(1, kb))
                kb += 1
            a.save(target)  # every save of one meets the other's newer head and merges
            b.save(target)
        if round_ % 4 == 3:
            victim = a.entries(EntryState.COMMITTED)[0]
            a.mark_deleting(victim.key)
            a.remove(victim.key)
    a.save(target)
    reader = Manifest.load_shared(target, DB)
    a.refresh(target)
    assert reader.to_json() == a.to_json() == Manifest.load(target, DB).to_json()
    assert len(reader.entries()) == ka + kb - 3
    assert head_doc(target)["version"] == 2
    assert len(checkpoints(target)) == 1


def test_a_refresh_reads_a_checkpoint_it_holds_only_once(
    target: TierTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = Manifest.load_shared(target, DB)
    b = Manifest.load_shared(target, DB)
    a.claim(target, 0, 1)
    b.claim(target, 1, 1)
    for k in range(HEAD_CHANGES_MAX + 10):
        commit(a, entry(0, k))
    a.save(target)
    read: list[str] = []
    real = Manifest._read_checkpoint.__func__  # type: ignore[attr-defined]

    def counting(cls: type[Manifest], ref: tuple[str, int], data: bytes, db: str) -> object:
        read.append(ref[0])
        return real(cls, ref, data, db)

    monkeypatch.setattr(Manifest, "_read_checkpoint", classmethod(counting))
    b.refresh(target)
    assert len(read) == 1
    for k in range(HEAD_CHANGES_MAX + 10, HEAD_CHANGES_MAX + 13):
        commit(a, entry(0, k))
        a.save(target)
        b.refresh(target)
    assert len(read) == 1  # three heads over the same checkpoint: it was not read again
    assert b.to_json() == a.to_json()


def test_a_head_is_checked_like_a_document(tmp_path: Path) -> None:
    target = LocalTarget(tmp_path / "tier")
    m = Manifest(DB, [entry(0, k) for k in range(HEAD_CHANGES_MAX + 1)])
    m.save(target)
    commit(m, entry(0, HEAD_CHANGES_MAX + 1))
    m.save(target)
    doc = head_doc(target)
    overlapping = entry(0, 3).to_json()
    overlapping.update(key=object_key(DB, 0, 35, 44), base_offset=35, end_offset=44)
    doc["entries"] = [*doc["entries"], overlapping]  # type: ignore[list-item]
    target.put(manifest_key(DB), json.dumps(doc).encode())
    with pytest.raises(TierError, match="overlaps"):
        Manifest.load(target, DB)
    doc["checkpoint"] = {"key": "elsewhere/x.json", "seq": 1}
    target.put(manifest_key(DB), json.dumps(doc).encode())
    with pytest.raises(TierError, match="checkpoint"):
        Manifest.load(target, DB)


class FailingDeletes(LocalTarget):
    """A real local tier whose deletes of keys under ``failing`` fail (a crash there)."""

    failing: str | None = None

    def delete(self, key: str) -> None:
        if self.failing is not None and key.startswith(self.failing):
            raise TierError(f"injected failure deleting {key}")
        super().delete(key)


def test_dropping_a_database_never_leaves_a_head_without_its_checkpoint(tmp_path: Path) -> None:
    target = FailingDeletes(tmp_path / "tier")
    directory = tmp_path / "db"
    tier = DbTier(target, DB, directory)
    tier.recover()
    for k in range(HEAD_CHANGES_MAX + 5):
        e = entry(0, k)
        target.put(e.key, b"x")
        commit(tier.manifest, e)
    tier.manifest.save(target, local_path=tier.local_manifest)
    assert len(checkpoints(target)) == 1
    target.failing = f"{DB}/{CHECKPOINT_DIR}/"
    with pytest.raises(TierError, match="injected"):
        tier.drop_all()  # "crashes" deleting the checkpoint
    assert target.head(manifest_key(DB)) is None  # the head went first
    target.failing = None
    again = DbTier(target, DB, directory)
    again.recover()  # opens: the local copy's deleting entries are finished off
    assert again.manifest.entries() == []
    again.drop_all()
    assert target.list(f"{DB}/") == []
    assert not local_checkpoint_dir(tier.local_manifest).exists()


class BlockingPuts(LocalTarget):
    """A real local tier whose puts wait for ``release`` once ``entered`` is set."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.entered = threading.Event()
        self.release = threading.Event()
        self.blocking = False

    def put(self, key: str, data: PutData) -> ObjectInfo:
        if self.blocking:
            self.entered.set()
            assert self.release.wait(30)
        return super().put(key, data)


def test_lookups_do_not_wait_for_a_saves_tier_put(tmp_path: Path) -> None:
    """The event loop asks the manifest on every read below the local start and every
    ``start_offset``: a save (in the tiering thread) must not hold it across a tier put."""
    target = BlockingPuts(tmp_path / "tier")
    m = Manifest(DB, [entry(0, k) for k in range(10)])
    m.save(target)
    commit(m, entry(0, 10))
    target.blocking = True
    saver = threading.Thread(target=m.save, args=(target,), kwargs={"local_path": tmp_path / "m.json"})
    saver.start()
    try:
        assert target.entered.wait(30)
        answers: list[object] = []
        looker = threading.Thread(
            target=lambda: answers.extend([m.find_offset(0, 55), m.log_start(0), len(m.committed(0))])
        )
        looker.start()
        looker.join(10)
        assert not looker.is_alive(), "a lookup waited for the save's tier put"
        assert answers == [entry(0, 5), 0, 11]
    finally:
        target.release.set()
        saver.join(30)
    assert Manifest.load(target, DB).to_json() == m.to_json()


def test_a_large_manifest_loads_without_young_collections(tmp_path: Path) -> None:
    """An open parses every entry (millions of acyclic objects at 100,000 entries): the
    collector is paused meanwhile, as the young collections they set off were most of it."""
    target = LocalTarget(tmp_path / "tier")
    m = Manifest(DB, [entry(s, k) for s in range(4) for k in range(1000)])
    m.save(target)
    collections: list[int] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    gc.callbacks.append(note)
    try:
        loaded = Manifest.load(target, DB)
    finally:
        gc.callbacks.remove(note)
    assert loaded.to_json() == m.to_json()
    assert collections.count(0) == 0, collections  # only the pauses' own generation-1 passes


def test_a_local_reader_whose_checkpoint_was_replaced_reads_the_new_head(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-only follower reads its owner's local copy: the owner's save may replace the
    checkpoint between the reader's read of the head and of the checkpoint."""
    target = LocalTarget(tmp_path / "tier")
    local = tmp_path / "m.json"
    m = Manifest(DB, [entry(0, k) for k in range(HEAD_CHANGES_MAX + 1)])
    m.save(target, local_path=local)
    [old] = list(local_checkpoint_dir(local).iterdir())
    for k in range(HEAD_CHANGES_MAX + 1, 2 * HEAD_CHANGES_MAX + 5):
        commit(m, entry(0, k))
    real = Manifest._parse
    saved: list[int] = []

    def parse_then_save(text: str | bytes, db: str | None) -> dict[str, object]:
        doc = real(text, db)
        if not saved:  # right after the reader's first read of the head
            saved.append(1)
            m.save(target, local_path=local)
        return doc

    monkeypatch.setattr(Manifest, "_parse", staticmethod(parse_then_save))
    loaded = Manifest.load_local(local, DB)
    monkeypatch.undo()
    assert saved and not old.exists()
    assert loaded.to_json() == m.to_json()


def test_lookups_do_not_wait_for_a_refresh_to_build_the_shards_it_takes_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every tier pass of a replica refreshes the shared manifest; taking in another leader's
    entries is O(entries), built outside the lock and swapped in."""
    target = LocalTarget(tmp_path / "tier")
    a = Manifest.load_shared(target, DB)
    b = Manifest.load_shared(target, DB)
    a.claim(target, 0, 1)
    b.claim(target, 1, 1)
    commit(b, entry(1, 0))
    b.save(target)
    for k in range(HEAD_CHANGES_MAX + 5):
        commit(a, entry(0, k))
    a.save(target)
    building = threading.Event()
    release = threading.Event()
    real = Manifest._adopted

    def slow(self: Manifest, remote: Manifest, owned: dict[int, int]) -> object:
        if self is b:
            building.set()
            assert release.wait(30)
        return real(self, remote, owned)

    monkeypatch.setattr(Manifest, "_adopted", slow)
    refresher = threading.Thread(target=b.refresh, args=(target,))
    refresher.start()
    try:
        assert building.wait(30)
        answers: list[object] = []
        looker = threading.Thread(target=lambda: answers.extend([b.find_offset(1, 5), len(b.committed(1))]))
        looker.start()
        looker.join(10)
        assert not looker.is_alive(), "a lookup waited for the refresh"
        assert answers == [entry(1, 0), 1]
    finally:
        release.set()
        refresher.join(30)
    assert b.to_json() == Manifest.load(target, DB).to_json()
    assert len(b.committed(0)) == HEAD_CHANGES_MAX + 5
