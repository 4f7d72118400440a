"""Tier targets against a local directory and a real MinIO server."""

from __future__ import annotations

import base64
import hashlib
import io
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from seglog.errors import InvalidArgument, TierError
from seglog.tiering import (
    LocalTarget,
    ObjectInfo,
    ObjectMismatch,
    ObjectNotFound,
    PreconditionFailed,
    S3Target,
    S3Tuning,
    TierTarget,
    open_target,
)
from tests.tier_fixtures import MinioServer, run_minio

MiB = 1 << 20


@pytest.fixture
def target(tier_target: TierTarget) -> TierTarget:
    return tier_target


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


def test_get_range_returns_exactly_the_span(target: TierTarget) -> None:
    data = bytes(range(256)) * 40
    target.put("obj", data)
    for start, end in [(0, 1), (0, len(data)), (1000, 2049), (len(data) - 7, len(data))]:
        assert target.get_range("obj", start, end) == data[start:end]
    with pytest.raises(ObjectMismatch, match="shorter"):
        target.get_range("obj", len(data) - 4, len(data) + 4)  # the object ends first
    with pytest.raises(ObjectMismatch):
        target.get_range("obj", len(data), len(data) + 1)  # starts past the end
    with pytest.raises(ObjectNotFound):
        target.get_range("missing", 0, 10)
    for bad in [(-1, 3), (5, 5), (6, 5), (0.0, 3), (True, 3)]:
        with pytest.raises(InvalidArgument, match="byte range"):
            target.get_range("obj", *bad)  # type: ignore[arg-type]


def test_list_is_a_string_prefix_and_sorted(target: TierTarget) -> None:
    keys = [
        "db/shard=1/b.parquet",
        "db/shard=1/a.parquet",
        "db/shard=10/a.parquet",
        "db/_manifest.json",
        "other/x",
        "db2/y",
    ]
    for k in keys:
        target.put(k, k.encode())
    assert target.list("db/shard=1/") == ["db/shard=1/a.parquet", "db/shard=1/b.parquet"]
    assert target.list("db/shard=1") == [
        "db/shard=1/a.parquet",
        "db/shard=1/b.parquet",
        "db/shard=10/a.parquet",
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


def test_conditional_puts_create_once_and_compare_versions(target: TierTarget) -> None:
    first = target.put_if("m/doc", b"one", None)
    with pytest.raises(PreconditionFailed):
        target.put_if("m/doc", b"again", None)  # it exists now
    data, version = target.get_versioned("m/doc")
    assert (data, version) == (b"one", first)
    second = target.put_if("m/doc", b"two", first)
    assert second != first and target.get_versioned("m/doc") == (b"two", second)
    with pytest.raises(PreconditionFailed):
        target.put_if("m/doc", b"stale", first)  # a writer that read "one"
    assert target.get("m/doc") == b"two"
    with pytest.raises(ObjectNotFound):
        target.get_versioned("m/missing")
    with pytest.raises(PreconditionFailed):
        target.put_if("m/missing", b"x", second)  # no such object at that version
    assert target.head("m/missing") is None


def test_conditional_puts_from_threads_lose_no_update(target: TierTarget) -> None:
    """Each thread adds to a counter by read, add, conditional put, again on a conflict: the
    sum is exact only if every check and write are one atomic step."""
    target.put_if("m/counter", b"0", None)
    conflicts = []

    def add(n: int) -> None:
        for _ in range(n):
            while True:
                data, version = target.get_versioned("m/counter")
                try:
                    target.put_if("m/counter", str(int(data) + 1).encode(), version)
                    break
                except PreconditionFailed:
                    conflicts.append(1)

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(add, [15] * 4))
    assert target.get("m/counter") == b"60"
    assert conflicts  # the threads did race (else this proves nothing)


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
    t.verify("a/obj", info)
    (tmp_path / "tier" / "a" / "obj").write_bytes(b"bad! data")  # same size, bit rot
    assert t.head("a/obj") == ObjectInfo("a/obj", 9, sha(b"bad! data"))  # re-read, not cached
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
    t = s3_target(minio, bucket, multipart_threshold_bytes=5 * MiB, multipart_chunk_bytes=5 * MiB)
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
    # no server-side SHA256 to compare with: verify falls back to reading the bytes
    gets = count_get_object(t)
    t.verify("foreign", ObjectInfo("foreign", 3, sha(b"abc")))
    assert gets == [1]
    with pytest.raises(ObjectMismatch):
        t.verify("foreign", ObjectInfo("foreign", 3, sha(b"abd")))
    with pytest.raises(ObjectMismatch):  # nothing to compare with
        t.verify("foreign", ObjectInfo("foreign", 3, ""))


def count_get_object(t: S3Target) -> list[int]:
    """Counts the GetObject calls ``t`` makes from now on (a botocore event hook, not a mock)."""
    calls = [0]

    def on_call(**_: object) -> None:
        calls[0] += 1

    t._client.meta.events.register("before-call.s3.GetObject", on_call)
    return calls


def b64_sha256(data: bytes) -> str:
    return base64.b64encode(hashlib.sha256(data).digest()).decode()


