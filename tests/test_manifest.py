"""Tier manifest: serialisation, states, queries, and recovery from every crash point."""

from __future__ import annotations

import json
from pathlib import Path

import crc32c
import pyarrow as pa
import pytest

from seglog.errors import InvalidArgument, TierError
from seglog.tiering import (
    SEGMENT_SCHEMA,
    EntryState,
    LocalTarget,
    Manifest,
    ManifestEntry,
    ObjectInfo,
    ObjectMismatch,
    ObjectNotFound,
    ObjectPart,
    delete_tiered,
    manifest_key,
    object_key,
    open_target,
    parquet_to_segment_table,
    parse_object_key,
    read_tiered,
    recover_manifest,
    segment_stats,
    segment_table_to_parquet,
    upload_segment,
)
from seglog.tiering.parquet import ROW_GROUP_ROWS, footer_metadata, parquet_part_spans
from tests.tier_fixtures import MinioServer, make_segment_table

TS0 = 1_700_000_000_000_000
DB = "mydb"


def entry(
    shard: int,
    base: int,
    end: int,
    *,
    state: EntryState = EntryState.COMMITTED,
    min_ts: int = 0,
    max_ts: int = 10,
) -> ManifestEntry:
    return ManifestEntry(
        key=object_key(DB, shard, base, end),
        shard=shard,
        base_offset=base,
        end_offset=end,
        min_ts=min_ts,
        max_ts=max_ts,
        rows=end - base + 1,
        bytes=123,
        checksum="ab" * 32,
        state=state,
    )


@pytest.fixture
def target(tmp_path: Path) -> LocalTarget:
    return LocalTarget(tmp_path / "tier")


# --- naming and parquet ----------------------------------------------------------------


def test_object_key_is_inclusive_and_parses_back() -> None:
    key = object_key("db", 3, 1000, 1999)
    assert key == "db/shard=3/00000000000000001000-00000000000000001999.parquet"
    assert parse_object_key(key) == ("db", 3, 1000, 1999)
    assert object_key("db", 0, 5, 5).endswith("00000000000000000005-00000000000000000005.parquet")
    for bad in [("db", 0, 5, 4), ("db", -1, 0, 0), ("a/b", 0, 0, 0), ("", 0, 0, 0), (".x", 0, 0, 0)]:
        with pytest.raises(InvalidArgument):
            object_key(*bad)


def test_parquet_roundtrip_sorts_and_restores_types() -> None:
    table = make_segment_table(100, 500, ts0_us=TS0)
    shuffled = table.take(pa.array(list(range(499, -1, -2)) + list(range(0, 500, 2))))
    data = segment_table_to_parquet(shuffled)
    back = parquet_to_segment_table(data)
    assert back.schema == SEGMENT_SCHEMA
    assert back.to_pylist() == table.cast(SEGMENT_SCHEMA).to_pylist()
    cut = parquet_to_segment_table(data, start_offset=150, end_offset=160)
    assert cut.column("offset").to_pylist() == list(range(150, 161))
    assert segment_stats(table).end_offset == 599


def test_parquet_rejects_bad_tables() -> None:
    table = make_segment_table(0, 10, ts0_us=TS0)
    with pytest.raises(InvalidArgument):
        segment_table_to_parquet(table.drop_columns(["topic"]))
    with pytest.raises(InvalidArgument):
        segment_table_to_parquet(table.slice(0, 0))
    with pytest.raises(TierError):
        parquet_to_segment_table(b"not parquet")


# --- manifest basics -------------------------------------------------------------------


