from __future__ import annotations

from pathlib import Path

import pytest

import seglog
from seglog import errors
from tests.test_crash import _run_and_kill


def test_commit_committed_rewind_and_reopen(run, data_dir: Path) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("g", shards=2)
            assert await db.committed("c1", 0) is None
            await db.commit("c1", 0, 10)
            await db.commit("c1", 1, 3)
            await db.commit("c2", 0, 7)
            assert await db.committed("c1", 0) == 10
            await db.commit("c1", 0, 4)  # rewinding is allowed
            assert await db.committed("c1", 0) == 4
            for bad in ("", "../x", ".hidden", "a/b", "x" * 200, 5):
                with pytest.raises(errors.InvalidName):
                    await db.commit(bad, 0, 1)  # type: ignore[arg-type]
            with pytest.raises(errors.InvalidArgument):
                await db.commit("c1", 2, 1)
            with pytest.raises(errors.InvalidArgument):
                await db.commit("c1", 0, -1)
            assert await db.committed("c1", 0) == 4
        async with seglog.open(data_dir) as store:
            db = await store.open_db("g")
            assert await db.committed("c1", 0) == 4
            assert await db.committed("c1", 1) == 3
            assert await db.committed("c2", 0) == 7
            assert await db.committed("c2", 1) is None
            await db.close()
            with pytest.raises(errors.ClosedResourceError):
                await db.commit("c1", 0, 1)

    run(main())


def test_acknowledged_commits_survive_sigkill(run, data_dir: Path) -> None:
    lines = _run_and_kill(data_dir, "commits", 4000)
    last: dict[int, int] = {}
    for ln in lines:
        if ln.startswith("commit ") and ln.endswith("\n"):
            _, shard, offset = ln.split()
            last[int(shard)] = int(offset)
    assert last, "the child acknowledged no commit"

    async def verify() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.open_db("crash")
            for shard, offset in last.items():
                got = await db.committed("g", shard)
                # Commits are monotonic in the child: the durable one is at least the last ack.
                assert got is not None and got >= offset, (shard, got, offset)

    run(verify())
