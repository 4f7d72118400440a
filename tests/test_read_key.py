"""``read_key`` on the segment engine: per-frame key summaries + merged postings, one index per DB."""

from __future__ import annotations

import logging
import random
import shutil
import struct
from pathlib import Path

import lmdb
import pytest

import seglog
from seglog.errors import StorageError
from seglog.index import MAX_INLINE_KEY_BYTES
from tests.helpers import make_records, read_all

LONG_KEYS = [b"L" * (MAX_INLINE_KEY_BYTES + 1), b"L" * (MAX_INLINE_KEY_BYTES + 1) + b"2", b"x" * 5000]
COMMON: list[bytes | None] = [b"dev%d" % i for i in range(40)] + [*LONG_KEYS, b"", None]
KEYS = [*COMMON, b"rare"]


def _records(n: int, rng: random.Random, *, rare: bool = False) -> list[seglog.Record]:
    """``n`` records with common keys (in most frames), plus one ``rare`` one if asked."""
    out = [
        seglog.Record(topic="t/a", value=b"v%d" % rng.randrange(10**6), key=rng.choice(COMMON))
        for _ in range(n)
    ]
    if rare:
        out.insert(rng.randrange(n + 1), seglog.Record(topic="t/a", value=b"rare", key=b"rare"))
    return out


async def _check_every_key(db: seglog.Database, shard: int = 0) -> int:
    """Assert read_key of every key equals a scan of the shard; return the records compared."""
    everything = await read_all(db, shard)
    for key in KEYS:
        if key is None:
            continue
        want = [(r.offset, r.value) for r in everything if r.key == key]
        got = [(r.offset, r.value) for r in await db.read_key(shard, key)]
        assert got == want, f"key {key[:20]!r}"
    return len(everything)


def _key_entries(db: seglog.Database) -> tuple[int, int]:
    """(postings, per-frame summaries) in the database's index environment."""
    t = db._engine._index._tables  # type: ignore[attr-defined]
    with t.env.begin() as txn:
        return txn.stat(t.key)["entries"], txn.stat(t.keyframe)["entries"]


def test_read_key_is_exact_across_postings_summaries_reopen_retention_and_rebuild(
    run, data_dir: Path
) -> None:
    rng = random.Random(7)

    async def write() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", segment_bytes=32 * 1024)
            for i in range(60):  # frames of the rare key are > 16 frames apart: located, not walked to
                await db.append(_records(rng.randrange(1, 120), rng, rare=i % 20 == 3), shard=0)
            # Entries wait in the worker's backlog for a few drains (or ~50 ms): written first.
            await db._engine.drain()  # type: ignore[attr-defined]
            postings, summaries = _key_entries(db)
            assert postings > 0 and summaries > 0, "both forms of the key index are exercised"
            assert len(db._engine._shards[0].log.segments_snapshot()) > 3  # type: ignore[attr-defined]
            assert await _check_every_key(db) > 2000

    run(write())

    async def reopen_and_cut() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.open_db("t")
            await _check_every_key(db)
            await db.append(_records(50, rng), shard=0)  # summaries of before the reopen merge on later
            await _check_every_key(db)
            mid = db.end_offset(0) // 2 + 3  # mid-segment, likely mid-frame
            await db.truncate_before(0, mid)
            assert db.start_offset(0) == mid
            await _check_every_key(db)
            await db.seal(0)
            await db.append(_records(10, rng), shard=0)  # the sealed segment's summaries merge
            await _check_every_key(db)

    run(reopen_and_cut())
    shutil.rmtree(data_dir / "dbs" / "t" / "index")

    async def rebuilt() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.open_db("t")
            await _check_every_key(db)

    run(rebuilt())


def test_two_hundred_shards_share_one_index_environment(run, data_dir: Path) -> None:
    async def main() -> dict[int, list[int]]:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", shards=200)
            await db.append(make_records(2000))
            return {s: [r.offset for r in await db.read_key(s, b"dev3")] for s in range(200)}

    found = run(main())
    db_dir = data_dir / "dbs" / "t"
    envs = sorted(p.parent for p in db_dir.rglob("data.mdb"))
    assert envs == [db_dir / "groups", db_dir / "index"]
    assert not list(db_dir.glob("shard-*/index"))
    assert sum(len(v) for v in found.values()) == 40 and len([s for s in found if found[s]]) == 1

    async def reopen() -> dict[int, list[int]]:
        async with seglog.open(data_dir) as store:
            db = await store.open_db("t")
            return {s: [r.offset for r in await db.read_key(s, b"dev3")] for s in range(200)}

    assert run(reopen()) == found


