"""Real fault injection for tests: small ext4 filesystems on loop devices, and strace.

* :func:`ext4_fs` mounts a fresh ext4 image of a few MiB: filling it gives the kernel's own
  ENOSPC, :func:`shutdown_fs` (``EXT4_IOC_SHUTDOWN``) makes every later I/O on it fail with
  EIO, as a dying disk does; unmounting and mounting again replays its journal like a reboot.
* :func:`strace_events` parses ``strace -f -y -ttt`` output into per-syscall events.

Mounting needs root (CI here runs as root; ``make test`` installs e2fsprogs and strace). Where
the kernel refuses the mount, the test is skipped with the reason.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import struct
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

# <linux/ext4.h>: EXT4_IOC_SHUTDOWN = _IOR('X', 125, __u32); flag: do not flush the journal.
_EXT4_IOC_SHUTDOWN = 0x8004587D
_EXT4_GOING_FLAGS_NOLOGFLUSH = 2


def _need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.fail(f"{tool} is not installed; `make test-deps` installs it")
    return path


@dataclass
class Ext4:
    """A mounted ext4 image."""

    image: Path
    mount: Path

    def remount(self) -> None:
        """Unmount and mount again (journal replay: what the disk kept is what a reboot sees)."""
        _umount(self.mount)
        _mount(self.image, self.mount)

    def free_bytes(self) -> int:
        st = os.statvfs(self.mount)
        return st.f_bfree * st.f_frsize

    def fill(self, leave_bytes: int) -> Path:
        """Allocate a filler file so that about ``leave_bytes`` stay free; return it."""
        filler = self.mount / "filler"
        with open(filler, "ab") as f:
            chunk = 1 << 20
            while chunk >= 4096 and self.free_bytes() > leave_bytes:
                step = min(chunk, self.free_bytes() - leave_bytes)
                try:
                    os.posix_fallocate(f.fileno(), os.fstat(f.fileno()).st_size, max(step, 4096))
                except OSError:
                    chunk //= 2  # extent metadata needs a little room too: take smaller bites
            os.fsync(f.fileno())
        return filler

    def unfill(self) -> None:
        """Delete the filler: space is back."""
        (self.mount / "filler").unlink(missing_ok=True)
        os.sync()


def _mount(image: Path, mount: Path) -> None:
    res = subprocess.run(["mount", "-o", "loop", str(image), str(mount)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(
            f"LOUD SKIP: cannot loop-mount an ext4 image here ({res.stderr.strip()}); "
            "fault-injection tests need root and loop devices"
        )


def _umount(mount: Path) -> None:
    res = subprocess.run(["umount", str(mount)], capture_output=True, text=True)
    if res.returncode != 0:
        subprocess.run(["umount", "-l", str(mount)], check=True)


@contextlib.contextmanager
def ext4_fs(tmp_path: Path, size_mib: int = 32) -> Iterator[Ext4]:
    """A fresh ext4 filesystem of ``size_mib`` MiB mounted under ``tmp_path``."""
    _need("mkfs.ext4")
    image = tmp_path / "fs.img"
    mount = tmp_path / "mnt"
    mount.mkdir()
    with open(image, "wb") as f:
        f.truncate(size_mib << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], check=True)
    _mount(image, mount)
    try:
        yield Ext4(image, mount)
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            _umount(mount)


def shutdown_fs(mount: Path) -> None:
    """Make every later I/O on the filesystem fail with EIO (no journal flush)."""
    fd = os.open(mount, os.O_RDONLY)
    try:
        fcntl.ioctl(fd, _EXT4_IOC_SHUTDOWN, struct.pack("I", _EXT4_GOING_FLAGS_NOLOGFLUSH))
    finally:
        os.close(fd)


# --- strace ------------------------------------------------------------------------------


@dataclass
class Syscall:
    """One finished system call from an ``strace -f -y -ttt`` log."""

    pid: int
    name: str
    args: str  # everything between the parentheses, with ``-y`` paths
    result: str
    start_s: float
    end_s: float


_LINE = re.compile(r"^(?:\[pid\s+(\d+)\]\s+|(\d+)\s+)?(\d+\.\d+)\s+(.*)$")
_CALL = re.compile(r"^(\w+)\((.*)\)\s+=\s+(.*)$")
_UNFINISHED = re.compile(r"^(\w+)\((.*)\s<unfinished \.\.\.>$")
_RESUMED = re.compile(r"^<\.\.\.\s+(\w+)\s+resumed>(.*)\)\s+=\s+(.*)$")


def strace_events(log: Path) -> list[Syscall]:
    """Finished syscalls in order of completion."""
    _need("strace")
    pending: dict[tuple[int, str], tuple[str, float]] = {}
    out: list[Syscall] = []
    for raw in log.read_text(errors="replace").splitlines():
        m = _LINE.match(raw)
        if not m:
            continue
        pid = int(m.group(1) or m.group(2) or 0)
        ts = float(m.group(3))
        body = m.group(4)
        if c := _UNFINISHED.match(body):
            pending[(pid, c.group(1))] = (c.group(2), ts)
        elif c := _RESUMED.match(body):
            args, start = pending.pop((pid, c.group(1)), ("", ts))
            out.append(Syscall(pid, c.group(1), args + c.group(2), c.group(3), start, ts))
        elif c := _CALL.match(body):
            out.append(Syscall(pid, c.group(1), c.group(2), c.group(3), ts, ts))
    return out


def strace_command() -> list[str]:
    """The strace prefix every trace test uses (threads followed, fd paths, µs timestamps)."""
    return [_need("strace"), "-f", "-y", "-ttt", "-qq"]


def kill_at_each_call(
    template: Path,
    work: Path,
    syscalls: tuple[str, ...],
    child: list[str],
    *,
    cwd: Path,
    max_calls: int = 200,
) -> Iterator[tuple[str, int, Path, bool]]:
    """Run ``child`` (argv after the Python executable; ``{data}`` stands for its data directory)
    on a fresh copy of ``template`` once per call of each syscall, SIGKILLed at that call by
    strace, until a run completes. Yields ``(syscall, call number, data, completed)``; each
    copy is removed after the caller's check."""
    for syscall in syscalls:
        kill_at = 1
        while True:
            data = work / f"{syscall}-{kill_at}"
            shutil.copytree(template, data)
            cmd = [
                *strace_command(),
                "-o",
                "/dev/null",
                "-e",
                f"trace={syscall}",
                "-e",
                f"inject={syscall}:signal=SIGKILL:when={kill_at}",
                sys.executable,
                *(arg.replace("{data}", str(data)) for arg in child),
            ]
            proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120)
            completed = proc.returncode == 0
            yield syscall, kill_at, data, completed
            shutil.rmtree(data)
            if completed:
                break
            kill_at += 1
            assert kill_at < max_calls, f"the child never completed ({syscall})"
