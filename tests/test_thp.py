"""Transparent huge pages: the kernel's mode is read right, and ``seglog.open(thp=...)`` turns
them off for the process by default (or leaves them), as the kernel itself reports afterwards.

Each store opens in a child process that first turns THP back on for itself: the setting is
process-wide, inherited by children, and never undone by seglog.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import seglog
from seglog._memory import ThpMode, kernel_thp_mode
from seglog.errors import InvalidArgument

_CHILD = """
import asyncio, json, sys
import pyarrow as pa
import seglog
from seglog._memory import thp_disabled

def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return None

def anon_huge_kb():
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return None

async def main():
    # Start as a process whose parent left THP on: the setting is inherited, and this test
    # process may have turned it off already (any store it opened did).
    import ctypes
    assert ctypes.CDLL(None).prctl(41, 0, 0, 0, 0) == 0  # PR_SET_THP_DISABLE, 0
    assert status("THP_enabled") == 1
    async with seglog.open(sys.argv[1], thp=sys.argv[2]) as store:
        # 64 MiB that PyArrow's allocator takes and fills: huge pages if the process may have them
        buf = pa.allocate_buffer(64 << 20)
        memoryview(buf).cast("B")[:] = b"x" * (64 << 20)
        print(json.dumps({
            "store": store.thp_disabled,
            "prctl": thp_disabled(),
            "kernel_enabled": status("THP_enabled"),
            "anon_huge_kb": anon_huge_kb(),
        }))

asyncio.run(main())
"""


def _open_in_child(tmp_path: Path, policy: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path / policy), policy],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize(
    ("text", "mode"),
    [
        ("[always] madvise never\n", ThpMode.ALWAYS),
        ("always [madvise] never\n", ThpMode.MADVISE),
        ("always madvise [never]\n", ThpMode.NEVER),
        ("always madvise never\n", None),
        ("[sometimes] never\n", None),
    ],
)
def test_kernel_mode_is_the_bracketed_word(tmp_path: Path, text: str, mode: ThpMode | None) -> None:
    path = tmp_path / "enabled"
    path.write_text(text)
    assert kernel_thp_mode(path) is mode


def test_no_thp_file_means_no_mode(tmp_path: Path) -> None:
    assert kernel_thp_mode(tmp_path / "missing") is None


def test_disable_turns_them_off_for_the_process(tmp_path: Path) -> None:
    """The kernel says THP is off for the child, and 64 MiB filled through PyArrow took no
    huge page."""
    got = _open_in_child(tmp_path, "disable")
    assert got == {"store": True, "prctl": True, "kernel_enabled": 0, "anon_huge_kb": 0}


def test_keep_leaves_them(tmp_path: Path) -> None:
    kept = _open_in_child(tmp_path, "keep")
    assert kept["store"] is False and kept["prctl"] is False and kept["kernel_enabled"] == 1
    if kernel_thp_mode() in (ThpMode.ALWAYS, ThpMode.MADVISE):
        # Why the default is "disable": left on, the same 64 MiB came as huge pages (in the
        # madvise mode too: PyArrow's allocator asks for them).
        anon = kept["anon_huge_kb"]
        assert isinstance(anon, int) and anon > 0


def test_disable_is_the_default() -> None:
    assert seglog.open("/nonexistent").thp == "disable"


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="thp must be"):
        seglog.open("/nonexistent", thp="auto")  # type: ignore[arg-type]
