"""Store.last_shutdown: how the previous owner stopped (clean, process crash, machine restart)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import seglog
from seglog.store import Shutdown

T = TypeVar("T")
Run = Callable[[Coroutine[Any, Any, T]], T]
ROOT = Path(__file__).resolve().parent.parent
# Opens the store, says so, then waits to be killed.
CHILD = """
import asyncio, sys, seglog
async def main():
    store = await seglog.open(sys.argv[1])
    print("open", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


def _open_and_kill(data: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(data)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline() == "open\n"  # waits on the child's word, not a timer
    finally:
        proc.kill()
        proc.wait(30)


def test_last_shutdown(tmp_path: Path, run: Run[None]) -> None:
    data = tmp_path / "data"

    async def reopen() -> Shutdown:
        async with seglog.open(data) as store:
            return store.last_shutdown

    assert run(reopen()) is Shutdown.CLEAN  # a new directory
    assert run(reopen()) is Shutdown.CLEAN  # closed by the last owner
    _open_and_kill(data)
    assert run(reopen()) is Shutdown.PROCESS_CRASH
    _open_and_kill(data)
    # The same crash seen after a reboot: the RUNNING file names another boot.
    (data / "RUNNING").write_text("a-boot-before-this-one")
    assert run(reopen()) is Shutdown.MACHINE_RESTART
    assert run(reopen()) is Shutdown.CLEAN
