"""Internal state names are StrEnums equal to the strings they replace."""

from __future__ import annotations

import typing
from pathlib import Path

from seglog.engines.base import EngineConfig, Fsync, FsyncPolicy, ReadOnlyReason
from seglog.segment.log_segment import LogSegment, SegmentState


def test_fsync_enum_matches_the_public_literal() -> None:
    assert typing.get_args(FsyncPolicy) == tuple(Fsync)
    for name in typing.get_args(FsyncPolicy):
        config = EngineConfig(directory=Path("."), shards=1, fsync=name)
        assert config.fsync_policy is Fsync(name)
        assert config.fsync_policy == name


def test_read_only_reasons_read_as_text() -> None:
    assert f"read-only after {ReadOnlyReason.FAILED_SYNC}" == (
        "read-only after a failed sync (acknowledged writes since the last sync may be lost)"
    )


def test_segment_state(tmp_path: Path) -> None:
    seg = LogSegment.create(tmp_path, 0)
    assert seg.state is SegmentState.ACTIVE
    assert "active" in repr(seg)
    seg.seal()
    assert seg.state is SegmentState.SEALED
    assert "sealed" in repr(seg)
