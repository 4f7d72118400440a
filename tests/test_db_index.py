"""The shared per-database index (DbIndex) and its per-shard views, below the engine."""

from __future__ import annotations

import logging
import os
import resource
import struct
from collections.abc import Iterator
from pathlib import Path

import lmdb
import numpy as np
import pyarrow as pa
import pytest

import seglog._fs
from seglog.errors import InvalidArgument, StorageError
from seglog.index import MAX_INLINE_KEY_BYTES, DbIndex, FrameEntry, ShardIndex
from seglog.index.shard_index import MAX_MERGES_PER_TXN

FRAME_RECORDS = 10


def _frame(base: int, keys: list[bytes | None], *, segment: int = 0, pos: int | None = None) -> FrameEntry:
    """A frame of ``len(keys)`` records at ``base`` (position: 100 bytes per record so far)."""
    n = len(keys)
    return FrameEntry(
        base,
        base + n,
        1_000 + base + n,
        segment,
        base * 100 if pos is None else pos,
        n * 100,
        pa.array(keys, pa.binary()),
        [1],
    )


def _frames(first: int, count: int, key_of, *, segment: int = 0) -> list[FrameEntry]:
    """``count`` frames of FRAME_RECORDS records from frame number ``first``; ``key_of(offset)``."""
    out = []
    for f in range(first, first + count):
        base = f * FRAME_RECORDS
        out.append(_frame(base, [key_of(o) for o in range(base, base + FRAME_RECORDS)], segment=segment))
    return out


def _brute(frames: list[FrameEntry], key: bytes, *, start: int = 0, below: int | None = None) -> list[int]:
    """The frames holding ``key`` that reach past ``start`` (and start below ``below``)."""
    return [
        f.base_offset
        for f in frames
        if key in f.keys.to_pylist() and f.next_offset > start and (below is None or f.base_offset < below)
    ]


def _covers(got: list[int], want: list[int], start: int) -> bool:
    """``got`` is ``want`` plus at most the one candidate frame below ``start`` before it."""
    return got == want or (got[1:] == want and got[0] < start)


def _entries(db_index: DbIndex, name: bytes, shard: int | None = None) -> int:
    t = db_index._tables
    with t.env.begin() as txn:
        keys = list(txn.cursor(getattr(t, name.decode())).iternext(values=False))
    return sum(1 for k in keys if shard is None or int.from_bytes(k[:4], "big") == shard)


def _txn_id(db_index: DbIndex) -> int:
    return int(db_index._tables.env.info()["last_txnid"])


@pytest.fixture
def db_index(tmp_path: Path) -> Iterator[DbIndex]:
    # An offset entry for every frame (frames here are 1000 bytes), merges every 4 frames.
    idx = DbIndex(tmp_path / "index", merge_frames=4, index_interval_bytes=1)
    yield idx
    idx.close()


def test_add_many_writes_every_shard_in_one_transaction(db_index: DbIndex) -> None:
    views = [db_index.shard(n) for n in range(50)]
    before = _txn_id(db_index)
    db_index.add_many([(v, _frames(0, 3, lambda o, n=v.number: b"k%d-%d" % (n, o % 3))) for v in views])
    assert _txn_id(db_index) == before + 1
    for v in views:
        assert v.indexed_end == 3 * FRAME_RECORDS
        assert v.key_frames(b"k%d-1" % v.number) == [0, 10, 20]
        assert v.key_frames(b"k%d-1" % ((v.number + 1) % 50)) == []  # no shard sees another's keys
        assert v.floor(25) is not None and v.floor(25)[0] == 20


def test_failed_add_many_moves_no_view(db_index: DbIndex, monkeypatch) -> None:
    a, b = db_index.shard(0), db_index.shard(1)
    db_index.add_many([(a, _frames(0, 2, lambda o: b"x")), (b, _frames(0, 2, lambda o: b"x"))])
    state = (a.indexed_end, b.indexed_end, a._pending, b._pending)

    def broken(*args, **kwargs):
        raise lmdb.Error("injected")

    # The second shard's merge fails after the first shard's entries were put in the transaction.
    monkeypatch.setattr("seglog.index.shard_index.merge_postings", broken)
    with pytest.raises(StorageError):
        db_index.add_many([(a, _frames(2, 1, lambda o: b"y")), (b, _frames(2, 3, lambda o: b"y"))])
    assert (a.indexed_end, b.indexed_end, a._pending, b._pending) == state
    assert a.key_frames(b"y") == [] and b.key_frames(b"y") == []
    monkeypatch.undo()
    db_index.add_many([(a, _frames(2, 1, lambda o: b"y")), (b, _frames(2, 3, lambda o: b"y"))])
    assert a.key_frames(b"y") == [20] and b.key_frames(b"y") == [20, 30, 40]