def composite_sha256(data: bytes, part: int) -> str:
    """S3's checksum of a multipart upload: sha256 of the parts' sha256 digests, ``-<parts>``."""
    digests = b"".join(hashlib.sha256(data[i : i + part]).digest() for i in range(0, len(data), part))
    return f"{base64.b64encode(hashlib.sha256(digests).digest()).decode()}-{-(-len(data) // part)}"


def server_checksum(minio: MinioServer, bucket: str, key: str) -> str:
    resp = minio.client().head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    return str(resp.get("ChecksumSHA256", ""))


@pytest.mark.parametrize(
    ("size", "parts"), [(100_000, 1), (5 * MiB, 1), (11 * MiB + 123, 3)], ids=["small", "one-part", "3-parts"]
)
def test_s3_put_stores_server_validated_sha256_and_verify_uses_it(
    minio: MinioServer, bucket: str, size: int, parts: int
) -> None:
    # threshold 5 MiB: 100 kB goes as one PutObject, 5 MiB as a one-part multipart upload
    t = s3_target(minio, bucket, "p", multipart_threshold_bytes=5 * MiB, multipart_chunk_bytes=5 * MiB)
    data = os.urandom(size)
    info = t.put("obj", data)
    assert info == ObjectInfo("obj", size, sha(data))
    stored = server_checksum(minio, bucket, "p/obj")
    if size < 5 * MiB:
        assert stored == b64_sha256(data)  # full-object SHA256, validated by the server
    else:
        assert stored == composite_sha256(data, 5 * MiB)
        assert stored.endswith(f"-{parts}")
    gets = count_get_object(t)
    t.verify("obj", info)  # answered from the server's checksum: no download
    assert gets == [0]
    t.verify("obj", info, deep=True)  # deep always downloads
    assert gets == [1]
    with pytest.raises(ObjectMismatch):
        t.verify("obj", ObjectInfo("obj", size, sha(data + b"x")))

    # a fresh target (e.g. recovery after a restart) knows nothing about the upload: a
    # composite checksum cannot be checked against a whole-object sha256, so it reads the bytes
    fresh = s3_target(minio, bucket, "p")
    fresh_gets = count_get_object(fresh)
    fresh.verify("obj", info)
    assert fresh_gets == [0 if size < 5 * MiB else 1]
    fresh.close()


@pytest.mark.parametrize("size", [64 * 1024, 6 * MiB], ids=["put-single", "put-multipart"])
@pytest.mark.parametrize("overwrite", ["plain", "sha256", "multipart-sha256"])
def test_s3_verify_detects_stored_bytes_differing_from_sent(
    minio: MinioServer, bucket: str, size: int, overwrite: str
) -> None:
    """The object's bytes are checked, not the sha256 metadata the writer stored itself."""
    from boto3.s3.transfer import TransferConfig

    t = s3_target(minio, bucket, multipart_threshold_bytes=5 * MiB, multipart_chunk_bytes=5 * MiB)
    data = os.urandom(size)
    info = t.put("db/shard=0/seg.parquet", data)
    t.verify("db/shard=0/seg.parquet", info)

    # corrupt it behind seglog's back: same size, one flipped byte, the original metadata;
    # stored without a SHA256 checksum (plain), with a whole-object one, or with a composite
    bad = bytearray(data)
    bad[size // 2] ^= 0xFF
    raw = minio.client()
    meta = {"sha256": info.checksum}
    if overwrite == "plain":
        raw.put_object(Bucket=bucket, Key="db/shard=0/seg.parquet", Body=bytes(bad), Metadata=meta)
    elif overwrite == "sha256":
        raw.put_object(
            Bucket=bucket,
            Key="db/shard=0/seg.parquet",
            Body=bytes(bad),
            Metadata=meta,
            ChecksumAlgorithm="SHA256",
        )
    else:
        raw.upload_fileobj(
            io.BytesIO(bad),
            bucket,
            "db/shard=0/seg.parquet",
            ExtraArgs={"Metadata": meta, "ChecksumAlgorithm": "SHA256"},
            Config=TransferConfig(multipart_threshold=1, multipart_chunksize=5 * MiB),
        )
    head = raw.head_object(Bucket=bucket, Key="db/shard=0/seg.parquet", ChecksumMode="ENABLED")
    # what the old size + metadata check looked at is unchanged
    assert head["ContentLength"] == size and head["Metadata"]["sha256"] == info.checksum
    assert ("ChecksumSHA256" in head) == (overwrite != "plain")
    assert t.head("db/shard=0/seg.parquet") == info

    with pytest.raises(ObjectMismatch):
        t.verify("db/shard=0/seg.parquet", info)
    with pytest.raises(ObjectMismatch):  # a fresh target (no memory of the put) too
        s3_target(minio, bucket).verify("db/shard=0/seg.parquet", info)


def test_s3_stopped_server_retries_then_raises(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from botocore.exceptions import EndpointConnectionError

    (tmp_path / "data").mkdir()
    with run_minio(tmp_path / "data") as handle:
        handle.server.client().create_bucket(Bucket="bucket")
        t = s3_target(handle.server, "bucket", max_attempts=3, backoff_base_s=0.01, backoff_max_s=0.05)
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


def test_s3_permanent_error_is_not_retried(minio: MinioServer, caplog: pytest.LogCaptureFixture) -> None:
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
