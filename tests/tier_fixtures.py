"""MinIO and Spark fixtures (a pytest plugin, loaded from conftest's ``pytest_plugins``).

* ``minio`` (session): a real MinIO server from ``.cache/bin/minio`` (``make minio``) on
  free loopback ports with generated root credentials; stopped by PID at the end.
* ``bucket`` (function): a fresh, empty bucket on that server.
* ``tier_target`` (function, twice): a tier target in a fresh local directory, then under a
  prefix of a fresh MinIO bucket.
* ``spark`` (session): one local[2] SparkSession for all Spark tests, with S3A pointed
  at the MinIO server and the ``seglog`` data source registered.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

REPO = Path(__file__).resolve().parents[1]
MINIO_BIN = Path(os.environ.get("SEGLOG_MINIO_BIN", REPO / ".cache" / "bin" / "minio"))
MINIO_START_DEADLINE_S = 60.0
MINIO_STOP_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class MinioServer:
    """A running MinIO: where it listens and its root credentials."""

    endpoint: str
    access_key: str
    secret_key: str
    pid: int
    region: str = "us-east-1"

    def client(self) -> Any:
        """Returns a plain boto3 S3 client for test setup and inspection."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 2}),
        )

    def __iter__(self) -> Iterator[str]:
        """Unpacks as ``endpoint, access_key, secret_key``."""
        return iter((self.endpoint, self.access_key, self.secret_key))


