"""Shared fixtures. Tier fixtures (MinIO, Spark) live in tests/tier_fixtures.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

pytest_plugins = ["tests.tier_fixtures", "tests.server_fixtures", "tests.etcd_fixtures"]

T = TypeVar("T")


@pytest.fixture
def run() -> Callable[[Coroutine[Any, Any, T]], T]:
    """Run a coroutine to completion on a fresh event loop."""

    def _run(coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run(coro)

    return _run


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


class FakeClock:
    """An injectable µs clock that only moves when told to."""

    def __init__(self, start_us: int = 1_700_000_000_000_000) -> None:
        self.now_us = start_us

    def __call__(self) -> int:
        return self.now_us

    def advance_ms(self, ms: int) -> None:
        self.now_us += ms * 1000


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