def test_json_roundtrip_and_queries(target: LocalTarget, tmp_path: Path) -> None:
    m = Manifest(DB)
    m.begin_upload(entry(0, 0, 99, min_ts=0, max_ts=100))
    m.mark_committed(object_key(DB, 0, 0, 99))
    m.begin_upload(entry(0, 100, 199, min_ts=100, max_ts=200))
    m.mark_committed(object_key(DB, 0, 100, 199))
    m.begin_upload(entry(1, 0, 49, min_ts=50, max_ts=150))
    m.mark_committed(object_key(DB, 1, 0, 49))
    m.begin_upload(entry(1, 50, 99))  # stays uploading: invisible to readers
    local = tmp_path / "local" / "manifest.json"
    m.save(target, local_path=local)

    doc = json.loads(local.read_text())
    assert doc["version"] == 1 and doc["db"] == DB and doc["seq"] == 1
    assert target.get(manifest_key(DB)) == local.read_bytes()

    loaded = Manifest.load(target, DB)
    assert loaded.entries() == m.entries() and loaded.seq == 1
    assert [e.key for e in loaded.committed(0)] == [object_key(DB, 0, 0, 99), object_key(DB, 0, 100, 199)]
    assert [e.base_offset for e in loaded.committed(0, start_offset=99, end_offset=100)] == [0, 100]
    assert [e.base_offset for e in loaded.committed(0, start_offset=150)] == [100]
    assert [e.shard for e in loaded.committed(start_ts=160)] == [0]
    assert [e.shard for e in loaded.committed(end_ts=60)] == [0, 1]
    assert loaded.find_offset(0, 150) == m.get(object_key(DB, 0, 100, 199))
    assert loaded.find_offset(1, 60) is None  # uploading, not committed
    assert loaded.tiered_end(0) == 199 and loaded.tiered_end(5) is None
    assert loaded.shards() == [0, 1]
    assert len(loaded.entries(EntryState.UPLOADING)) == 1


def test_state_machine() -> None:
    m = Manifest(DB)
    e = m.begin_upload(entry(0, 0, 9, state=EntryState.COMMITTED))  # state is forced
    assert e.state is EntryState.UPLOADING
    with pytest.raises(InvalidArgument):
        m.mark_deleting(e.key)  # uploading -> deleting is not a transition
    m.mark_committed(e.key)
    m.mark_committed(e.key)  # idempotent
    with pytest.raises(InvalidArgument):
        m.begin_upload(entry(0, 0, 9))  # already committed
    with pytest.raises(InvalidArgument):
        m.remove(e.key)  # committed must be marked deleting first
    m.mark_deleting(e.key)
    with pytest.raises(InvalidArgument):
        m.mark_committed(e.key)
    m.remove(e.key)
    m.remove(e.key)
    assert m.entries() == []
    with pytest.raises(InvalidArgument):
        m.mark_committed("mydb/shard=0/nope.parquet")


def test_rejects_overlaps_and_mismatched_keys() -> None:
    m = Manifest(DB, [entry(0, 0, 99)])
    with pytest.raises(InvalidArgument):
        m.begin_upload(entry(0, 50, 149))
    m.begin_upload(entry(1, 50, 149))  # other shard is fine
    bad = ManifestEntry(object_key(DB, 0, 200, 299), 0, 200, 300, 0, 1, 1, 1, "x")
    with pytest.raises(InvalidArgument):
        m.begin_upload(bad)
    with pytest.raises(InvalidArgument):
        Manifest("a/b")


def test_load_rejects_bad_documents(target: LocalTarget) -> None:
    target.put(manifest_key(DB), b'{"version": 3, "db": "mydb", "seq": 1, "entries": []}')
    with pytest.raises(TierError, match="version"):
        Manifest.load(target, DB)
    target.put(manifest_key(DB), b'{"version": 1, "db": "other", "seq": 1, "entries": []}')
    with pytest.raises(TierError, match="other"):
        Manifest.load(target, DB)
    target.put(manifest_key(DB), b"{not json")
    with pytest.raises(TierError, match="malformed"):
        Manifest.load(target, DB)
    bad_entry = {"version": 1, "db": DB, "seq": 1, "entries": [{"key": "x"}]}
    target.put(manifest_key(DB), json.dumps(bad_entry).encode())
    with pytest.raises(TierError):
        Manifest.load(target, DB)


def test_load_missing_is_empty(target: LocalTarget, tmp_path: Path) -> None:
    m = Manifest.load(target, DB, local_path=tmp_path / "none.json")
    assert m.entries() == [] and m.seq == 0


def test_newer_copy_wins_and_bad_local_copy_is_ignored(target: LocalTarget, tmp_path: Path) -> None:
    local = tmp_path / "m.json"
    m = Manifest(DB, [entry(0, 0, 9)])
    m.save(target, local_path=local)  # seq 1 in both
    # A save that reached the local disk but not the tier (remote put failed):
    m.begin_upload(entry(0, 10, 19))
    broken = LocalTarget(tmp_path / "file-not-dir")
    (tmp_path / "file-not-dir").write_bytes(b"")  # a file where the directory should be
    with pytest.raises(TierError):
        m.save(broken, local_path=local)
    assert Manifest.load(target, DB, local_path=local).seq == 2
    assert len(Manifest.load(target, DB, local_path=local).entries()) == 2
    assert Manifest.load(target, DB).seq == 1
    # A newer tier copy beats an older local one.
    m.save(target)  # seq 3, tier only
    assert Manifest.load(target, DB, local_path=local).seq == 3
    local.write_bytes(b"garbage")
    assert Manifest.load(target, DB, local_path=local).seq == 3


