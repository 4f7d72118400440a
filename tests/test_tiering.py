"""Tiering wired into the store: tier_now, local retention, read-through, recovery, outages."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import seglog
from seglog.errors import ConfigMismatch, InvalidArgument, TierError
from seglog.tiering import EntryState, ManifestEntry, open_target, recover_manifest, segment_stats
from seglog.tiering.parquet import object_key, segment_table_to_parquet
from seglog.tiering.targets import ObjectInfo
from tests.helpers import make_records, read_all
from tests.tier_fixtures import MinioProcess, MinioServer, free_port, start_minio

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DB = "d"
N = 1500


def tier_kwargs(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> dict[str, Any]:
    if kind == "local":
        return {"tier": (tmp_path / "tier").as_uri()}
    minio: MinioServer = request.getfixturevalue("minio")
    bucket: str = request.getfixturevalue("bucket")
    return {
        "tier": f"s3://{bucket}/pfx",
        "s3_endpoint": minio.endpoint,
        "s3_access_key": minio.access_key,
        "s3_secret_key": minio.secret_key,
    }


def key_of(r: seglog.Record) -> tuple[Any, ...]:
    return (r.offset, r.ts, r.topic, r.key, r.value, r.headers)


async def fill(db: seglog.Database, n: int = N, start: int = 0) -> None:
    recs = make_records(n, start=start)
    for i in range(0, n, 100):
        await db.append(recs[i : i + 100], shard=0)


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_round_trip_with_local_retention(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    kw = tier_kwargs(kind, tmp_path, request)
    data = tmp_path / "data"

    async def main() -> None:
        async with seglog.open(data, retention_interval_ms=None, **kw) as store:
            db = await store.create_db(DB, 1, segment_bytes=4096, local_retention_bytes=0)
            await fill(db)
            before = await read_all(db, 0)
            assert len(before) == N
            assert await db.tier_committed_end(0) == 0
            entries = await db.tier_now()
            assert entries and all(e.state is EntryState.COMMITTED for e in entries)
            assert await db.tier_committed_end(0) == max(e.end_offset for e in entries) + 1
            with pytest.raises(InvalidArgument):
                await db.tier_committed_end(1)
            assert db.local_start_offset(0) > 0  # local segments went
            assert db.start_offset(0) == 0  # ... but the history did not
            stats = db.tier_stats()[0]
            assert stats.cold_bytes > 0 and stats.warm_bytes == 0 and stats.hot_bytes > 0
            assert await db.tier_now() == []  # nothing twice
            await check_reads(db, before)
        async with seglog.open(data, retention_interval_ms=None, **kw) as store:
            db = await store.open_db(DB)
            assert db.start_offset(0) == 0
            await check_reads(db, before)
            assert await db.tier_now() == []

    asyncio.run(main())


async def check_reads(db: seglog.Database, before: list[seglog.Record]) -> None:
    after = await read_all(db, 0)
    assert [key_of(r) for r in after] == [key_of(r) for r in before]
    local_start = db.local_start_offset(0)
    # small reads straddling the tier/local boundary
    got = await db.read(0, local_start - 3, max_records=10)
    assert got and got[0].offset == local_start - 3
    for probe in (0, 7, local_start // 2, local_start - 1, local_start, N - 1):
        assert await db.offset_for_time(0, before[probe].ts) == probe  # type: ignore[arg-type]
    assert await db.offset_for_time(0, 0) == 0
    assert await db.offset_for_time(0, before[-1].ts + 1) == N  # type: ignore[operator]
    for key in (b"dev0", b"dev13", b"dev49"):
        want = [key_of(r) for r in before if r.key == key]
        assert [key_of(r) for r in await db.read_key(0, key)] == want
    with pytest.raises(seglog.OffsetOutOfRange):
        await db.read(0, N + 1)


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_crash_during_upload_converges(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    kw = tier_kwargs(kind, tmp_path, request)
    data = tmp_path / "data"

    async def first() -> tuple[list[seglog.Record], list[Any]]:
        async with seglog.open(data, retention_interval_ms=None, **kw) as store:
            db = await store.create_db(DB, 1, segment_bytes=4096)
            await fill(db)
            segs = [s for s in db._engine.segment_ranges(0) if s.sealed]  # type: ignore[attr-defined]
            assert len(segs) >= 4
            tables = [await db.read_arrow(0, s.start, s.end - s.start) for s in segs[:3]]
            return await read_all(db, 0), tables

    before, tables = asyncio.run(first())
    # Simulate a crashed tierer with the protocol functions.
    target = open_target(
        kw["tier"],
        s3_endpoint=kw.get("s3_endpoint"),
        access_key=kw.get("s3_access_key"),
        secret_key=kw.get("s3_secret_key"),
    )
    local = data / "dbs" / DB / "tier-manifest.json"
    manifest, _ = recover_manifest(target, DB, local_manifest=local)
    from seglog.tiering import upload_segment

    upload_segment(target, manifest, 0, tables[0], local_manifest=local)  # committed, local kept
    for table, put in ((tables[1], True), (tables[2], False)):
        stats = segment_stats(table)
        key = object_key(DB, 0, stats.base_offset, stats.end_offset)
        blob = segment_table_to_parquet(table)
        import hashlib

        info = ObjectInfo(key, len(blob), hashlib.sha256(blob).hexdigest())
        manifest.begin_upload(ManifestEntry.for_upload(0, stats, info))
        manifest.save(target, local_path=local)
        if put:
            target.put(key, blob)  # crash between put and commit
    assert len(manifest.entries(EntryState.UPLOADING)) == 2

    async def second() -> None:
        async with seglog.open(data, retention_interval_ms=None, **kw) as store:
            db = await store.open_db(DB)
            tier = db._tier  # type: ignore[attr-defined]
            assert not tier.manifest.entries(EntryState.UPLOADING)  # recovered at open
            await db.configure(local_retention_bytes=0)
            await db.tier_now()
            committed = tier.manifest.committed(0)
            for a, b in itertools.pairwise(committed):
                assert a.end_offset + 1 == b.base_offset  # no overlap, no gap
            assert committed[0].base_offset == 0
            objects = [k for k in target.list(f"{DB}/shard=") if k.endswith(".parquet")]
            assert sorted(objects) == sorted(e.key for e in committed)
            assert db.local_start_offset(0) > 0
            after = await read_all(db, 0)
            assert [key_of(r) for r in after] == [key_of(r) for r in before]

    asyncio.run(second())
    target.close()


# --- a dedicated MinIO that can be stopped and restarted on the same port ------------------


class RestartableMinio:
    """A MinIO that keeps its port, credentials and data across stop/start."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.server = MinioServer(f"http://127.0.0.1:{free_port()}", "seglog-rst", "s" * 32, 0)
        self._proc: MinioProcess | None = None

    def start(self) -> None:
        port = int(self.server.endpoint.rsplit(":", 1)[1])
        self._proc = start_minio(
            self.data, port=port, access_key=self.server.access_key, secret_key=self.server.secret_key
        )

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.stop()


