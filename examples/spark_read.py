"""Query a tier with Spark (after examples/tiering.py): python examples/spark_read.py TIER_URI [DB]."""

import sys

from pyspark.sql import functions as F

from seglog.spark import build_spark_session

tier, db = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "telemetry"
spark = build_spark_session(app_name="seglog-example")  # local mode, Python workers from this venv
try:
    df = (
        spark.read.format("seglog")  # registered by build_spark_session (or seglog.spark.register)
        .option("root", tier)  # file:///abs/dir or s3://bucket/prefix
        .option("db", db)
        .option("mqtt_filter", "sensors/+/temp")  # optional, MQTT wildcards
        # S3/MinIO: .option("endpoint", "http://127.0.0.1:9000") plus "access_key", "secret_key", "region"
        .load()
    )
    print(df.columns)  # offset, ts, topic, key, value, headers, stream, shard
    rows = (
        df.where(F.col("offset") < 100).groupBy("shard", "topic").count().orderBy("shard", "topic").collect()
    )
    for r in rows:
        print(f"shard {r['shard']} {r['topic']}: {r['count']} records below offset 100")
finally:
    spark.stop()
