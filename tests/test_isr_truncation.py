"""Follower truncation by leader epoch on real stores: KIP-101's two scenarios, gaps, stale epochs."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import seglog
from seglog.isr.truncation import truncate_to_leader

T = TypeVar("T")
Run = Callable[[Coroutine[Any, Any, T]], T]
TS0 = 1_700_000_000_000_000


def _batch(tag: str, n: int) -> list[seglog.Record]:
    return [seglog.Record(topic="t", value=f"{tag}{i}".encode(), ts=TS0 + i) for i in range(n)]


async def _write(db: seglog.Database, tag: str, n: int, epoch: int) -> None:
    await db.append(_batch(tag, n), shard=0, leader_epoch=epoch)


async def _follow(leader: seglog.Database, follower: seglog.Database) -> int:
    """Truncate the follower against the leader, then copy the leader's frames past its end."""

    async def ask(epoch: int) -> tuple[int, int]:
        return leader.end_offset_for_epoch(0, epoch)

    cut = await truncate_to_leader(follower, 0, ask)
    while follower.end_offset(0) < leader.end_offset(0):
        frames = await leader.read_frames(0, follower.end_offset(0), 1 << 20)
        await follower.append_frames(0, frames, expected_base=follower.end_offset(0))
    return cut


async def _values(db: seglog.Database) -> list[bytes]:
    table = await db.read_arrow(0, 0, 10_000)
    return [v.as_py() for v in table.column("value")]


async def _frames(db: seglog.Database) -> bytes:
    return await db.read_frames(0, 0, 1 << 24)


def test_kip101_scenario_1_acked_tail_survives_a_follower_restart(tmp_path: Path, run: Run[None]) -> None:
    """A follower whose high watermark lags keeps records the leader has (HW truncation lost them)."""

    async def main() -> None:
        async with seglog.open(tmp_path / "a") as sa, seglog.open(tmp_path / "b") as sb:
            a = await sa.create_db("d", shards=1)
            b = await sb.create_db("d", shards=1)
            await _write(a, "m", 10, 1)
            await _write(a, "n", 10, 1)
            await _follow(a, b)
            a.update_high_watermark(0, 20)
            b.update_high_watermark(0, 10)  # the follower learns the HW one fetch late
            assert await _follow(a, b) == 20  # not cut to its HW of 10
            assert await _frames(b) == await _frames(a)

    run(main())


def test_kip101_scenario_2_diverged_replicas_converge(tmp_path: Path, run: Run[None]) -> None:
    """After a double failure the old leader's unreplicated tail is replaced by the new leader's."""

    async def main() -> None:
        async with seglog.open(tmp_path / "a") as sa, seglog.open(tmp_path / "b") as sb:
            a = await sa.create_db("d", shards=1)
            b = await sb.create_db("d", shards=1)
            await _write(a, "x", 10, 1)
            await _follow(a, b)
            await _write(a, "y", 10, 1)  # never replicated; both crash
            await _write(b, "z", 5, 2)  # b comes back first and leads epoch 2
            assert await _follow(b, a) == 10
            assert await _frames(a) == await _frames(b)
            assert await _values(a) == [f"x{i}".encode() for i in range(10)] + [
                f"z{i}".encode() for i in range(5)
            ]
            assert a.leader_epochs(0) == b.leader_epochs(0) == [(1, 0), (2, 10)]

    run(main())


def test_epoch_gap_and_an_epoch_the_leader_never_had(tmp_path: Path, run: Run[None]) -> None:
    async def main() -> None:
        async with seglog.open(tmp_path / "l") as sl, seglog.open(tmp_path / "f") as sf:
            leader = await sl.create_db("d", shards=1)
            follower = await sf.create_db("d", shards=1)
            # Shared epoch-1 history of 10, then the follower led epoch 2 alone (10 more) while
            # the leader wrote 5 more in epoch 1 and then led epoch 3.
            await _write(leader, "a", 10, 1)
            await _follow(leader, follower)
            await _write(follower, "f", 10, 2)
            await _write(leader, "b", 5, 1)
            await _write(leader, "c", 15, 3)
            assert await _follow(leader, follower) == 10  # min(leader's end of 1 = 15, own = 10)
            assert await _frames(follower) == await _frames(leader)
            # A follower whose latest epoch is newer than anything the leader has (5): the
            # leader answers "undefined" and the whole epoch-5 tail goes.
            await _write(follower, "g", 4, 5)
            assert follower.end_offset(0) == 34
            assert await _follow(leader, follower) == 30
            assert await _frames(follower) == await _frames(leader)
            # A follower that is only behind loses nothing.
            await _write(leader, "h", 7, 3)
            assert await _follow(leader, follower) == 30
            assert await _frames(follower) == await _frames(leader)

    run(main())


def test_a_follower_with_only_epoch_zero_frames_and_an_empty_log(tmp_path: Path, run: Run[None]) -> None:
    async def main() -> None:
        async with seglog.open(tmp_path / "l") as sl, seglog.open(tmp_path / "f") as sf:
            leader = await sl.create_db("d", shards=1)
            follower = await sf.create_db("d", shards=1)
            assert await _follow(leader, follower) == 0
            await _write(follower, "stray", 3, 0)  # written while it was a standalone store
            await _write(leader, "a", 2, 1)
            assert await _follow(leader, follower) == 0  # the leader has no epoch-0 frame
            assert await _values(follower) == [b"a0", b"a1"]

    run(main())
