"""The one atomic-replace helper (:mod:`seglog._fs`) behind both of its forms."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import seglog._fs
from seglog._fs import TMP_PREFIX, atomic_write, atomic_writer


def _record_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        calls.append("fsync")
        real_fsync(fd)

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        calls.append(f"replace {Path(src).name} {Path(dst).name}")
        real_replace(src, dst)

    def fsync_dir(path: str | os.PathLike[str]) -> None:
        calls.append("fsync_dir")  # the real one fsyncs through os.fsync: not recorded twice
        assert Path(path).is_dir()

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(seglog._fs, "fsync_dir", fsync_dir)
    return calls


def test_bytes_form_fsyncs_file_then_renames_then_fsyncs_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "f.json"
    target.write_bytes(b"old")
    calls = _record_calls(monkeypatch)
    atomic_write(target, b"new")
    assert calls == ["fsync", "replace f.json.tmp f.json", "fsync_dir"]
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]


def test_context_form_same_discipline_unique_temp_and_parents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "a" / "b" / "obj"
    calls = _record_calls(monkeypatch)
    with atomic_writer(target, make_parents=True) as f:
        f.write(b"data")
        (tmp_name,) = [p.name for p in target.parent.iterdir()]
    assert tmp_name.startswith(f"{TMP_PREFIX}obj.")
    assert calls == ["fsync_dir", "fsync_dir", "fsync", f"replace {tmp_name} obj", "fsync_dir"]
    assert target.read_bytes() == b"data"


def test_bytes_form_reuses_a_stale_temp(tmp_path: Path) -> None:
    (tmp_path / "f.tmp").write_bytes(b"left by a crash, longer than the new data")
    atomic_write(tmp_path / "f", b"x")
    assert (tmp_path / "f").read_bytes() == b"x"
    assert not (tmp_path / "f.tmp").exists()


@pytest.mark.parametrize("tmp_name", [None, "f.tmp"])
def test_error_leaves_old_content_and_no_temp(tmp_path: Path, tmp_name: str | None) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_writer(target, tmp_name=tmp_name) as f:
        f.write(b"partial")
        raise RuntimeError("boom")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


def test_missing_parent_without_make_parents_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        atomic_write(tmp_path / "missing" / "f", b"x")