def test_add_many_refuses_a_view_of_another_database(db_index: DbIndex, tmp_path: Path) -> None:
    other = DbIndex(tmp_path / "other")
    try:
        with pytest.raises(InvalidArgument):
            db_index.add_many([(other.shard(0), _frames(0, 1, lambda o: b"k"))])
    finally:
        other.close()
    assert db_index.shard(7) is db_index.shard(7)


def test_keys_cost_one_entry_per_frame_not_per_record(tmp_path: Path) -> None:
    db_index = DbIndex(tmp_path / "index")  # default merge thresholds: nothing merges here
    view = db_index.shard(0)
    frames = [_frame(f * 1000, [b"dev-%d" % ((f * 1000 + i) % 5000) for i in range(1000)]) for f in range(10)]
    view.add(frames)
    assert _entries(db_index, b"keyframe") == 10
    assert _entries(db_index, b"key") == 0
    assert view.key_frames(b"dev-4999") == [4000, 9000]
    db_index.close()


def test_summaries_merge_into_postings_per_run_and_per_segment(db_index: DbIndex) -> None:
    view = db_index.shard(2)
    key_of = lambda o: b"k%d" % (o % 7) if o % 5 else None  # noqa: E731
    seg0 = _frames(0, 6, key_of, segment=0)
    view.add(seg0[:3])
    assert (_entries(db_index, b"keyframe"), _entries(db_index, b"key")) == (3, 0)
    view.add(seg0[3:])  # 6 frames: one run of 4 merges (merge_frames=4), 2 stay summaries
    assert (_entries(db_index, b"keyframe"), _entries(db_index, b"key")) == (2, 7)
    seg1 = _frames(6, 1, key_of, segment=60)
    view.add(seg1)  # the segment rolled: its last 2 summaries merge although fewer than 4
    assert _entries(db_index, b"keyframe") == 1
    frames = seg0 + seg1
    for k in range(7):
        key = b"k%d" % k
        assert view.key_frames(key) == _brute(frames, key)
        assert _covers(view.key_frames(key, start=35), _brute(frames, key, start=35), 35)
    assert view.key_frames(b"nope") == []


def _postings_by_shard(db_index: DbIndex, shards: int) -> list[int]:
    return [_entries(db_index, b"key", n) for n in range(shards)]


def test_shards_due_together_merge_a_few_per_transaction_and_all_in_turn(db_index: DbIndex) -> None:
    """Shards fed in step reach the merge threshold in one transaction: at most
    MAX_MERGES_PER_TXN of them merge there (a merge holds the GIL for ms), the others keep
    their summaries and merge in the following transactions; lookups stay exact throughout."""
    shards = 3 * MAX_MERGES_PER_TXN + 1
    views = [db_index.shard(n) for n in range(shards)]
    key_of = lambda o: b"k%d" % (o % 5)  # noqa: E731
    frames = [_frames(0, 3, key_of) for _ in views]
    db_index.add_many([(v, f) for v, f in zip(views, frames, strict=True)])
    assert _postings_by_shard(db_index, shards) == [0] * shards  # 3 frames each: under merge_frames=4
    merged_per_txn = []
    for f in range(3, 3 + 4):  # one more frame per shard per transaction
        done = sum(1 for p in _postings_by_shard(db_index, shards) if p)
        more = _frames(f, 1, key_of)
        db_index.add_many([(v, more) for v in views])
        for fs in frames:
            fs.extend(more)
        merged_per_txn.append(sum(1 for p in _postings_by_shard(db_index, shards) if p) - done)
        for v, fs in zip(views, frames, strict=True):
            for k in range(5):
                assert v.key_frames(b"k%d" % k) == _brute(fs, b"k%d" % k)
    # Every shard was due from the first of these transactions on; they merged in turn.
    assert merged_per_txn == [MAX_MERGES_PER_TXN, MAX_MERGES_PER_TXN, MAX_MERGES_PER_TXN, 1]
    assert all(_postings_by_shard(db_index, shards))


