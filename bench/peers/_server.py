"""Start, probe, measure and stop a loopback server process owned by one benchmark run."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import IO

LOOPBACK_HOST = "127.0.0.1"
POLL_INTERVAL_S = 0.1
CONNECT_TIMEOUT_S = 0.5
STOP_TIMEOUT_S = 20.0
LOG_TAIL_LINES = 3
_CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    """Return a TCP port on the loopback interface that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK_HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def port_open(port: int) -> bool:
    """True when something accepts TCP connections on ``127.0.0.1:port``."""
    try:
        with socket.create_connection((LOOPBACK_HOST, port), timeout=CONNECT_TIMEOUT_S):
            return True
    except OSError:
        return False


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads) from ``/proc/<pid>/stat``."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    # After the command name: state is field 3, utime field 14, stime field 15 (1-based).
    utime_ticks, stime_ticks = int(fields[11]), int(fields[12])
    return (utime_ticks + stime_ticks) / _CLOCK_TICKS_PER_S


class ServerProcess:
    """One server child process with its output captured to a log file.

    Args:
        name: Label for error messages.
        argv: Command line.
        log_path: File receiving the server's stdout and stderr.
        cwd: Working directory.
        env: Environment (default: inherited).
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.cwd = cwd
        self.env = env
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int:
        """PID of the running server."""
        if self._proc is None:
            raise RuntimeError(f"{self.name} not started")
        return self._proc.pid

    def start(self) -> None:
        """Spawn the server."""
        self._log = self.log_path.open("ab")
        self._proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.cwd,
            env=self.env,
        )

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """Last non-empty lines of the server log, joined with ' | '."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        tail = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
        return " | ".join(tail)

    def check_alive(self) -> None:
        """Raise RuntimeError with the log tail when the server has exited."""
        if self._proc is None:
            raise RuntimeError(f"{self.name} not started")
        code = self._proc.poll()
        if code is not None:
            raise RuntimeError(f"{self.name} exited with code {code}: {self.log_tail()}")

    async def wait_until(
        self, probe: Callable[[], bool | Awaitable[bool]], what: str, timeout_s: float
    ) -> None:
        """Poll ``probe`` until it returns True, the server dies, or ``timeout_s`` passes.

        Args:
            probe: Readiness check, sync or async; exceptions count as "not yet".
            what: Description for the timeout message.
            timeout_s: Hard deadline.

        Raises:
            TimeoutError: Not ready in time.
            RuntimeError: The server exited.
        """
        deadline = time.monotonic() + timeout_s
        last_error = ""
        while True:
            self.check_alive()
            try:
                result = probe()
                if inspect.isawaitable(result):
                    result = await result
                if result:
                    return
            except Exception as exc:
                last_error = f" (last error: {type(exc).__name__}: {exc})"
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{self.name}: {what} not ready after {timeout_s:.0f} s{last_error}; "
                    f"log: {self.log_tail()}"
                )
            await asyncio.sleep(POLL_INTERVAL_S)

    def cpu_s(self) -> float:
        """CPU seconds the server has used so far."""
        return process_cpu_s(self.pid)

    def kill(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGKILL the server (a crash: no shutdown at all) and reap it; ``start`` runs it again."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=timeout_s)
        if self._log is not None:
            with contextlib.suppress(OSError):
                self._log.close()
            self._log = None

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Terminate the server by its PID, kill it if it has not exited within ``timeout_s``."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout_s)
        if self._log is not None:
            with contextlib.suppress(OSError):
                self._log.close()
            self._log = None
