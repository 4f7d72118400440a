"""The manifest's per-shard index against brute force: every query, after every change.

The manifest answers tier reads and every ``start_offset`` (each fetch reply carries the log
start) from a sorted view per shard, and saves serialise only the entries that changed. A
database that keeps its history in the tier gains an entry per sealed segment forever, so
these must not scan (or re-serialise) every entry; here they must also give exactly what a
scan of every entry gives.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seglog.errors import InvalidArgument, TierError
from seglog.tiering import EntryState, Manifest, ManifestEntry
from seglog.tiering.db_tier import cold_run, logical_start
from tests.test_manifest import DB, entry


def _entry(shard: int, base: int, end: int, state: EntryState, ts: int) -> ManifestEntry:
    return entry(shard, base, end, state=state, min_ts=ts, max_ts=ts + 5)


@st.composite
def _manifests(draw: st.DrawFn) -> list[ManifestEntry]:
    """Entries of up to 3 shards: runs of objects, with gaps, in every state."""
    out = []
    for shard in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, 5))
        for _ in range(draw(st.integers(0, 12))):
            at += draw(st.sampled_from([0, 0, 0, 1, 7]))  # mostly gapless
            size = draw(st.integers(1, 6))
            state = draw(
                st.sampled_from([EntryState.COMMITTED] * 4 + [EntryState.UPLOADING, EntryState.DELETING])
            )
            out.append(_entry(shard, at, at + size - 1, state, draw(st.integers(0, 50))))
            at += size
    draw(st.randoms()).shuffle(out)
    return out


def _brute_committed(
    entries: list[ManifestEntry],
    shard: int | None,
    start: int | None,
    end: int | None,
    t0: int | None,
    t1: int | None,
) -> list[ManifestEntry]:
    return sorted(
        (
            e
            for e in entries
            if e.state is EntryState.COMMITTED
            and (shard is None or e.shard == shard)
            and e.overlaps_offsets(start, end)
            and e.overlaps_time(t0, t1)
        ),
        key=lambda e: (e.shard, e.base_offset),
    )


def _brute_cold_run(entries: list[ManifestEntry], shard: int, local_start: int) -> list[ManifestEntry]:
    """The scan ``db_tier.cold_run`` did before the index."""
    start = local_start
    run: list[ManifestEntry] = []
    for e in reversed(_brute_committed(entries, shard, None, max(local_start - 1, 0), None, None)):
        if e.base_offset < start <= e.end_offset + 1:
            start = e.base_offset
            run.append(e)
        elif e.end_offset + 1 < start:
            break
    return run[::-1]


def _check(manifest: Manifest, entries: list[ManifestEntry]) -> None:
    top = max((e.end_offset for e in entries), default=0) + 3
    assert manifest.entries() == sorted(entries, key=lambda e: (e.shard, e.base_offset))
    for state in EntryState:
        assert manifest.entries(state) == [e for e in manifest.entries() if e.state is state]
    assert manifest.committed() == _brute_committed(entries, None, None, None, None, None)
    assert manifest.shards() == sorted({e.shard for e in entries})
    for shard in range(4):
        mine = _brute_committed(entries, shard, None, None, None, None)
        assert manifest.tiered_end(shard) == (mine[-1].end_offset if mine else None)
        assert manifest.committed_bytes(shard) == sum(e.bytes for e in mine)
        for offset in range(top):
            holding = _brute_committed(entries, shard, offset, offset, None, None)
            assert manifest.find_offset(shard, offset) == (holding[0] if holding else None)
            run = _brute_cold_run(entries, shard, offset)
            assert cold_run(manifest, shard, offset) == run
            assert logical_start(manifest, shard, offset) == max(
                run[0].base_offset if run else offset, min(manifest.log_start(shard), offset)
            )
        for start in range(0, top, 3):
            for end in (None, start, start + 4, top):
                for t0, t1 in ((None, None), (10, None), (None, 20), (15, 30)):
                    got = manifest.committed(
                        shard, start_offset=start, end_offset=end, start_ts=t0, end_ts=t1
                    )
                    assert got == _brute_committed(entries, shard, start, end, t0, t1)


@settings(max_examples=60, deadline=None)
@given(_manifests())
def test_every_query_matches_a_scan_of_every_entry(entries: list[ManifestEntry]) -> None:
    manifest = Manifest(DB, entries)
    _check(manifest, entries)
    loaded = Manifest.from_json(manifest.to_json(), db=DB)
    _check(loaded, entries)
    assert json.loads(loaded.to_json()) == json.loads(manifest.to_json())


@settings(max_examples=40, deadline=None)
@given(_manifests(), st.data())
def test_queries_and_saves_follow_every_change(entries: list[ManifestEntry], data: st.DataObject) -> None:
    manifest = Manifest(DB, entries)
    manifest.to_json()  # every entry's text is now cached: later saves must not serve stale ones
    live = {e.key: e for e in entries}
    for _ in range(data.draw(st.integers(1, 8))):
        keys = sorted(live)
        step = data.draw(st.sampled_from(["advance", "remove", "add"] if keys else ["add"]))
        if step == "add":
            shard = data.draw(st.integers(0, 3))
            base = data.draw(st.integers(0, 80))
            new = _entry(shard, base, base + data.draw(st.integers(0, 4)), EntryState.UPLOADING, 1)
            overlapping = any(
                e.shard == shard and e.key != new.key and e.overlaps_offsets(new.base_offset, new.end_offset)
                for e in live.values()
            )
            taken = new.key in live and live[new.key].state is not EntryState.UPLOADING
            if overlapping or taken:
                with pytest.raises(InvalidArgument):
                    manifest.begin_upload(new)
                continue
            live[new.key] = manifest.begin_upload(new)
        else:
            key = data.draw(st.sampled_from(keys))
            e = live[key]
            if step == "advance" and e.state is EntryState.UPLOADING:
                live[key] = manifest.mark_committed(key)
            elif step == "advance" and e.state is EntryState.COMMITTED:
                live[key] = manifest.mark_deleting(key)
            elif e.state is not EntryState.COMMITTED:
                manifest.remove(key)
                del live[key]
        _check(manifest, list(live.values()))
        assert manifest.to_json() == Manifest(DB, live.values()).to_json()


def test_a_document_with_overlapping_or_repeated_entries_does_not_load() -> None:
    a = _entry(0, 0, 9, EntryState.COMMITTED, 0)
    b = _entry(0, 9, 12, EntryState.COMMITTED, 0)
    with pytest.raises(InvalidArgument, match="overlaps"):
        Manifest(DB, [b, a])
    with pytest.raises(InvalidArgument, match="twice"):
        Manifest(DB, [a, a])
    doc = json.loads(Manifest(DB, [a]).to_json())
    doc["entries"].append(doc["entries"][0] | {"key": b.key, "base_offset": 9, "end_offset": 12})
    with pytest.raises(TierError, match="overlaps"):
        Manifest.from_json(json.dumps(doc), db=DB)