def test_a_shard_twice_over_the_merge_threshold_merges_whatever_the_cap(db_index: DbIndex) -> None:
    """Deferral is bounded: with more shards due per transaction than the cap, a shard whose
    summaries reach twice the threshold (merge_frames=4 here) merges in the same transaction."""
    shards = 6 * MAX_MERGES_PER_TXN  # more due per transaction than the cap lets merge
    views = [db_index.shard(n) for n in range(shards)]
    key_of = lambda o: b"k%d" % (o % 5)  # noqa: E731
    frames: list[list[FrameEntry]] = [[] for _ in views]
    for f in range(12):  # all shards in step
        more = _frames(f, 1, key_of)
        db_index.add_many([(v, more) for v in views])
        for fs in frames:
            fs.extend(more)
        # Never more than twice the threshold of summaries pending on any shard.
        assert all(_entries(db_index, b"keyframe", n) < 8 for n in range(shards))
    for v, fs in zip(views, frames, strict=True):
        for k in range(5):
            assert v.key_frames(b"k%d" % k) == _brute(fs, b"k%d" % k)


def test_pending_summaries_survive_reopen_and_merge_later(tmp_path: Path) -> None:
    key_of = lambda o: b"k%d" % (o % 3)  # noqa: E731
    idx = DbIndex(tmp_path / "index", merge_frames=4)
    idx.shard(0).add(_frames(0, 3, key_of))
    idx.close()
    idx = DbIndex(tmp_path / "index", merge_frames=4)
    view = idx.shard(0)
    assert view.indexed_end == 30 and not view.rebuilt
    view.add(_frames(3, 2, key_of))  # the 3 summaries from before the reopen join this run
    assert (_entries(idx, b"keyframe"), _entries(idx, b"key")) == (1, 3)
    assert view.key_frames(b"k1") == [0, 10, 20, 30, 40]
    idx.close()


def test_truncate_from_cuts_postings_and_summaries_of_one_shard(db_index: DbIndex) -> None:
    a, b = db_index.shard(0), db_index.shard(1)
    key_of = lambda o: b"k%d" % (o % 4)  # noqa: E731
    frames = _frames(0, 7, key_of)  # one merged run (0..30) + 3 summaries (40..60)
    db_index.add_many([(a, frames), (b, frames)])
    for cut in (50, 20):
        a.truncate_from(cut)
        assert a.indexed_end == cut
        for k in range(4):
            assert a.key_frames(b"k%d" % k) == _brute(frames, b"k%d" % k, below=cut)
            assert b.key_frames(b"k%d" % k) == _brute(frames, b"k%d" % k)
    # Re-adding after the cut continues cleanly (frames 20.. again, merged at 4).
    a.add(frames[2:])
    for k in range(4):
        assert a.key_frames(b"k%d" % k) == _brute(frames, b"k%d" % k)
    assert a.floor(65) == b.floor(65) == (60, (0, 6000))


def test_delete_below_keeps_frames_that_reach_past_the_start(db_index: DbIndex) -> None:
    view, other = db_index.shard(0), db_index.shard(1)
    key_of = lambda o: b"k%d" % (o % 2)  # noqa: E731
    seg0 = _frames(0, 4, key_of, segment=0)  # merged run ends at 40
    seg1 = _frames(4, 4, key_of, segment=40)  # merged run 40..80
    seg2 = _frames(8, 2, key_of, segment=80)  # summaries
    frames = seg0 + seg1 + seg2
    db_index.add_many([(view, frames), (other, frames)])
    assert _entries(db_index, b"key", 0) == 4 and _entries(db_index, b"keyframe", 0) == 2
    view.delete_below(40)
    assert _entries(db_index, b"key", 0) == 2, "the postings of the run wholly below 40 are gone"
    assert view.key_frames(b"k1", start=40) == _brute(frames, b"k1", start=40)
    view.delete_below(85)  # mid-frame: the frame 80..90 still has readable records
    assert _entries(db_index, b"key", 0) == 0 and _entries(db_index, b"keyframe", 0) == 2
    assert view.key_frames(b"k1", start=85) == [80, 90]
    assert other.key_frames(b"k1") == _brute(frames, b"k1")
    assert _entries(db_index, b"key", 1) == 4


