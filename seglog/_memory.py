"""The process's transparent huge pages (THP): what the kernel does, and turning them off.

Why a log store cares: PyArrow's allocator (mimalloc 3, ``allow_thp`` on by default) reserves
a 1 GiB arena and asks for huge pages on it (``MADV_HUGEPAGE``), which the kernel grants in
its ``madvise`` mode (most distributions' default) as well as in ``always``. Every 2 MiB of
the arena touched for the first time, or again after mimalloc handed it back (its purge, one
second after it fell free), is then faulted in as one huge page the kernel zeroes whole. An
append path that builds and drops Arrow buffers of a few hundred KiB per batch keeps doing
that: profiled at 15-25 % of all CPU (``clear_page_erms`` under ``do_huge_pmd_anonymous_page``)
with 4 producers into 16 shards, and the I/O thread's kernel time per append swinging 3x
between identical runs. ``prctl(PR_SET_THP_DISABLE)`` makes the kernel use 4 KiB pages for
this process's new faults, madvised or not (Linux >= 3.15), as Redis does with its
``disable-thp`` setting. It applies to the whole process and its children, and is never
undone here; ``mimalloc``'s own switch (``MIMALLOC_ALLOW_THP=0``) would be narrower but only
works if set before PyArrow is first imported, which a library cannot promise.
"""

from __future__ import annotations

import ctypes
import enum
import logging
import sys
from pathlib import Path
from typing import Final, Literal

__all__ = ["ThpMode", "ThpPolicy", "apply_thp_policy", "kernel_thp_mode", "thp_disabled"]

log = logging.getLogger(__name__)

ThpPolicy = Literal["disable", "keep"]

_THP_ENABLED: Final = Path("/sys/kernel/mm/transparent_hugepage/enabled")
_PR_SET_THP_DISABLE: Final = 41
_PR_GET_THP_DISABLE: Final = 42


class ThpMode(enum.Enum):
    """The kernel's system-wide THP mode (``/sys/kernel/mm/transparent_hugepage/enabled``)."""

    ALWAYS = "always"
    MADVISE = "madvise"
    NEVER = "never"


def kernel_thp_mode(path: Path = _THP_ENABLED) -> ThpMode | None:
    """The selected mode (the bracketed word, e.g. ``always [madvise] never``), or ``None``
    when the kernel has no THP or the file cannot be read."""
    try:
        text = path.read_text()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    if start < 0 or end < start:
        return None
    try:
        return ThpMode(text[start + 1 : end])
    except ValueError:
        return None


def _prctl(option: int, arg: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    result: int = libc.prctl(option, arg, 0, 0, 0)
    if result < 0:
        raise OSError(ctypes.get_errno(), "prctl failed")
    return result


def thp_disabled() -> bool:
    """Whether THP is off for this process (``PR_GET_THP_DISABLE``; ``False`` off Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return _prctl(_PR_GET_THP_DISABLE, 0) == 1
    except OSError:
        return False


def apply_thp_policy(policy: ThpPolicy, mode: ThpMode | None = None) -> bool:
    """Turn THP off for this process when ``policy`` asks for it.

    Args:
        policy: ``"disable"``: off, when the kernel has THP (mode ``always`` or ``madvise``);
            ``"keep"``: never touch the setting.
        mode: The kernel's mode (default: read it).

    Returns:
        Whether THP is off for this process afterwards. A kernel that refuses the call (not
        Linux, too old, a sandbox) is logged and leaves the process as it was.
    """
    if policy == "keep" or not sys.platform.startswith("linux"):
        return thp_disabled()
    if (mode if mode is not None else kernel_thp_mode()) in (None, ThpMode.NEVER):
        return thp_disabled()  # no huge pages to avoid
    if thp_disabled():
        return True
    try:
        _prctl(_PR_SET_THP_DISABLE, 1)
    except OSError as exc:
        log.warning("could not turn transparent huge pages off for this process (%s)", exc)
        return False
    log.info(
        "transparent huge pages turned off for this process (prctl PR_SET_THP_DISABLE); "
        "open the store with thp='keep' to leave them as they are"
    )
    return True
