"""StoreConfig: the store options as one validated value behind ``seglog.open``."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

import seglog
from seglog.errors import InvalidArgument
from seglog.store import Store
from seglog.store_config import StoreConfig

BAD_OPTIONS: list[dict[str, Any]] = [
    {"buffer_ms": 0},
    {"journal_bytes": 1000},
    {"tier": 5},
    {"tier": "file:///x", "tier_interval_ms": 0},
    {"tier_interval_ms": 5},
    {"quota_bytes": -1},
    {"retention_interval_ms": 0},
    {"fsync": "sometimes"},
    {"fsync_interval_ms": True},
    {"io_workers": 0},
    # Two bad options: the first one checked is the one reported, as before.
    {"io_workers": 0, "buffer_ms": 0},
]


@pytest.mark.parametrize("options", BAD_OPTIONS)
def test_open_and_store_config_reject_alike(tmp_path: Path, options: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument) as via_open:
        seglog.open(tmp_path, **options)
    with pytest.raises(InvalidArgument) as via_config:
        StoreConfig(**options)
    assert str(via_open.value) == str(via_config.value)


def test_open_keeps_its_keywords_and_defaults(tmp_path: Path) -> None:
    params = inspect.signature(seglog.open).parameters
    fields = {f.name: f.default for f in dataclasses.fields(StoreConfig)}
    assert list(params)[1:] == list(fields)
    for name, default in fields.items():
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY
        assert params[name].default == default, name
    store = seglog.open(tmp_path, quota_bytes=10, io_workers=2)
    assert store.config == StoreConfig(quota_bytes=10, io_workers=2)
    assert (store.quota_bytes, store.io_workers) == (10, 2)


def test_store_config_is_frozen_and_keyword_only(tmp_path: Path) -> None:
    config = StoreConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.io_workers = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        StoreConfig("always")  # type: ignore[misc]
    assert Store(tmp_path).config == config


def test_store_opens_from_a_config(run: Callable[[Coroutine[Any, Any, None]], None], tmp_path: Path) -> None:
    async def main() -> None:
        async with Store(tmp_path, StoreConfig(fsync="never", retention_interval_ms=None)) as store:
            db = await store.create_db("d")
            await db.append(seglog.Record("t", b"v"))
            assert store.fsync == "never"

    run(main())
