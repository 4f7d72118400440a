"""SIGKILL a producer mid-stream; every acknowledged record must survive."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import seglog
from tests.crash_child import value_for
from tests.helpers import read_all

ROOT = Path(__file__).resolve().parent.parent


def _run_and_kill(data: Path, mode: str, acks_before_kill: int) -> list[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.crash_child", str(data), mode],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        for line in proc.stdout:  # blocks on the child's acknowledgements: an event, not a timer
            lines.append(line)
            if len(lines) >= acks_before_kill:
                break
        os.kill(proc.pid, signal.SIGKILL)
        lines.extend(proc.stdout.read().splitlines(keepends=True))  # acks already in the pipe
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert len(lines) >= acks_before_kill, "child died before producing enough acknowledgements"
    return lines


def test_acknowledged_records_survive_sigkill(run, data_dir: Path) -> None:
    for round_ in range(3):  # kill, reopen, append more, kill again
        lines = _run_and_kill(data_dir, "records", 3000 + round_ * 500)
        acked = [tuple(map(int, ln.split())) for ln in lines if ln[0].isdigit() and ln.endswith("\n")]

        async def verify(acked: list[tuple[int, ...]] = acked) -> None:
            async with seglog.open(data_dir) as store:
                db = await store.open_db("crash")
                by_shard = {s: await read_all(db, s) for s in range(db.shards)}
                for s, recs in by_shard.items():
                    assert [r.offset for r in recs] == list(range(len(recs))), "offsets must be dense"
                    assert db.end_offset(s) == len(recs)
                for shard, offset, p, seq in acked:
                    rec = by_shard[shard][offset]
                    assert rec.value == value_for(p, seq), (shard, offset)
                    assert rec.topic == f"crash/{p}"
                # Appends continue densely after the crash.
                before = db.end_offset(0)
                m = await db.append([seglog.Record(topic="after", value=b"x")], shard=0)
                assert m[0].offset == before

        run(verify())
