"""``seglog demo-cluster`` (``make demo-cluster``): a short run reports nothing lost and exits 0.

Needs etcd like every cluster test (``make test`` installs it; without it the demo exits 1
saying so, and this test fails loudly).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 240


def _field(output: str, name: str) -> str:
    m = re.search(rf"^{name}\s+(\S+)", output, re.M)
    assert m is not None, f"no {name!r} line in:\n{output}"
    return m.group(1).replace(",", "")


def test_cluster_demo_loses_nothing_acknowledged(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "seglog.cli",
        "demo-cluster",
        "--seconds",
        "3",
        "--kill-after",
        "1",
        "--shards",
        "2",
        "--rate",
        "500",
        "--dir",
        str(tmp_path),
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "OK: nothing acknowledged was lost, nothing was stored twice" in output
    assert "SIGKILL node" in output
    acked = int(_field(output, "acknowledged"))
    read_back = int(_field(output, "read back"))
    duplicates = int(_field(output, "duplicates"))
    assert int(_field(output, "lost")) == 0
    assert acked > 100, output
    # Every acknowledged record was read back, once: a retried request whose first attempt
    # had landed was answered with its first offsets (the idempotent producer). More read
    # back than acknowledged only from sends still unacknowledged when the demo stopped.
    assert read_back >= acked, output
    # Read back through the tier: every shard's sealed segments were uploaded by its leader and
    # the nodes kept no segment bytes of the database (the active segments are empty).
    assert int(_field(output, "tiered")) >= 2, output
    assert "with 0 bytes of segments left on the nodes" in output, output
    assert duplicates == 0, output
    assert _field(output, "failover") != "n/a", output
    # The work directory is removed (no --keep).
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("bad", [["--kill-after", "5", "--seconds", "3"]])
def test_cluster_demo_refuses_bad_options(bad: list[str]) -> None:
    cmd = [sys.executable, "-m", "seglog.cli", "demo-cluster", *bad]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert "--kill-after" in done.stderr


def test_cluster_demo_help() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "seglog.cli", "demo-cluster", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0 and "usage: seglog demo-cluster" in done.stdout
    assert "--kill-after" in done.stdout
