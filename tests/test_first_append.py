"""The first append of a process pays no one-time cost that opening could have paid.

pyarrow imports ``numpy.ma`` on its first conversion of a NumPy array (13-40 ms, mostly
``inspect`` signatures); before seglog imported it up front, that landed inside the first
``append_arrow``, ~10 % of a one-second benchmark and a latency spike for every new process.
A fresh interpreter is needed to see it: the test process has imported everything already.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CHILD = """
import asyncio, json, sys
import pyarrow as pa
import seglog

async def main(path):
    async with seglog.open(path, fsync="always") as store:
        db = await store.create_db("first", shards=1)
        table = pa.table({"topic": ["a/b"] * 10, "value": [b"v"] * 10, "key": [b"k"] * 10})
        before = set(sys.modules)
        await db.append_arrow(table)
        await db.append([seglog.Record(topic="a/c", value=b"w", key=b"k")])
        await db.read_arrow(0, 0)
        print(json.dumps(sorted(set(sys.modules) - before)))

asyncio.run(main(sys.argv[1]))
"""


def test_the_first_appends_and_read_import_no_module(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "data")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