# --- the protocol and crash recovery ---------------------------------------------------


def test_upload_and_read_through(target: LocalTarget, tmp_path: Path) -> None:
    local = tmp_path / "m.json"
    m = Manifest.load(target, DB, local_path=local)
    seg1 = make_segment_table(0, 300, ts0_us=TS0)
    seg2 = make_segment_table(300, 200, ts0_us=TS0 + 300_000_000)
    e1 = upload_segment(target, m, 0, seg1, local_manifest=local)
    e2 = upload_segment(target, m, 0, seg2, local_manifest=local)
    assert (e1.state, e2.state) == (EntryState.COMMITTED, EntryState.COMMITTED)
    assert (e1.base_offset, e1.end_offset, e1.rows) == (0, 299, 300)
    assert (e2.min_ts, e2.max_ts) == (TS0 + 300_000_000, TS0 + 300_000_000 + 199_000_000)
    target.verify(e1.key, e1.object_info)

    again = Manifest.load(target, DB, local_path=local)
    tables = list(read_tiered(target, again, 0, 250, end_offset=320))
    offsets = [o for t in tables for o in t.column("offset").to_pylist()]
    assert offsets == list(range(250, 321))
    assert [t.num_rows for t in tables] == [50, 21]
    everything = pa.concat_tables(read_tiered(target, again, 0, 0))
    assert everything.to_pylist() == pa.concat_tables([seg1, seg2]).cast(SEGMENT_SCHEMA).to_pylist()
    assert list(read_tiered(target, again, 1, 0)) == []

    delete_tiered(target, again, e1.key, local_manifest=local)
    assert target.head(e1.key) is None
    assert [e.key for e in Manifest.load(target, DB, local_path=local).entries()] == [e2.key]


def test_uploaded_entries_carry_checked_parts_for_ranged_reads(target: LocalTarget, tmp_path: Path) -> None:
    """Each row group, the page indexes and the footer are a part: contiguous, covering the
    object, each with the CRC32C of its bytes; the manifest keeps them across a reload."""
    local = tmp_path / "m.json"
    m = Manifest.load(target, DB, local_path=local)
    rows = 2 * ROW_GROUP_ROWS + 10
    e = upload_segment(target, m, 0, make_segment_table(0, rows, ts0_us=TS0), local_manifest=local)
    data = target.get(e.key)
    assert [(p.start, p.end) for p in e.parts] == parquet_part_spans(data)
    assert e.parts[0].start == 0 and e.parts[-1].end == len(data) == e.bytes
    assert len(e.parts) >= 3 + 1  # three row groups and the footer at least
    assert all(p.crc32c == crc32c.crc32c(data[p.start : p.end]) for p in e.parts)
    meta = footer_metadata(data[e.parts[-1].start :])  # the footer alone parses
    assert meta.num_rows == rows and meta.num_row_groups == 3
    assert Manifest.load(target, DB, local_path=local).get(e.key) == e


def test_entries_without_parts_load_and_bad_parts_are_rejected(target: LocalTarget) -> None:
    old = entry(0, 0, 99).to_json()
    assert "parts" not in old  # the document written before ranged reads
    doc = {"version": 1, "db": DB, "seq": 1, "entries": [old]}
    target.put(manifest_key(DB), json.dumps(doc).encode())
    assert Manifest.load(target, DB).entries()[0].parts == ()
    for parts in ([[0, 100, 1], [101, 123, 2]], [[0, 100, 1]], [[0, 123]], [["0", 123, 1]], {"a": 1}):
        target.put(manifest_key(DB), json.dumps({**doc, "entries": [{**old, "parts": parts}]}).encode())
        with pytest.raises(TierError, match="malformed"):
            Manifest.load(target, DB)
    good = {**old, "parts": [[0, 100, 1], [100, 123, 2]]}
    target.put(manifest_key(DB), json.dumps({**doc, "entries": [good]}).encode())
    assert Manifest.load(target, DB).entries()[0].parts == (ObjectPart(0, 100, 1), ObjectPart(100, 123, 2))


