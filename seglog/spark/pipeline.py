"""The example pipeline: per-site, per-minute statistics of sensor readings in the tier.

Topics look like ``sensors/<site>/<device>/<metric>``; values are ASCII decimal floats
(``b"21.5"``) by default -- pass ``value_expr`` for another encoding.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import Column, SparkSession

__all__ = [
    "SENSOR_FILTER",
    "ascii_float",
    "site_minute_stats",
    "write_site_minute_chart",
]

SENSOR_FILTER = "sensors/+/+/+"
"""MQTT filter of the demo's sensor topics."""


def ascii_float(value: Column) -> Column:
    """Parses a binary ``value`` holding an ASCII decimal float; malformed -> NULL."""
    return value.cast("string").try_cast("double")


def site_minute_stats(
    spark: SparkSession,
    root: str,
    db: str,
    *,
    mqtt_filter: str = SENSOR_FILTER,
    value_expr: Callable[[Column], Column] = ascii_float,
    options: Mapping[str, str] | None = None,
) -> pa.Table:
    """Computes, per site (2nd topic level) and minute, count, mean and max of the values.

    Reads through the ``seglog`` data source (which must be registered).

    Args:
        spark: The session.
        root: Tier root URI (``file:///...`` or ``s3://bucket/prefix``).
        db: Database name.
        mqtt_filter: Which topics to include.
        value_expr: Maps the binary ``value`` column to a double column; values it maps
            to NULL count as messages but not in ``avg_value``/``max_value``.
        options: More source options (``endpoint``, ``access_key``, ``secret_key``...).

    Returns:
        Columns ``site string, minute timestamp[us, UTC], messages int64,
        avg_value double, max_value double``, sorted by site then minute.
    """
    from pyspark.sql import functions as F

    reader = (
        spark.read.format("seglog").option("root", root).option("db", db).option("mqtt_filter", mqtt_filter)
    )
    for key, value in (options or {}).items():
        reader = reader.option(key, value)
    df = reader.load()
    parsed = df.select(
        F.split(F.col("topic"), "/").getItem(1).alias("site"),
        F.date_trunc("minute", F.col("ts")).alias("minute"),
        value_expr(F.col("value")).alias("v"),
    )
    result = (
        parsed.groupBy("site", "minute")
        .agg(
            F.count(F.lit(1)).alias("messages"),
            F.avg("v").alias("avg_value"),
            F.max("v").alias("max_value"),
        )
        .orderBy("site", "minute")
    )
    table: pa.Table = result.toArrow()
    return table


def write_site_minute_chart(stats: pa.Table, path: Path, *, title: str | None = None) -> Path:
    """Draws :func:`site_minute_stats` output as a PNG: mean value and messages per minute.

    Args:
        stats: The table returned by :func:`site_minute_stats`.
        path: Where to write the PNG (parent directories must exist).
        title: Figure title.

    Returns:
        ``path``.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 6), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax_value, ax_count = fig.subplots(2, 1, sharex=True)
    rows = stats.to_pylist()
    sites = sorted({r["site"] for r in rows if r["site"] is not None})
    for site in sites:
        points = [r for r in rows if r["site"] == site]
        minutes = [r["minute"] for r in points]
        ax_value.plot(minutes, [r["avg_value"] for r in points], marker="o", label=site)
        ax_count.plot(minutes, [r["messages"] for r in points], marker=".", label=site)
    ax_value.set_ylabel("mean value")
    ax_count.set_ylabel("messages / minute")
    ax_count.set_xlabel("minute (UTC)")
    if sites:
        ax_value.legend(title="site", fontsize="small", loc="best")
    locator = AutoDateLocator()  # type: ignore[no-untyped-call]
    ax_count.xaxis.set_major_locator(locator)
    ax_count.xaxis.set_major_formatter(ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]
    ax_value.grid(True, alpha=0.3)
    ax_count.grid(True, alpha=0.3)
    fig.suptitle(title or "sensor readings per site and minute")
    fig.savefig(path, format="png")
    return path