def _make_legacy_index(shard_dir: Path) -> None:
    """A per-shard environment as the old layout kept it (its contents are not trusted)."""
    env = lmdb.open(str(shard_dir / "index"), max_dbs=8)
    with env.begin(write=True) as txn:
        keys = env.open_db(b"key", txn=txn)
        txn.put(struct.pack(">H", 4) + b"dev3" + struct.pack(">Q", 1), b"", db=keys)  # a wrong entry
        txn.put(b"indexed_end", struct.pack(">Q", 10**6), db=env.open_db(b"meta", txn=txn))
    env.close()


@pytest.mark.parametrize("new_index", ["missing", "stale"])
def test_database_of_the_old_layout_opens_and_reads_by_key(
    run, data_dir: Path, new_index: str, caplog
) -> None:
    async def write() -> list[int]:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", shards=2, segment_bytes=16 * 1024)
            for i in range(0, 2000, 100):
                await db.append(make_records(100, start=i), shard=0)
            return [r.offset for r in await db.read_key(0, b"dev3")]

    want = run(write())
    db_dir = data_dir / "dbs" / "t"
    if new_index == "missing":  # a database written before indexes were shared
        shutil.rmtree(db_dir / "index")
    else:  # the shared index saw an older log: e.g. opened by an older version since
        env = lmdb.open(str(db_dir / "index"), max_dbs=8)
        with env.begin(write=True) as txn:
            for name in (b"key", b"keyframe"):
                txn.drop(env.open_db(name, txn=txn), delete=False)
        env.close()
    for shard in ("shard-0000", "shard-0001"):
        _make_legacy_index(db_dir / shard)
    caplog.set_level(logging.INFO)

    async def reopen() -> list[int]:
        async with seglog.open(data_dir) as store:
            db = await store.open_db("t")
            assert await db.read_key(1, b"dev3") == []
            return [r.offset for r in await db.read_key(0, b"dev3")]

    assert run(reopen()) == want
    assert not list(db_dir.glob("shard-*/index")), "the old per-shard indexes are removed"
    assert (db_dir / "index" / "data.mdb").exists()
    assert sum("old layout" in r.getMessage() for r in caplog.records) == 2


def test_a_key_entry_pointing_at_no_frame_is_detected_and_repaired(run, data_dir: Path, caplog) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", segment_bytes=16 * 1024)
            for i in range(0, 2000, 100):
                await db.append(make_records(100, start=i))
            await db.seal(0)
            await db.append(make_records(100, start=2000))  # the sealed segment's summaries merge
            want = [(r.offset, r.value) for r in await read_all(db, 0) if r.key == b"dev3"]
            t = db._engine._index._tables  # type: ignore[attr-defined]
            with t.env.begin(write=True) as txn:
                cur = txn.cursor(t.key)
                prefix = struct.pack(">IH", 0, 4) + b"dev3"
                assert cur.set_range(prefix) and cur.key().startswith(prefix)
                run_end = struct.unpack_from(">Q", cur.value())[0]
                cur.put(cur.key(), struct.pack(">QQ", run_end, 1))  # frame "1" starts nowhere
            got = [(r.offset, r.value) for r in await db.read_key(0, b"dev3")]
            assert got == want
            assert any("index is wrong" in r.getMessage() for r in caplog.records)
            await db._engine.drain()  # the repair queued by the read runs on the shard's worker
            caplog.clear()
            assert [(r.offset, r.value) for r in await db.read_key(0, b"dev3")] == want
            assert not any("index is wrong" in r.getMessage() for r in caplog.records), "not repaired"

    run(main())


def test_lagging_key_index_scans_its_tail_and_catches_up(run, data_dir: Path, monkeypatch) -> None:
    import seglog.index.shard_index as shard_index

    real = shard_index.add_many
    failing = {"on": False}

    def flaky(tables, batches):
        if failing["on"]:
            raise StorageError("injected index failure")
        real(tables, batches)

    monkeypatch.setattr(shard_index, "add_many", flaky)

    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t")
            await db.append(make_records(500))
            await db._engine.drain()  # type: ignore[attr-defined]  # indexed before the failures
            failing["on"] = True
            await db.append(make_records(500, start=500))  # acknowledged; the index lags
            await db._engine.drain()  # type: ignore[attr-defined]  # the indexer wrote (and failed)
            s = db._engine._shards[0]  # type: ignore[attr-defined]
            assert s.index_lagging and s.index.indexed_end == 500
            want = [r.offset for r in await read_all(db, 0) if r.key == b"dev3"]
            assert [r.offset for r in await db.read_key(0, b"dev3")] == want
            failing["on"] = False
            await db.append(make_records(10, start=1000))
            await db._engine.drain()  # type: ignore[attr-defined]
            assert not s.index_lagging and s.index.indexed_end == 1010
            assert [r.offset for r in await db.read_key(0, b"dev3")] == [*want, 1003]

    run(main())