def test_reset_clears_only_its_shard(db_index: DbIndex) -> None:
    views = [db_index.shard(n) for n in range(3)]
    frames = _frames(0, 6, lambda o: b"k")
    db_index.add_many([(v, frames) for v in views])
    views[1].reset()
    assert views[1].indexed_end == 0
    assert views[1].key_frames(b"k") == [] and views[1].floor(50) is None and views[1].tag_frames(1) == []
    assert views[1].time_lower_bound(10**9) is None
    for v in (views[0], views[2]):
        assert v.key_frames(b"k") == [f.base_offset for f in frames]
        assert v.floor(50) is not None and len(v.tag_frames(1)) == 6
    views[1].add(frames)
    assert views[1].key_frames(b"k") == [f.base_offset for f in frames]


def test_long_keys_are_found_and_filtered_by_digest(db_index: DbIndex) -> None:
    view = db_index.shard(0)
    long_a = b"a" * (MAX_INLINE_KEY_BYTES + 1)
    long_b = b"a" * (MAX_INLINE_KEY_BYTES + 1) + b"b"  # same start, another digest
    huge = os.urandom(100_000)
    keys: list[list[bytes | None]] = [
        [long_a, b"s"],
        [long_b, None],
        [huge, b""],
        [b"s", None],
        [long_a, long_b],
    ]
    frames = [_frame(i * 2, k) for i, k in enumerate(keys)]
    view.add(frames[:3])  # summaries
    view.add(frames[3:])  # 5 frames: the first 4 merge into postings
    assert _entries(db_index, b"key") > 0 and _entries(db_index, b"keyframe") == 1
    assert view.key_frames(long_a) == [0, 8]
    assert view.key_frames(long_b) == [2, 8]
    assert view.key_frames(huge) == [4]
    assert view.key_frames(b"") == [4]
    assert view.key_frames(b"s") == [0, 6]
    assert view.key_frames(b"a" * (MAX_INLINE_KEY_BYTES + 2)) == []


def test_frames_without_keys_have_no_key_entries(db_index: DbIndex) -> None:
    view = db_index.shard(0)
    view.add([_frame(0, [None, None]), FrameEntry(2, 4, 0, 0, 200, 200, None, [])])
    assert _entries(db_index, b"keyframe") == 0 and view.indexed_end == 4
    assert view.key_frames(b"") == []


def test_other_boots_open_marker_rebuilds_the_whole_environment(tmp_path: Path, caplog) -> None:
    path = tmp_path / "index"
    idx = DbIndex(path)
    views = [idx.shard(n) for n in range(20)]
    idx.add_many([(v, _frames(0, 2, lambda o: b"k")) for v in views])
    idx.close()
    assert not (path / "OPEN").exists(), "a clean close clears the OPEN record"

    (path / "OPEN").write_text(seglog._fs.boot_id())  # a process crash of this boot: kept
    idx = DbIndex(path)
    assert not idx.rebuilt and all(idx.shard(n).indexed_end == 20 for n in range(20))
    idx.close()

    (path / "OPEN").write_text("another-boot-id")  # a machine crash: the whole env may be torn
    caplog.set_level(logging.WARNING)
    idx = DbIndex(path)
    assert idx.rebuilt
    assert sum("may be torn" in r.getMessage() for r in caplog.records) == 1
    for n in range(20):
        view = idx.shard(n)
        assert view.rebuilt and view.indexed_end == 0 and view.key_frames(b"k") == []
    assert (path / "OPEN").read_text() == seglog._fs.boot_id()
    idx.close()


def test_unknown_format_is_rebuilt(tmp_path: Path, caplog) -> None:
    path = tmp_path / "index"
    DbIndex(path).close()
    env = lmdb.open(str(path), max_dbs=8)
    with env.begin(write=True) as txn:
        txn.put(b"format", b"99", db=env.open_db(b"meta", txn=txn))
    env.close()
    idx = DbIndex(path)
    assert idx.rebuilt and any("rebuilding it" in r.getMessage() for r in caplog.records)
    idx.close()


