"""``Database.restart_at``: a shard emptied and started over at a later offset (Kafka's
``truncateFullyAndStartAt``, for a follower whose log ends below its leader's start)."""

from __future__ import annotations

from pathlib import Path

import pytest

import seglog
from seglog.errors import InvalidArgument
from tests.faults import kill_at_each_call
from tests.helpers import read_all
from tests.test_replica_log import (
    ROOT,
    TS0,
    _all_frames,
    _append_epoch,
    _make_template,
    _records,
    asyncio_run,
)

RESTART_AT = 1000  # past the template's end (800)


def test_a_restarted_shard_is_empty_at_its_new_start_and_takes_the_leaders_frames(
    run, tmp_path: Path
) -> None:
    async def main() -> None:
        async with seglog.open(tmp_path / "leader") as a, seglog.open(tmp_path / "follower") as b:
            leader = await a.create_db("r", shards=2, segment_bytes=8192)
            follower = await b.create_db("r", shards=2, segment_bytes=8192)
            for k in range(20):
                await _append_epoch(leader, _records(50, k * 50), 0 if k < 10 else 3)
            first = await leader.read_frames(0, 0, max_bytes=4096)
            await follower.append_frames(0, first, expected_base=0)
            await follower.append(_records(30), shard=1)
            behind = follower.end_offset(0)
            assert 0 < behind < 600
            await leader.truncate_before(0, 600)  # the leader's retention passed the follower
            follower.update_high_watermark(0, behind)
            with pytest.raises(InvalidArgument, match="below the end offset"):
                await follower.restart_at(0, behind - 1)
            assert await follower.restart_at(0, 600) == 600
            assert (follower.start_offset(0), follower.end_offset(0)) == (600, 600)
            assert follower.high_watermark(0) == 600 and follower.leader_epochs(0) == []
            assert await read_all(follower, 0) == []
            # It fetches on from the leader's start, byte for byte, epochs included.
            await follower.append_frames(0, await _frames_from(leader, 600), expected_base=600)
            assert follower.end_offset(0) == 1000
            assert await _all_frames(follower, 0) == await _all_frames(leader, 0)
            assert follower.leader_epochs(0) == [(3, 600)]
            assert [r.offset for r in await follower.read_key(b"k3", shard=0)] == list(range(603, 1000, 50))
            assert len(await read_all(follower, 1)) == 30  # other shards untouched
        async with seglog.open(tmp_path / "follower") as b:  # and so it reopens
            follower = await b.open_db("r")
            assert (follower.start_offset(0), follower.end_offset(0)) == (600, 1000)
            assert follower.leader_epochs(0) == [(3, 600)]
            got = await follower.append(_records(5, 1000), shard=0)
            assert [m.offset for m in got] == list(range(1000, 1005))
        async with seglog.open(tmp_path / "m") as m:
            mem = await m.create_db("r", engine="memory")
            with pytest.raises(InvalidArgument, match="cannot restart"):
                await mem.restart_at(0, 10)

    run(main())


async def _frames_from(db: seglog.Database, offset: int) -> bytes:
    out = []
    while offset < db.end_offset(0):
        chunk = await db.read_frames(0, offset, max_bytes=1 << 20)
        out.append(chunk)
        offset = db.end_offset(0)
    return b"".join(out)


def test_restart_killed_at_every_step_reopens_as_one_of_three_logs(tmp_path: Path) -> None:
    """SIGKILL at each unlink, sync, rename and write of a restart: the reopened shard is the
    whole log, or empty at its old start (files gone, checkpoint not yet moved), or empty at
    the new start; never a mix, and the epoch cache, the index and the high watermark agree."""
    template = tmp_path / "template"
    full = _make_template(template)
    outcomes: set[tuple[int, int]] = set()
    child = ["-m", "tests.replica_child", "restart", "{data}", str(RESTART_AT)]
    syscalls = ("unlink", "fsync", "fdatasync", "rename", "pwrite64", "write")
    for syscall, kill_at, data, done in kill_at_each_call(template, tmp_path, syscalls, child, cwd=ROOT):
        state = asyncio_run(_verified_state(data, full))
        assert state in ((0, len(full)), (0, 0), (RESTART_AT, RESTART_AT)), (syscall, kill_at, state)
        if done:
            assert state == (RESTART_AT, RESTART_AT)
        else:
            outcomes.add(state)
    # Killed before the point of no return and after it (the empty log at the old start).
    assert {(0, len(full)), (0, 0)} <= outcomes, outcomes


async def _verified_state(data: Path, full: list[tuple[int, bytes]]) -> tuple[int, int]:
    async with seglog.open(data) as store:
        db = await store.open_db("r")
        start, end = db.start_offset(0), db.end_offset(0)
        assert [(r.offset, r.value) for r in await read_all(db, 0)] == full[start:end]
        assert [r.offset for r in await db.read_key(b"k3", shard=0)] == [
            o for o in range(3, end, 50) if o >= start
        ]
        if end == len(full):
            assert db.leader_epochs(0) == [(0, 0), (2, 400)]
        else:
            assert all(s <= end for _, s in db.leader_epochs(0)), db.leader_epochs(0)
            assert db.high_watermark(0) <= end
        # The shard takes appends at its end whatever the step it stopped at.
        got = await db.append(_records(3, end), shard=0)
        assert [m.offset for m in got] == [end, end + 1, end + 2]
        assert TS0 > 0
        return start, end
