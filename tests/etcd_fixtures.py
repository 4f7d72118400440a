"""Real etcd processes for metadata tests (Debian's ``etcd-server``, installed by ``make etcd``)."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

START_TIMEOUT_S: Final = 30.0
STOP_TIMEOUT_S: Final = 15.0
HEALTH_POLL_S: Final = 0.05
PORT_ATTEMPTS: Final = 5


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PortTaken(RuntimeError):
    """A port picked as free was taken before etcd bound it (another process's connection)."""


class EtcdProcess:
    """One single-member etcd on loopback ports, its data in ``data_dir``."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.client_port = _free_port()
        self.peer_port = _free_port()
        self.url = f"http://127.0.0.1:{self.client_port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = data_dir.with_suffix(".log")

    def start(self) -> EtcdProcess:
        """Start etcd and wait until its ``/health`` says so (deadline, not a fixed sleep)."""
        binary = shutil.which("etcd")
        if binary is None:
            raise RuntimeError("etcd is not installed: run `make etcd` (make test does)")
        peer = f"http://127.0.0.1:{self.peer_port}"
        cmd = [
            binary,
            "--name=seglog-test",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={self.url}",
            f"--advertise-client-urls={self.url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=seglog-test={peer}",
        ]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                text = self.log.read_text()[-2000:]
                if "address already in use" in text:
                    raise PortTaken(text)
                raise RuntimeError(f"etcd exited with {self.proc.returncode}: {text}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as resp:
                    if json.loads(resp.read()).get("health") == "true":
                        return self
            except (urllib.error.URLError, OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"etcd did not become healthy: {self.log.read_text()[-2000:]}")
            # Polling a health endpoint with a deadline: etcd offers no readiness signal.
            time.sleep(HEALTH_POLL_S)

    def kill(self) -> None:
        """SIGKILL etcd (a crash of the metadata store)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(STOP_TIMEOUT_S)

    def stop(self) -> None:
        """SIGTERM and wait."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    """A fresh etcd for one test (on other ports when one picked as free was taken meanwhile)."""
    for attempt in range(PORT_ATTEMPTS):
        try:
            proc = EtcdProcess(tmp_path / f"etcd-{attempt}" if attempt else tmp_path / "etcd").start()
            break
        except PortTaken:
            if attempt == PORT_ATTEMPTS - 1:
                raise
    try:
        yield proc
    finally:
        proc.stop()