def free_port() -> int:
    """Returns a loopback TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _health_ok(endpoint: str) -> bool:
    # /cluster answers 503 until the object layer, bucket metadata and IAM are up;
    # /live answers 200 before that, and a first request then fails "not initialized".
    try:
        with urllib.request.urlopen(f"{endpoint}/minio/health/cluster", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def run_minio(data: Path) -> Iterator[MinioProcess]:
    """Runs a MinIO server storing into ``data`` until the block exits (or ``stop()``)."""
    handle = start_minio(data)
    try:
        yield handle
    finally:
        handle.stop()


def start_minio(
    data: Path, *, port: int | None = None, access_key: str | None = None, secret_key: str | None = None
) -> MinioProcess:
    """Starts MinIO on ``data`` (a free port and fresh credentials unless given); returns when healthy."""
    if not MINIO_BIN.is_file():
        pytest.fail(f"MinIO binary {MINIO_BIN} is missing: run `make minio` (make test does)")
    port = free_port() if port is None else port
    console_port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    access_key = access_key or "seglog-" + secrets.token_hex(4)
    secret_key = secret_key or secrets.token_hex(16)
    env = {
        **os.environ,
        "MINIO_ROOT_USER": access_key,
        "MINIO_ROOT_PASSWORD": secret_key,
        "MINIO_BROWSER": "off",
        "MINIO_UPDATE": "off",
        "MINIO_CI_CD": "1",
    }
    log_path = data.parent / f"{data.name}.log"
    proc = subprocess.Popen(
        [
            str(MINIO_BIN),
            "server",
            str(data),
            "--address",
            f"127.0.0.1:{port}",
            "--console-address",
            f"127.0.0.1:{console_port}",
            "--quiet",
        ],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    # Readiness is event-driven: a thread copies MinIO's output to a log and signals when
    # the process exits; the main thread polls the health endpoint, waiting on that event
    # between tries, until a deadline.
    exited = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        with open(log_path, "wb") as log:
            for line in proc.stdout:
                log.write(line)
                log.flush()
        exited.set()

    threading.Thread(target=pump, name="minio-log", daemon=True).start()
    handle = MinioProcess(MinioServer(endpoint, access_key, secret_key, proc.pid), proc)
    deadline = time.monotonic() + MINIO_START_DEADLINE_S
    try:
        while not _health_ok(endpoint):
            if exited.wait(timeout=0.1) or proc.poll() is not None:
                pytest.fail(f"MinIO exited with {proc.wait()}; log: {log_path.read_text()}")
            if time.monotonic() > deadline:
                pytest.fail(f"MinIO not healthy after {MINIO_START_DEADLINE_S}s; log: {log_path}")
    except BaseException:
        handle.stop()
        raise
    return handle


class MinioProcess:
    """A MinIO server process started by :func:`run_minio`."""

    def __init__(self, server: MinioServer, proc: subprocess.Popen[bytes]) -> None:
        self.server = server
        self._proc = proc

    def stop(self) -> None:
        """Stops the server (SIGTERM, then SIGKILL after a timeout) and reaps it."""
        if self._proc.poll() is not None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(timeout=MINIO_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


@pytest.fixture(scope="session")
def minio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MinioServer]:
    """Starts MinIO for the test session; yields :class:`MinioServer`."""
    with run_minio(tmp_path_factory.mktemp("minio-data")) as handle:
        yield handle.server


@pytest.fixture
def bucket(minio: MinioServer) -> Iterator[str]:
    """Creates a fresh bucket for one test and removes it (with its objects) afterwards."""
    name = "t-" + uuid.uuid4().hex[:20]
    client = minio.client()
    client.create_bucket(Bucket=name)
    yield name
    with contextlib.suppress(Exception):
        paginator = client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=name):
            for obj in page.get("Contents", []):
                client.delete_object(Bucket=name, Key=obj["Key"])
        client.delete_bucket(Bucket=name)


@pytest.fixture(params=["local", "s3"])
def tier_target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    from seglog.tiering import TierTarget, open_target

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


@pytest.fixture(scope="session")
def spark(minio: MinioServer) -> Iterator[SparkSession]:
    """One local[2] SparkSession for the whole session, S3A aimed at ``minio``."""
    from seglog.spark.session import build_spark_session, spark_jars

    if not spark_jars():
        pytest.fail("hadoop-aws jars missing in .cache/spark-jars: run `make spark-jars`")
    session = build_spark_session(
        app_name="seglog-tests",
        s3_endpoint=minio.endpoint,
        access_key=minio.access_key,
        secret_key=minio.secret_key,
    )
    yield session
    session.stop()


# --- data helpers ----------------------------------------------------------------------

SITES = ("north", "south", "east")
METRICS = ("temp", "hum")


def make_segment_table(base: int, rows: int, *, ts0_us: int, step_us: int = 1_000_000) -> Any:
    """Returns a segment table (SEGMENT_SCHEMA columns) of demo sensor records.

    Topics cycle over ``sensors/<site>/dev<d>/<metric>`` plus an occasional ``$SYS`` and
    ``other/...`` topic; values are ASCII floats; every third record has a key/headers.
    """
    import pyarrow as pa

    from seglog.tiering.parquet import HEADERS_TYPE

    topics, values, keys, headers = [], [], [], []
    for i in range(base, base + rows):
        if i % 17 == 0:
            topic = "$SYS/broker/load"
        elif i % 13 == 0:
            topic = f"other/{i % 5}"
        else:
            topic = f"sensors/{SITES[i % 3]}/dev{i % 4}/{METRICS[i % 2]}"
        topics.append(topic)
        values.append(f"{(i % 50) / 2:.1f}".encode())
        keys.append(f"dev{i % 4}".encode() if i % 3 == 0 else None)
        headers.append([("unit", b"C"), ("q", b"1")] if i % 3 == 0 else None)
    return pa.table(
        {
            "offset": pa.array(range(base, base + rows), pa.int64()),
            "ts": pa.array([ts0_us + k * step_us for k in range(rows)], pa.int64()),
            "topic": pa.array(topics, pa.string()),
            "key": pa.array(keys, pa.binary()),
            "value": pa.array(values, pa.binary()),
            "headers": pa.array(headers, HEADERS_TYPE),
            "stream": pa.array([i % 3 for i in range(base, base + rows)], pa.uint32()),
        }
    )


def tier_segment(target: Any, manifest: Any, shard: int, table: Any) -> Any:
    """Runs the full upload protocol for one segment; returns the committed entry."""
    from seglog.tiering import upload_segment

    return upload_segment(target, manifest, shard, table)


def committed_run(manifest: Any, shard: int) -> list[tuple[int, int]]:
    """``(base, end)`` of the shard's committed objects, asserted to run from offset 0 without
    a gap or an overlap."""
    ranges = [(e.base_offset, e.end_offset) for e in manifest.committed(shard)]
    assert ranges and ranges[0][0] == 0, (shard, ranges)
    assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(ranges)), (shard, ranges)
    return ranges
