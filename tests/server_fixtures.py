"""Real ``seglog serve`` processes for network tests: start, stop (SIGTERM), kill (SIGKILL), restart."""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final, Protocol

import pytest

STARTUP_TIMEOUT_S: Final = 30.0
EXIT_TIMEOUT_S: Final = 30.0
_SERVING = re.compile(r"seglog: serving .* on (https?://\S+)")


class ServerProcess:
    """One ``seglog serve DATA`` child; ``url`` is known once it printed its serving line."""

    def __init__(self, data: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.data = data
        self.args = list(args)
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.listen = "127.0.0.1:0"
        self.output: list[str] = []
        self._drain: threading.Thread | None = None

    def start(self) -> ServerProcess:
        """Start the child and wait (on its stdout, with a deadline) until it serves."""
        cmd = [
            sys.executable,
            "-m",
            "seglog.cli",
            "serve",
            str(self.data),
            "--listen",
            self.listen,
            *self.args,
        ]
        env = dict(os.environ if self.env is None else self.env)
        # Unbuffered: readline must not pull lines past the one select() saw into a buffer
        # that select() cannot see (a line printed before the serving line hung the wait).
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, bufsize=0
        )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    self.kill()
                    raise AssertionError(f"server did not start in {STARTUP_TIMEOUT_S} s: {self.output}")
                line = self.proc.stdout.readline().decode(errors="replace")
                if not line:
                    self.proc.wait(EXIT_TIMEOUT_S)
                    raise AssertionError(f"server exited with {self.proc.returncode}: {''.join(self.output)}")
                self.output.append(line)
                m = _SERVING.search(line)
                if m:
                    self.url = m.group(1)
                    # A restart binds the same port: clients keep their URL.
                    self.listen = "127.0.0.1:" + self.url.rsplit(":", 1)[1]
                    # Keep draining: a chatty child must never block on a full pipe.
                    self._drain = threading.Thread(target=self._read_rest, args=(self.proc,), daemon=True)
                    self._drain.start()
                    return self

    def _read_rest(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for line in iter(proc.stdout.readline, b""):
            self.output.append(line.decode(errors="replace"))

    def _collect(self) -> None:
        if self._drain is not None:
            self._drain.join(EXIT_TIMEOUT_S)
            self._drain = None
        if self.proc is not None and self.proc.stdout is not None and not self.proc.stdout.closed:
            self.output.append(self.proc.stdout.read().decode(errors="replace"))
            self.proc.stdout.close()

    def stop(self) -> int:
        """SIGTERM (graceful shutdown) and wait; return the exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(EXIT_TIMEOUT_S)
        self._collect()
        return code

    def kill(self) -> None:
        """SIGKILL: no shutdown at all (a crash)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(EXIT_TIMEOUT_S)
        self._collect()

    def restart(self) -> ServerProcess:
        """Start again on the same data directory and port."""
        self.proc = None
        return self.start()


class ServerFactory(Protocol):
    """Type of the ``server_factory`` fixture: ``server_factory(*serve_args, data=None, env=None)``."""

    def __call__(
        self, *args: str, data: Path | None = None, env: dict[str, str] | None = None
    ) -> ServerProcess: ...


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[ServerFactory]:
    """Start servers on data directories under ``tmp_path``; every one is killed at the end."""
    started: list[ServerProcess] = []

    def factory(*args: str, data: Path | None = None, env: dict[str, str] | None = None) -> ServerProcess:
        server = ServerProcess(data or tmp_path / f"node{len(started)}", *args, env=env)
        started.append(server)
        return server.start()

    yield factory
    for server in started:
        server.kill()


@pytest.fixture
def server(server_factory: ServerFactory) -> ServerProcess:
    """One running server with ``--fsync always`` on a fresh data directory."""
    return server_factory()