def test_read_through_detects_corruption(target: LocalTarget) -> None:
    m = Manifest(DB)
    e = upload_segment(target, m, 0, make_segment_table(0, 100, ts0_us=TS0))
    path = target.root / e.key
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ObjectMismatch):
        list(read_tiered(target, m, 0, 0))
    target.delete(e.key)
    with pytest.raises(ObjectNotFound):
        list(read_tiered(target, m, 0, 0))


def begin(target: LocalTarget, m: Manifest, base: int, rows: int) -> tuple[ManifestEntry, bytes]:
    """Steps 1-2 of the upload protocol: encode and durably record the intent."""
    import hashlib

    table = make_segment_table(base, rows, ts0_us=TS0 + base)
    stats = segment_stats(table)
    data = segment_table_to_parquet(table)
    key = object_key(DB, 0, stats.base_offset, stats.end_offset)
    e = m.begin_upload(
        ManifestEntry.for_upload(0, stats, ObjectInfo(key, len(data), hashlib.sha256(data).hexdigest()))
    )
    m.save(target)
    return e, data


def test_recover_every_crash_point(target: LocalTarget) -> None:
    m = Manifest(DB)
    # Crash after the intent was saved, before any byte was uploaded.
    no_object, _ = begin(target, m, 0, 10)
    # Crash in the middle of the upload: a partial object (e.g. a non-atomic store).
    partial, data = begin(target, m, 10, 10)
    target.put(partial.key, data[: len(data) // 2])
    # Crash after put + verify, before the commit was saved.
    uploaded, data = begin(target, m, 20, 10)
    target.put(uploaded.key, data)
    # Committed and untouched.
    done, data = begin(target, m, 30, 10)
    target.put(done.key, data)
    m.mark_committed(done.key)
    # Crash after marking deleting, before the object was deleted ...
    dying, data = begin(target, m, 40, 10)
    target.put(dying.key, data)
    m.mark_committed(dying.key)
    m.mark_deleting(dying.key)
    # ... and after the object was deleted, before the entry was dropped.
    dead, data = begin(target, m, 50, 10)
    target.put(dead.key, data)
    m.mark_committed(dead.key)
    m.mark_deleting(dead.key)
    m.save(target)
    target.delete(dead.key)

    recovered, actions = recover_manifest(target, DB)
    assert sorted(actions) == sorted(
        [
            f"dropped {no_object.key}",
            f"deleted {partial.key}",
            f"committed {uploaded.key}",
            f"removed {dying.key}",
            f"removed {dead.key}",
        ]
    )
    assert [e.key for e in recovered.entries()] == [uploaded.key, done.key]
    assert all(e.state is EntryState.COMMITTED for e in recovered.entries())
    assert target.head(partial.key) is None and target.head(dying.key) is None
    assert recovered.orphans(target) == []
    # The recovery itself was saved, and a second pass has nothing to do.
    again, actions = recover_manifest(target, DB)
    assert actions == [] and again.entries() == recovered.entries()
    # The dropped segments can simply be tiered again.
    upload_segment(target, again, 0, make_segment_table(0, 20, ts0_us=TS0))
    assert [e.base_offset for e in again.committed(0)] == [0, 20, 30]


def test_orphans(target: LocalTarget) -> None:
    m = Manifest(DB)
    upload_segment(target, m, 0, make_segment_table(0, 5, ts0_us=TS0))
    stray = object_key(DB, 2, 0, 9)
    target.put(stray, b"x")
    assert m.orphans(target) == [stray]


def test_manifest_on_minio(minio: MinioServer, bucket: str, tmp_path: Path) -> None:
    t = open_target(
        f"s3://{bucket}/tier",
        s3_endpoint=minio.endpoint,
        access_key=minio.access_key,
        secret_key=minio.secret_key,
    )
    local = tmp_path / "m.json"
    m = Manifest.load(t, DB, local_path=local)
    entry_ = upload_segment(t, m, 1, make_segment_table(0, 50, ts0_us=TS0), local_manifest=local)
    assert t.list(f"{DB}/") == [manifest_key(DB), entry_.key]
    loaded = Manifest.load(t, DB)
    assert loaded.entries() == [entry_]
    got = pa.concat_tables(read_tiered(t, loaded, 1, 10))
    assert got.column("offset").to_pylist() == list(range(10, 50))
