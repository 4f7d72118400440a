"""Runs a benchmark module the way its smoke tests do: ``python -m bench.X ...`` from the repo."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_bench(module: str, *args: str, timeout_s: float = 600) -> str:
    """Run ``python -m <module> <args>`` in the repository; its stdout.

    Raises:
        AssertionError: It exited non-zero (with the end of its stderr).
    """
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert proc.returncode == 0, f"{module} exited {proc.returncode}: {proc.stderr[-3000:]}"
    return proc.stdout
