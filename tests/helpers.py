"""Small helpers shared by tests."""

from __future__ import annotations

from pathlib import Path

import seglog

# A realistic timestamp (2023-11-14T22:13:20Z in µs): databases accept 2000..2200 by default.
T0 = 1_700_000_000_000_000


def make_records(n: int, *, start: int = 0, ts0: int = T0, keyed: bool = True) -> list[seglog.Record]:
    return [
        seglog.Record(
            topic=f"sensors/site{i % 7}/dev{i % 50}/temp",
            value=f"value-{i}".encode() * (1 + i % 5),
            ts=ts0 + i * 10,
            key=f"dev{i % 50}".encode() if keyed else None,
        )
        for i in range(start, start + n)
    ]


async def read_all(db: seglog.Database, shard: int) -> list[seglog.Record]:
    out: list[seglog.Record] = []
    offset = db.start_offset(shard)
    while True:
        batch = await db.read(shard, offset, max_records=5000)
        if not batch:
            return out
        out.extend(batch)
        offset = batch[-1].offset + 1  # type: ignore[operator]


def segment_files(data: Path, db: str, shard: int) -> list[Path]:
    return sorted((data / "dbs" / db / f"shard-{shard:04d}").glob("*.log"))
