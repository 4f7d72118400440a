"""Spark integration: the ``seglog`` PySpark data source, a session helper, the demo pipeline.

Importing this package imports pyspark (the ``spark`` extra).
"""

from __future__ import annotations

from seglog.spark.pipeline import site_minute_stats, write_site_minute_chart
from seglog.spark.session import build_spark_session, default_jars_dir, spark_jars
from seglog.spark.source import SOURCE_NAME, SeglogDataSource, SeglogReader, register

__all__ = [
    "SOURCE_NAME",
    "SeglogDataSource",
    "SeglogReader",
    "build_spark_session",
    "default_jars_dir",
    "register",
    "site_minute_stats",
    "spark_jars",
    "write_site_minute_chart",
]
