"""Tier targets against a local directory and a real MinIO server."""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from seglog.errors import InvalidArgument, TierError
from seglog.tiering import (
    LocalTarget,
    ObjectInfo,
    ObjectMismatch,
    ObjectNotFound,
    S3Target,
    S3Tuning,
    TierTarget,
    open_target,
)
from tests.tier_fixtures import MinioServer, run_minio

MiB = 1 << 20


@pytest.fixture(params=["local", "s3"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TierTarget]:
    if request.param == "local":
        t = open_target((tmp_path / "tier").as_uri())
    else:
        minio: MinioServer = request.getfixturevalue("minio")
        bucket: str = request.getfixturevalue("bucket")
        t = open_target(
            f"s3://{bucket}/some/prefix",
            s3_endpoint=minio.endpoint,
            access_key=minio.access_key,
            secret_key=minio.secret_key,
        )
    assert isinstance(t, TierTarget)
    yield t
    t.close()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_put_get_head_roundtrip(target: TierTarget, tmp_path: Path) -> None:
    data = os.urandom(100_000)
    info = target.put("db/shard=0/a.parquet", data)
    assert info == ObjectInfo("db/shard=0/a.parquet", len(data), sha(data))
    assert target.get("db/shard=0/a.parquet") == data
    assert target.head("db/shard=0/a.parquet") == info
    assert target.head("db/shard=0/missing") is None
    target.verify("db/shard=0/a.parquet", info)

    src = tmp_path / "src.bin"
    src.write_bytes(b"from a file")
    info2 = target.put("db/f", src)
    assert info2 == ObjectInfo("db/f", 11, sha(b"from a file"))
    assert target.get("db/f") == b"from a file"


def test_put_is_idempotent_and_replaces(target: TierTarget) -> None:
    a = target.put("k/x", b"one")
    assert target.put("k/x", b"one") == a
    b = target.put("k/x", bytearray(b"two!"))
    assert b.size == 4 and target.get("k/x") == b"two!"
    assert target.list("k/") == ["k/x"]


def test_verify_detects_mismatch_and_missing(target: TierTarget) -> None:
    info = target.put("v/obj", b"payload")
    with pytest.raises(ObjectMismatch):
        target.verify("v/obj", ObjectInfo("v/obj", 7, sha(b"PAYLOAD")))
    with pytest.raises(ObjectMismatch):
        target.verify("v/obj", ObjectInfo("v/obj", 8, info.checksum))
    with pytest.raises(ObjectNotFound):
        target.verify("v/nope", info)


def test_get_missing_raises_object_not_found(target: TierTarget) -> None:
    with pytest.raises(ObjectNotFound) as err:
        target.get("nope/nothing")
    assert isinstance(err.value, TierError)
    assert err.value.__cause__ is not None


def test_list_is_a_string_prefix_and_sorted(target: TierTarget) -> None:
    keys = [
        "db/shard=1/b.parquet", "db/shard=1/a.parquet", "db/shard=10/a.parquet",
        "db/_manifest.json", "other/x", "db2/y",
    ]
    for k in keys:
        target.put(k, k.encode())
    assert target.list("db/shard=1/") == ["db/shard=1/a.parquet", "db/shard=1/b.parquet"]
    assert target.list("db/shard=1") == [
        "db/shard=1/a.parquet", "db/shard=1/b.parquet", "db/shard=10/a.parquet"
    ]
    assert target.list("db") == sorted(k for k in keys if k.startswith("db"))
    assert target.list() == sorted(keys)
    assert target.list("zzz/") == []


def test_delete_is_idempotent(target: TierTarget) -> None:
    target.put("d/x", b"1")
    target.delete("d/x")
    target.delete("d/x")
    assert target.head("d/x") is None
    assert target.list("d/") == []


@pytest.mark.parametrize("key", ["", "/abs", "a//b", "a/../b", "./a", "a/.tmp-x", "a\\b", "a\x00"])
def test_invalid_keys(target: TierTarget, key: str) -> None:
    with pytest.raises(InvalidArgument):
        target.put(key, b"x")


def test_concurrent_puts_from_threads(target: TierTarget) -> None:
    payloads = {f"c/obj-{i:03d}": os.urandom(1000 + i) for i in range(24)}
    with ThreadPoolExecutor(max_workers=6) as pool:
        infos = list(pool.map(lambda kv: target.put(*kv), payloads.items()))
    assert [i.key for i in infos] == list(payloads)
    assert target.list("c/") == sorted(payloads)
    for key, data in payloads.items():
        assert target.get(key) == data


# --- local only ------------------------------------------------------------------------


def test_local_url_and_layout(tmp_path: Path) -> None:
    t = open_target(str(tmp_path / "tier"))  # a plain absolute path works too
    assert isinstance(t, LocalTarget)
    t.put("db/shard=0/x.parquet", b"x")
    assert (tmp_path / "tier" / "db" / "shard=0" / "x.parquet").read_bytes() == b"x"
    assert t.url("db/shard=0/x.parquet") == (tmp_path / "tier/db/shard=0/x.parquet").as_uri()
    assert t.url("db") == (tmp_path / "tier/db").as_uri()
    assert t.url() == (tmp_path / "tier").as_uri()


def test_local_failed_put_leaves_old_object_and_no_temp(tmp_path: Path) -> None:
    t = LocalTarget(tmp_path / "tier")
    t.put("a/obj", b"old")
    with pytest.raises(TierError) as err:
        t.put("a/obj", tmp_path / "does-not-exist")
    assert isinstance(err.value.__cause__, FileNotFoundError)
    assert t.get("a/obj") == b"old"
    assert sorted(p.name for p in (tmp_path / "tier" / "a").iterdir()) == ["obj"]


def test_local_ignores_stray_temp_files(tmp_path: Path) -> None:
    t = LocalTarget(tmp_path / "tier")
    t.put("a/obj", b"x")
    (tmp_path / "tier" / "a" / ".tmp-obj.123").write_bytes(b"partial")
    assert t.list() == ["a/obj"]


def test_local_verify_recomputes_from_disk(tmp_path: Path) -> None:
    t = LocalTarget(tmp_path / "tier")
    info = t.put("a/obj", b"good data")
    (tmp_path / "tier" / "a" / "obj").write_bytes(b"bad! data")  # same size, bit rot
    with pytest.raises(ObjectMismatch):
        t.verify("a/obj", info)


@pytest.mark.parametrize("uri", ["relative/dir", "file://host/dir", "http://x/y", "s3://"])
def test_open_target_rejects(uri: str) -> None:
    with pytest.raises(InvalidArgument):
        open_target(uri)


def test_open_target_needs_both_keys() -> None:
    with pytest.raises(InvalidArgument):
        open_target("s3://b/p", access_key="x")


# --- S3 only ---------------------------------------------------------------------------


def s3_target(minio: MinioServer, bucket: str, prefix: str = "", **tuning: float) -> S3Target:
    t = open_target(
        f"s3://{bucket}/{prefix}",
        s3_endpoint=minio.endpoint,
        access_key=minio.access_key,
        secret_key=minio.secret_key,
        tuning=S3Tuning(**tuning),  # type: ignore[arg-type]
    )
    assert isinstance(t, S3Target)
    return t


def test_s3_layout_metadata_and_url(minio: MinioServer, bucket: str) -> None:
    t = s3_target(minio, bucket, "pre/fix")
    info = t.put("db/shard=0/x.parquet", b"hello")
    raw = minio.client().head_object(Bucket=bucket, Key="pre/fix/db/shard=0/x.parquet")
    assert raw["Metadata"]["sha256"] == info.checksum == sha(b"hello")
    assert t.url("db/shard=0/x.parquet") == f"s3a://{bucket}/pre/fix/db/shard=0/x.parquet"
    assert t.url("db") == f"s3a://{bucket}/pre/fix/db"
    assert t.uri == f"s3://{bucket}/pre/fix"


def test_s3_multipart_upload(minio: MinioServer, bucket: str, tmp_path: Path) -> None:
    t = s3_target(
        minio, bucket, multipart_threshold_bytes=5 * MiB, multipart_chunk_bytes=5 * MiB
    )
    data = os.urandom(11 * MiB + 123)  # > threshold: 3 parts
    info = t.put("big/obj", data)
    etag = minio.client().head_object(Bucket=bucket, Key="big/obj")["ETag"].strip('"')
    assert etag.endswith("-3"), etag  # a multipart ETag names its part count
    assert t.head("big/obj") == info
    t.verify("big/obj", info, deep=True)
    assert t.get("big/obj") == data

    src = tmp_path / "big.bin"
    src.write_bytes(data[: 6 * MiB])
    info2 = t.put("big/from-file", src)
    etag2 = minio.client().head_object(Bucket=bucket, Key="big/from-file")["ETag"].strip('"')
    assert etag2.endswith("-2"), etag2
    t.verify("big/from-file", info2, deep=True)


def test_s3_foreign_object_has_no_checksum(minio: MinioServer, bucket: str) -> None:
    minio.client().put_object(Bucket=bucket, Key="foreign", Body=b"abc")
    t = s3_target(minio, bucket)
    assert t.head("foreign") == ObjectInfo("foreign", 3, "")
    with pytest.raises(ObjectMismatch):
        t.verify("foreign", ObjectInfo("foreign", 3, sha(b"abc")))


def test_s3_stopped_server_retries_then_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from botocore.exceptions import EndpointConnectionError

    (tmp_path / "data").mkdir()
    with run_minio(tmp_path / "data") as handle:
        handle.server.client().create_bucket(Bucket="bucket")
        t = s3_target(
            handle.server, "bucket", max_attempts=3, backoff_base_s=0.01, backoff_max_s=0.05
        )
        info = t.put("x/y", b"data")
        handle.stop()
        caplog.set_level(logging.WARNING, logger="seglog.tiering")
        start = time.monotonic()
        with pytest.raises(TierError, match="after 3 attempts") as err:
            t.put("x/y", b"data")
    assert isinstance(err.value.__cause__, EndpointConnectionError)
    retries = [r for r in caplog.records if "transient error" in r.getMessage()]
    assert len(retries) == 2
    with pytest.raises(TierError):
        t.get("x/y")
    with pytest.raises(TierError):
        t.verify("x/y", info)
    with pytest.raises(TierError):
        t.list()
    assert time.monotonic() - start < 30


def test_s3_permanent_error_is_not_retried(
    minio: MinioServer, caplog: pytest.LogCaptureFixture
) -> None:
    t = s3_target(minio, "no-such-bucket-here", max_attempts=5)
    caplog.set_level(logging.WARNING, logger="seglog.tiering")
    with pytest.raises(TierError) as err:
        t.put("a/b", b"x")
    assert "NoSuchBucket" in str(err.value)
    assert not [r for r in caplog.records if "transient error" in r.getMessage()]


def test_s3_bad_credentials(minio: MinioServer, bucket: str) -> None:
    t = open_target(
        f"s3://{bucket}", s3_endpoint=minio.endpoint, access_key="nobody", secret_key="wrongwrong"
    )
    with pytest.raises(TierError):
        t.list()
