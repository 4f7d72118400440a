"""A small local SparkSession for reading the tier (tests, the demo pipeline)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["SPARK_JARS_ENV", "build_spark_session", "default_jars_dir", "spark_jars"]

SPARK_JARS_ENV = "SEGLOG_SPARK_JARS_DIR"
"""Environment variable naming the directory of extra jars (hadoop-aws + AWS SDK)."""


def default_jars_dir() -> Path:
    """Returns ``$SEGLOG_SPARK_JARS_DIR``, else ``<repo>/.cache/spark-jars`` (``make spark-jars``)."""
    env = os.environ.get(SPARK_JARS_ENV)
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / ".cache" / "spark-jars"


def spark_jars(jars_dir: Path | None = None) -> list[Path]:
    """Returns the jars in ``jars_dir`` (default :func:`default_jars_dir`), sorted."""
    directory = jars_dir if jars_dir is not None else default_jars_dir()
    return sorted(directory.glob("*.jar")) if directory.is_dir() else []


def build_spark_session(
    *,
    app_name: str = "seglog",
    master: str = "local[2]",
    driver_memory: str = "1g",
    s3_endpoint: str | None = None,
    access_key: str | None = None,
    secret_key: str | None = None,
    region: str = "us-east-1",
    jars_dir: Path | None = None,
    extra_conf: Mapping[str, str] | None = None,
    register_source: bool = True,
) -> SparkSession:
    """Builds (or returns the running) local SparkSession set up for seglog.

    Python workers run this interpreter (the venv's), so they can import seglog. With
    ``s3_endpoint`` set, Hadoop's S3A filesystem is configured for it (path-style access,
    SSL only for ``https://``, static credentials) and ``spark.jars`` lists the jars of
    ``make spark-jars``, so ``spark.read.parquet("s3a://bucket/...")`` works.

    Args:
        app_name: Spark application name.
        master: Spark master; ``local[2]`` matches a 2-core machine.
        driver_memory: Driver (= executor, in local mode) heap.
        s3_endpoint: e.g. ``http://127.0.0.1:9000``; None leaves S3A unconfigured.
        access_key: S3 access key for S3A.
        secret_key: S3 secret key for S3A.
        region: Signing region for S3A.
        jars_dir: Directory of extra jars (default :func:`default_jars_dir`).
        extra_conf: More Spark settings, applied last.
        register_source: Register the ``seglog`` data source.

    Raises:
        FileNotFoundError: If ``s3_endpoint`` is set but no jars were found.
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    conf: dict[str, str] = {
        "spark.app.name": app_name,
        "spark.master": master,
        "spark.driver.memory": driver_memory,
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4",
        "spark.default.parallelism": "2",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.python.filterPushdown.enabled": "true",
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
    }
    jars = spark_jars(jars_dir)
    if jars:
        conf["spark.jars"] = ",".join(str(j) for j in jars)
    if s3_endpoint is not None:
        if not jars:
            raise FileNotFoundError(
                f"no hadoop-aws jars in {jars_dir or default_jars_dir()}: run `make spark-jars`"
            )
        s3a = "spark.hadoop.fs.s3a."
        conf |= {
            s3a + "impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
            s3a + "endpoint": s3_endpoint,
            s3a + "endpoint.region": region,
            s3a + "path.style.access": "true",
            s3a + "connection.ssl.enabled": str(s3_endpoint.startswith("https://")).lower(),
            s3a + "attempts.maximum": "3",
            s3a + "retry.limit": "3",
        }
        if access_key is not None and secret_key is not None:
            conf |= {
                s3a + "access.key": access_key,
                s3a + "secret.key": secret_key,
                s3a + "aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
            }
    conf |= dict(extra_conf or {})
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    if register_source:
        from seglog.spark.source import register

        register(spark)
    return spark
