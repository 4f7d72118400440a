"""Another commit's ``seglog`` package, for benchmarks that compare it with this checkout."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

__all__ = ["REPO", "export_seglog", "head_commit"]

REPO = Path(__file__).resolve().parent.parent


def export_seglog(ref: str, into: Path, *, with_extensions: bool = False) -> str:
    """Extract the ``seglog`` package of ``ref`` under ``into``; return the commit it resolved to.

    Args:
        ref: A git ref of this repository.
        into: The directory to put ``seglog/`` in (``PYTHONPATH`` it to import that side).
        with_extensions: Also copy this tree's compiled extensions (``*.so``, not tracked):
            without them the exported package runs its NumPy fallbacks.
    """
    commit = subprocess.run(
        ["git", "rev-parse", "--short", ref], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.strip()
    archive = subprocess.run(
        ["git", "archive", ref, "seglog"], cwd=REPO, check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    if with_extensions:
        for so in (REPO / "seglog").rglob("*.so"):
            shutil.copy2(so, into / so.relative_to(REPO))
    return commit


def head_commit() -> str:
    """This checkout's HEAD, short."""
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.strip()