@pytest.fixture
def restartable_minio(tmp_path: Path) -> Iterator[RestartableMinio]:
    m = RestartableMinio(tmp_path / "minio-rst")
    m.start()
    try:
        yield m
    finally:
        m.stop()


BACKGROUND_TIMEOUT_S = 60.0
"""How long to wait for the store's background tiering loop to show an effect."""


class TieringFailureLog(logging.Handler):
    """Collects the ``seglog.store`` records of failed background tiering runs of one DB."""

    def __init__(self, db: str, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(logging.ERROR)
        self.prefix = f"tiering database {db!r} failed"
        self.records: list[logging.LogRecord] = []
        self.event = asyncio.Event()
        self._loop = loop

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith(self.prefix):
            self.records.append(record)
            self._loop.call_soon_threadsafe(self.event.set)


async def wait_for_event(event: asyncio.Event, what: str) -> None:
    """Waits for ``event``; fails the test if it is not set within BACKGROUND_TIMEOUT_S."""
    try:
        await asyncio.wait_for(event.wait(), BACKGROUND_TIMEOUT_S)
    except TimeoutError:
        pytest.fail(f"timed out after {BACKGROUND_TIMEOUT_S}s waiting until {what}")


@contextlib.contextmanager
def watch_tiering_failures(db: str) -> Iterator[TieringFailureLog]:
    handler = TieringFailureLog(db, asyncio.get_running_loop())
    logger = logging.getLogger("seglog.store")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def test_minio_down_appends_continue_then_tiering_resumes(
    restartable_minio: RestartableMinio, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = restartable_minio
    m.server.client().create_bucket(Bucket="tierb")
    kw = {
        "tier": "s3://tierb/x",
        "s3_endpoint": m.server.endpoint,
        "s3_access_key": m.server.access_key,
        "s3_secret_key": m.server.secret_key,
    }

    async def main() -> None:
        async with seglog.open(
            tmp_path / "data", retention_interval_ms=None, tier_interval_ms=100, **kw
        ) as store:
            db = await store.create_db(DB, 1, segment_bytes=4096, local_retention_bytes=0)
            await fill(db, 600)
            await db.tier_now()
            tiered_before = db.tier_stats()[0].tier_objects
            assert tiered_before > 0

            # Every call of db.tier_now from here on is the store's background loop, except
            # the explicit ones below; a call that commits something sets `committed`.
            committed = asyncio.Event()
            tier_now = db.tier_now

            async def observed_tier_now() -> list[ManifestEntry]:
                entries = await tier_now()
                if entries:
                    committed.set()
                return entries

            monkeypatch.setattr(db, "tier_now", observed_tier_now)
            with watch_tiering_failures(DB) as failures:
                await asyncio.to_thread(m.stop)
                await fill(db, 900, start=600)  # appends do not care
                with pytest.raises(TierError):
                    await db.tier_now()
                # the background loop fails and logs it (the explicit call above does not log)
                await wait_for_event(failures.event, "the background loop logs a failed run")
            exc_info = failures.records[0].exc_info
            assert exc_info is not None and isinstance(exc_info[1], TierError)
            assert not committed.is_set()
            assert db.tier_stats()[0].tier_objects == tiered_before
            assert db.end_offset(0) == 1500
            # the tiered part is unreachable, the local part still reads
            local = await db.read(0, db.local_start_offset(0), 10)
            assert local
            await asyncio.to_thread(m.start)
            # the background loop resumes by itself: no explicit tier_now before this point
            await wait_for_event(committed, "the background loop commits after MinIO is back")
            assert db.tier_stats()[0].tier_objects > tiered_before
            await db.tier_now()
            assert db.tier_stats()[0].tier_objects > tiered_before
            assert db.tier_stats()[0].warm_bytes == 0
            after = await read_all(db, 0)
            assert [r.offset for r in after] == list(range(1500))
            want = make_records(1500)
            assert [(r.topic, r.value, r.key) for r in after] == [(r.topic, r.value, r.key) for r in want]

    asyncio.run(main())


def test_a_database_without_a_tier_has_no_committed_end(tmp_path: Path) -> None:
    async def main() -> None:
        async with seglog.open(tmp_path / "a") as store:
            db = await store.create_db(DB, 1)
            with pytest.raises(InvalidArgument, match="has no tier"):
                await db.tier_committed_end(0)

    asyncio.run(main())


def test_other_engines_refuse_tier_settings(tmp_path: Path) -> None:
    async def main() -> None:
        async with seglog.open(tmp_path / "a", tier=(tmp_path / "t").as_uri()) as store:
            for engine in ("memory", "lmdb"):
                with pytest.raises(ConfigMismatch):
                    await store.create_db(f"x{engine}", engine=engine)
        async with seglog.open(tmp_path / "b") as store:
            with pytest.raises(InvalidArgument):
                await store.create_db("m", engine="memory", local_retention_bytes=0)
            db = await store.create_db("s")
            with pytest.raises(InvalidArgument):
                await db.tier_now()
            assert db.tier_stats()[0].cold_bytes == 0
        with pytest.raises(InvalidArgument):
            seglog.open(tmp_path / "c", tier_interval_ms=10)

    asyncio.run(main())


def test_spark_reads_what_tier_now_uploaded(spark: SparkSession, tmp_path: Path) -> None:
    tier = tmp_path / "tier"

    async def main() -> int:
        async with seglog.open(tmp_path / "data", retention_interval_ms=None, tier=tier.as_uri()) as store:
            db = await store.create_db(DB, 1, segment_bytes=4096)
            await fill(db, 800)
            entries = await db.tier_now()
            return sum(e.rows for e in entries)

    rows = asyncio.run(main())
    assert rows > 0
    plain = spark.read.parquet(str(tier / DB))
    ours = spark.read.format("seglog").option("root", tier.as_uri()).option("db", DB).load()
    assert plain.count() == rows == ours.count()
    got = sorted(r["offset"] for r in ours.select("offset").collect())
    assert got == list(range(rows))
    assert sorted(r["offset"] for r in plain.select("offset").collect()) == got


def test_seal_makes_the_active_segment_tierable(run, data_dir: Path, tmp_path: Path) -> None:
    tier = tmp_path / "tier"

    async def main() -> None:
        async with seglog.open(data_dir, tier=f"file://{tier}") as store:
            db = await store.create_db("s", shards=2)
            await db.append([seglog.Record(topic=f"a/{i}", value=b"v%d" % i) for i in range(100)])
            assert await db.tier_now() == []  # nothing sealed yet
            assert await db.seal() == 2
            assert await db.seal() == 0  # already empty active segments
            entries = await db.tier_now()
            assert sum(e.rows for e in entries) == 100
            m = await db.append([seglog.Record(topic="a/x", value=b"after")], shard=0)
            assert m[0].offset == db.end_offset(0) - 1

    run(main())


def test_retention_and_truncate_reach_the_tier(tmp_path: Path, clock: Any) -> None:
    """Total retention and truncate_before cover tiered history: objects go, reads stop at the floor."""
    tier_dir = tmp_path / "tier"
    data = tmp_path / "data"

    def objects() -> list[str]:
        return sorted(p.name for p in tier_dir.rglob("*.parquet"))

    async def main() -> None:
        async with seglog.open(
            data, retention_interval_ms=None, tier=tier_dir.as_uri(), clock_us=clock
        ) as store:
            db = await store.create_db(DB, 1, segment_bytes=4096, local_retention_bytes=0)
            await fill(db)
            entries = await db.tier_now()
            assert len(entries) >= 4 and db.local_start_offset(0) > 0 and db.start_offset(0) == 0
            # truncate_before in the middle of the cold history: whole objects below go; the
            # straddling one stays, but nothing under the floor is readable any more.
            cut = entries[1].base_offset + 3
            await db.truncate_before(0, cut)
            assert db.start_offset(0) == cut
            assert entries[0].key.rsplit("/", 1)[1] not in objects()
            assert entries[1].key.rsplit("/", 1)[1] in objects()
            with pytest.raises(seglog.OffsetOutOfRange) as info:
                await db.read(0, cut - 1, 1)
            assert info.value.start == cut
            assert [r.offset for r in await db.read(0, cut, 2)] == [cut, cut + 1]
            # Time retention over the whole log: every record is older than 1 ms by now.
            clock.advance_ms(10_000)
            await db.configure(retention_ms=1)
            await db.enforce_retention()
            assert objects() == []  # cold objects expired
            assert db.start_offset(0) == db.local_start_offset(0) > cut
        # The floor survives a reopen (it lives in the manifest).
        async with seglog.open(
            data, retention_interval_ms=None, tier=tier_dir.as_uri(), clock_us=clock
        ) as store:
            db = await store.open_db(DB)
            start = db.start_offset(0)
            assert start > cut
            with pytest.raises(seglog.OffsetOutOfRange):
                await db.read(0, cut, 1)
            # drop_db removes the tier objects and manifest, so a new database of the same
            # name starts empty.
            await fill(db, 300, start=N)
            await db.seal()
            assert await db.tier_now()
            await store.drop_db(DB)
            assert list(tier_dir.rglob("*")) == [] or all(p.is_dir() for p in tier_dir.rglob("*"))
            db = await store.create_db(DB, 1)
            assert db.start_offset(0) == 0 and db.end_offset(0) == 0
            assert await db.read(0, 0, 10) == []

    asyncio.run(main())
