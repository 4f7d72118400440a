"""API conveniences: one-record append, public shard_for, read_key(key), same-process open, Spark options."""

from __future__ import annotations

from pathlib import Path

import pytest

import seglog
from seglog import errors
from seglog._routing import shard_for as private_shard_for
from seglog.spark.source import OPTIONS, _ReadOptions


def test_append_takes_one_record(run, data_dir: Path) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", shards=2)
            metas = await db.append(seglog.Record(topic="a/b", value=b"one", key=b"k"))
            assert len(metas) == 1 and metas[0].shard == db.shard_for(b"k")
            assert [r.value for r in await db.read(metas[0].shard, 0)] == [b"one"]
            with pytest.raises(errors.InvalidArgument, match="Record or an iterable"):
                await db.append(42)  # type: ignore[arg-type]

    run(main())


def test_shard_for_is_public_and_read_key_finds_the_shard(run, data_dir: Path) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", shards=8)
            recs = [
                seglog.Record(topic=f"s/{i % 5}", value=b"%d" % i, key=b"dev%d" % (i % 9) if i % 2 else None)
                for i in range(200)
            ]
            metas = await db.append(recs)
            for rec, meta in zip(recs, metas, strict=True):
                expect = db.shard_for(rec.key) if rec.key is not None else db.shard_for(rec.topic)
                assert meta.shard == expect
            assert db.shard_for(b"dev3") == private_shard_for(b"dev3", 8)
            assert db.shard_for("s/1") == private_shard_for(b"s/1", 8)
            with pytest.raises(errors.InvalidArgument):
                db.shard_for(3)  # type: ignore[arg-type]
            want = [r.value for r in recs if r.key == b"dev3"]
            assert [r.value for r in await db.read_key(b"dev3")] == want
            assert (await db.read_key_arrow(b"dev3")).column("value").to_pylist() == want
            s = db.shard_for(b"dev3")
            assert [r.value for r in await db.read_key(s, b"dev3")] == want  # the old form still works
            assert [r.value for r in await db.read_key(b"dev3", shard=s)] == want
            # A key forced onto another shard: read_key(key, shard=...) finds it.
            other = (s + 1) % 8
            await db.append(seglog.Record(topic="x", value=b"forced", key=b"dev3"), shard=other)
            assert [r.value for r in await db.read_key(b"dev3", shard=other)] == [b"forced"]
            assert [r.value for r in await db.read_key(other, b"dev3")] == [b"forced"]
            with pytest.raises(errors.InvalidArgument):
                await db.read_key("dev3")  # type: ignore[call-overload]

    run(main())


def test_second_open_in_the_same_process_says_so(run, data_dir: Path) -> None:
    async def main() -> None:
        async with seglog.open(data_dir):
            with pytest.raises(errors.StoreLocked, match="already open in this process"):
                await seglog.open(data_dir)
        async with seglog.open(data_dir):  # released: opens again
            pass

    run(main())


def test_spark_source_rejects_unknown_options_with_the_valid_list() -> None:
    with pytest.raises(errors.InvalidArgument) as ei:
        _ReadOptions.parse({"root": "s3://b/p", "db": "d", "s3_endpoint": "http://127.0.0.1:9000"})
    msg = str(ei.value)
    assert "'s3_endpoint'" in msg and all(o in msg for o in OPTIONS)
    ok = _ReadOptions.parse({"root": "s3://b/p", "db": "d", "endpoint": "http://127.0.0.1:9000"})
    assert ok.endpoint == "http://127.0.0.1:9000"
    assert _ReadOptions.parse({"path": "file:///x", "db": "d"}).root == "file:///x"