def test_legacy_per_shard_index_is_removed_and_the_shard_cleared(tmp_path: Path) -> None:
    idx = DbIndex(tmp_path / "index")
    a, b = idx.shard(0), idx.shard(1)
    idx.add_many([(a, _frames(0, 2, lambda o: b"k")), (b, _frames(0, 2, lambda o: b"k"))])
    idx.close()
    legacy = tmp_path / "shard-0001" / "index"
    legacy.mkdir(parents=True)
    (legacy / "data.mdb").write_bytes(b"old")
    idx = DbIndex(tmp_path / "index")
    assert idx.shard(0).indexed_end == 20
    b = idx.shard(1, legacy_dir=legacy)
    assert not legacy.exists()
    assert b.indexed_end == 0 and b.key_frames(b"k") == [], (
        "whatever wrote the old index may have moved the log"
    )
    assert idx.shard(0).key_frames(b"k") == [0, 10]
    idx.close()


def test_ten_thousand_shards_open_with_a_few_descriptors(tmp_path: Path) -> None:
    """Shards share one environment: descriptors and maps do not grow with the shard count."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
    try:
        fds_before = len(os.listdir("/proc/self/fd"))
        idx = DbIndex(tmp_path / "index")
        views = [idx.shard(n) for n in range(10_000)]
        idx.add_many([(v, [_frame(0, [b"dev-%d" % v.number] * 3)]) for v in views])
        assert len(os.listdir("/proc/self/fd")) - fds_before <= 3
        assert views[9_999].key_frames(b"dev-9999") == [0]
        idx.close()
        idx = DbIndex(tmp_path / "index")
        assert idx.shard(9_999).indexed_end == 3
        idx.close()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert [p.name for p in tmp_path.iterdir()] == ["index"]


def test_views_are_shard_index_objects(db_index: DbIndex) -> None:
    view = db_index.shard(4)
    assert isinstance(view, ShardIndex) and view.number == 4


def test_a_view_given_twice_takes_its_frames_in_order(db_index: DbIndex) -> None:
    view = db_index.shard(0)
    frames = _frames(0, 6, lambda o: b"k%d" % (o % 3))
    before = _txn_id(db_index)
    db_index.add_many([(view, frames[:2]), (db_index.shard(1), frames[:1]), (view, frames[2:])])
    assert _txn_id(db_index) == before + 1
    assert view.indexed_end == 60 and view.key_frames(b"k2") == [f.base_offset for f in frames]


def test_a_key_column_arrow_cannot_index_is_an_index_failure(db_index: DbIndex) -> None:
    """The frames are durable when the index sees them: it must fail as the index, not the write."""
    view = db_index.shard(0)
    bad = FrameEntry(0, 2, 0, 0, 0, 200, pa.array([[1], [2]], pa.list_(pa.int64())), [1])
    with pytest.raises(StorageError):
        view.add([bad])
    assert view.indexed_end == 0


@pytest.mark.parametrize("tags_per_frame", [1, 3, 16])
def test_tag_entries_are_keyed_by_tag_then_frame_whichever_way_they_are_built(
    db_index: DbIndex, tags_per_frame: int
) -> None:
    """A few tag entries are packed in Python, many with NumPy: both give the same entries."""
    view = db_index.shard(7)
    frames = []
    for f in range(8):  # 8, 24 and 128 entries: both sides of the Python/NumPy cut-over
        base = f * FRAME_RECORDS
        tags = sorted({(f * 5 + t * 3) % 11 for t in range(tags_per_frame)} | {f % 2})
        frames.append(_frame(base, [b"k"] * FRAME_RECORDS)._replace(tags=np.array(tags, np.uint32)))
    db_index.add_many([(view, frames[:3]), (db_index.shard(8), frames[:1]), (view, frames[3:])])
    want = sorted(
        (struct.pack(">IIQ", 7, tag, fr.base_offset), struct.pack(">QQ", fr.segment_base, fr.pos))
        for fr in frames
        for tag in fr.tags.tolist()
    )
    t = db_index._tables
    with t.env.begin() as txn:
        got = [(bytes(k), bytes(v)) for k, v in txn.cursor(t.tag) if k[:4] == struct.pack(">I", 7)]
    assert got == want
    for tag in range(11):
        holding = [fr for fr in frames if tag in fr.tags.tolist()]
        assert view.tag_frames(tag) == [(fr.base_offset, (fr.segment_base, fr.pos)) for fr in holding]
