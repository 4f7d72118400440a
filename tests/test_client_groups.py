"""Consumer groups: the coordinator's rules (injected clock) and members over real sockets."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from seglog.client import Consumer
from seglog.cluster import protocol
from seglog.cluster.coordinator import GroupCoordinator, range_assignment
from seglog.cluster.group_routes import GROUPS
from seglog.cluster.server import serve
from seglog.errors import InvalidArgument, StaleGeneration, UnknownMember
from tests.server_fixtures import ServerProcess

ROOT = Path(__file__).resolve().parent.parent
DB = "g"
KEY = ("db", "grp")
WAIT_S = 60.0  # generous bound on waits for events; never a measured duration


class Clock:
    """Monotonic seconds that move only when told to."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# --- the coordinator, pure -----------------------------------------------------------


@pytest.mark.parametrize("shards", [1, 2, 5, 8, 13])
def test_range_assignment_covers_every_shard_once_in_contiguous_ranges(shards: int) -> None:
    for n in range(1, 12):
        members = [f"m{i:02d}" for i in reversed(range(n))]
        got = range_assignment(shards, members)
        assert sorted(got) == sorted(members)
        flat = [s for m in sorted(got) for s in got[m]]
        assert flat == list(range(shards)), "ranges in member order, no overlap, full coverage"
        sizes = [len(got[m]) for m in sorted(got)]
        assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
        for r in got.values():
            assert r == list(range(r[0], r[0] + len(r))) if r else True
        if n > shards:
            assert sum(1 for r in got.values() if not r) == n - shards


def test_generation_bumps_on_every_membership_change_only() -> None:
    c = GroupCoordinator(clock=Clock())
    a = c.join(KEY, 4, session_timeout_ms=1000, member_id="a")
    assert (a.generation, a.assignment) == (1, [0, 1, 2, 3])
    assert c.join(KEY, 4, session_timeout_ms=1000, member_id="a").generation == 1  # rejoin: no change
    b = c.join(KEY, 4, session_timeout_ms=1000, member_id="b")
    assert (b.generation, b.assignment) == (2, [2, 3])
    # A member behind learns the change from its heartbeat.
    assert c.heartbeat(KEY, "a", 1).assignment == [0, 1]
    assert c.heartbeat(KEY, "a", 2).generation == 2  # heartbeats never bump
    assert c.leave(KEY, "b") and c.heartbeat(KEY, "a", 2).generation == 3
    assert not c.leave(KEY, "b")
    assert c.heartbeat(KEY, "a", 3).assignment == [0, 1, 2, 3]
    fresh = c.join(KEY, 4, session_timeout_ms=1000)  # server-made id
    assert fresh.generation == 4 and len(fresh.member_id) >= 16
    with pytest.raises(StaleGeneration) as info:
        c.heartbeat(KEY, "a", 99)  # never handed out
    assert info.value.current == 4


def test_sessions_expire_lazily_and_from_the_timer_view() -> None:
    clock = Clock()
    c = GroupCoordinator(clock=clock)
    c.join(KEY, 6, session_timeout_ms=1000, member_id="a")
    c.join(KEY, 6, session_timeout_ms=5000, member_id="b")
    assert c.next_deadline() == clock.now + 1.0
    clock.now += 0.9
    c.heartbeat(KEY, "a", 2)  # a's deadline moves to now + 1 s
    clock.now += 0.5
    assert c.due() == [] and c.heartbeat(KEY, "b", 2).generation == 2
    clock.now += 0.6  # a silent for 1.1 s
    assert c.due() == [KEY]
    assert c.expire(KEY) == ["a"] and c.due() == []
    m = c.heartbeat(KEY, "b", 2)
    assert (m.generation, m.assignment) == (3, [0, 1, 2, 3, 4, 5])
    with pytest.raises(UnknownMember):
        c.heartbeat(KEY, "a", 2)
    # Lazily: the next request of the group expires b without any timer.
    clock.now += 5.0
    with pytest.raises(UnknownMember):
        c.heartbeat(KEY, "b", 3)
    assert c.describe(KEY) == {"generation": 4, "members": {}}


def test_commits_are_fenced_by_member_generation_and_ownership() -> None:
    clock = Clock()
    c = GroupCoordinator(clock=clock)
    c.check_commit(KEY, None, None, [0, 1])  # no members: a manual-assignment commit
    c.join(KEY, 4, session_timeout_ms=1000, member_id="a")
    c.check_commit(KEY, "a", 1, [0, 3])
    with pytest.raises(UnknownMember):
        c.check_commit(KEY, None, None, [0])
    c.join(KEY, 4, session_timeout_ms=1000, member_id="b")
    with pytest.raises(StaleGeneration) as info:
        c.check_commit(KEY, "a", 1, [0])
    assert (info.value.generation, info.value.current) == (1, 2)
    assert not isinstance(info.value, UnknownMember)
    with pytest.raises(InvalidArgument):
        c.check_commit(KEY, "a", 2, [3])  # b's shard now
    with pytest.raises(UnknownMember):
        c.check_commit(KEY, "zombie", 2, [0])
    clock.now += 2
    with pytest.raises(UnknownMember):
        c.check_commit(KEY, "a", 2, [0])  # expired


def test_session_timeout_bounds_and_member_ids() -> None:
    c = GroupCoordinator(clock=Clock(), min_session_timeout_ms=100, max_session_timeout_ms=1000)
    for bad in (99, 1001, "500"):
        with pytest.raises(InvalidArgument):
            c.join(KEY, 1, session_timeout_ms=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        c.join(KEY, 1, session_timeout_ms=500, member_id="x\n")
    assert c.describe(KEY)["generation"] == 0


# --- members over the network ----------------------------------------------------------


async def _create(url: str, shards: int) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{url}/v1/dbs", json={"name": DB, "shards": shards}) as r:
            assert r.status == 201, await r.text()
        for shard in range(shards):
            body = json.dumps({"topic": "t", "value": f"s{shard}"}).encode()
            async with s.post(
                f"{url}/v1/dbs/{DB}/records?shard={shard}",
                data=body,
                headers={"Content-Type": protocol.NDJSON},
            ) as r:
                assert r.status == 200, await r.text()


def _check_split(assignments: Sequence[list[int]], shards: int) -> None:
    flat = sorted(s for a in assignments for s in a)
    assert flat == list(range(shards)), f"overlap or gap: {assignments}"
    for a in assignments:
        assert a == list(range(a[0], a[0] + len(a))) if a else True, f"not a range: {a}"


class Child:
    """A member in a child process, reporting each adopted assignment on stdout."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.last: dict[str, Any] = {}

    @classmethod
    async def start(cls, url: str, group: str, session_ms: int) -> Child:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.group_child",
            url,
            DB,
            group,
            str(session_ms),
            stdout=asyncio.subprocess.PIPE,
            cwd=ROOT,
        )
        return cls(proc)

    async def next(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = await self.proc.stdout.readline()
        assert line, f"group child exited with {await self.proc.wait()}"
        self.last = json.loads(line)
        return self.last


async def _until_settled(consumers: list[Consumer], child: Child | None, shards: int) -> None:
    """Wait (on assignment events) until every member is at one generation covering all shards."""

    def settled() -> bool:
        gens = {c.generation for c in consumers}
        assigns = [c.assignment() for c in consumers]
        if child is not None:
            gens.add(child.last.get("generation", -1))
            assigns.append(child.last.get("assignment", []))
        return len(gens) == 1 and sorted(s for a in assigns for s in a) == list(range(shards))

    reading: asyncio.Future[dict[str, Any]] | None = None
    try:
        async with asyncio.timeout(WAIT_S):
            while not settled():
                waits = [asyncio.ensure_future(c.wait_for_assignment(c.generation)) for c in consumers]
                if child is not None:
                    # One read of the child at a time, kept across rounds: its line is never lost.
                    reading = reading if reading is not None else asyncio.ensure_future(child.next())
                await asyncio.wait(
                    [*waits, *([reading] if reading else [])], return_when=asyncio.FIRST_COMPLETED
                )
                for w in waits:
                    w.cancel()
                if reading is not None and reading.done():
                    reading.result()
                    reading = None
    finally:
        if reading is not None:
            reading.cancel()


def test_three_members_split_shards_and_a_killed_ones_move_after_its_session(server: ServerProcess) -> None:
    shards = 7

    async def main() -> None:
        await _create(server.url, shards)
        opts: dict[str, Any] = {"group": "g", "session_timeout_ms": 1000, "heartbeat_interval_ms": 200}
        async with Consumer(server.url, DB, **opts) as a, Consumer(server.url, DB, **opts) as b:
            child = await Child.start(server.url, "g", 1000)
            try:
                await child.next()
                await _until_settled([a, b], child, shards)
                split = [a.assignment(), b.assignment(), child.last["assignment"]]
                _check_split(split, shards)
                assert all(split), split  # 7 shards over 3 members: nobody idle
                by_id = dict(zip([a.member_id, b.member_id, child.last["member_id"]], split, strict=True))
                assert [s for m in sorted(by_id) for s in by_id[m]] == list(range(shards)), (
                    "ranges by member id"
                )
                lost = child.last["assignment"]
                before = a.generation
                child.proc.kill()  # SIGKILL: no leave, no more heartbeats
                await child.proc.wait()
                async with asyncio.timeout(WAIT_S):
                    while a.generation == before or a.generation != b.generation:
                        await asyncio.wait(
                            [
                                asyncio.ensure_future(a.wait_for_assignment(a.generation)),
                                asyncio.ensure_future(b.wait_for_assignment(b.generation)),
                            ],
                            return_when=asyncio.FIRST_COMPLETED,
                        )
                await _until_settled([a, b], None, shards)
                _check_split([a.assignment(), b.assignment()], shards)
                assert set(lost) <= set(a.assignment()) | set(b.assignment())
                # The moved shards are read by the survivors (no commits: from the start).
                seen: set[int] = set()
                async with asyncio.timeout(WAIT_S):
                    while seen != set(range(shards)):
                        for c in (a, b):
                            got = await c.getmany(timeout_ms=100)
                            seen |= set(got)
            finally:
                if child.proc.returncode is None:
                    child.proc.kill()
                    await child.proc.wait()

    asyncio.run(main())


def test_a_superseded_member_cannot_commit(server: ServerProcess) -> None:
    async def main() -> None:
        await _create(server.url, 4)
        # a heartbeats rarely: it keeps believing in its first generation after b joins.
        slow: dict[str, Any] = {"group": "z", "session_timeout_ms": 120_000, "heartbeat_interval_ms": 60_000}
        async with Consumer(server.url, DB, **slow) as a:
            assert a.assignment() == [0, 1, 2, 3]
            await a.commit({0: 1, 3: 1})
            async with Consumer(server.url, DB, group="z") as b:
                assert b.generation == a.generation + 1
                with pytest.raises(StaleGeneration) as info:
                    await a.commit({0: 0, 3: 0})  # a zombie moving the group backwards
                assert (info.value.generation, info.value.current) == (a.generation, b.generation)
                assert await b.committed(0) == 1 and await b.committed(3) == 1
                # The refused commit made a heartbeat now: a adopts generation 2 and commits again.
                async with asyncio.timeout(WAIT_S):
                    mine = await a.wait_for_assignment(1)
                assert a.generation == b.generation and sorted(mine + b.assignment()) == [0, 1, 2, 3]
                await a.commit({mine[0]: 2})
                assert await b.committed(mine[0]) == 2
                with pytest.raises(InvalidArgument):
                    await a.commit({b.assignment()[0]: 2})  # b's shard now
                # Raw: a commit from a member id the group does not know.
                async with aiohttp.ClientSession() as s:
                    body = {"member_id": "nobody", "generation": b.generation, "offsets": {"0": 0}}
                    async with s.post(f"{server.url}/v1/dbs/{DB}/groups/z/commit", json=body) as r:
                        assert r.status == 409 and (await r.json())["error"] == "UnknownMember"
                assert await b.committed(mine[0]) == 2

    asyncio.run(main())


def test_the_server_expires_silent_sessions_without_any_request(tmp_path: Path) -> None:
    async def main() -> None:
        # In process, to see the node's group service; still real sockets.
        async with serve(tmp_path / "node", port=0) as node:
            await _create(node.url, 2)
            async with aiohttp.ClientSession() as s:
                join = f"{node.url}/v1/dbs/{DB}/groups/quiet/join"
                async with s.post(join, json={"session_timeout_ms": 300}) as r:
                    assert r.status == 200
                    member = await r.json()
                assert node._runner is not None
                service = node._runner.app[GROUPS]
                # No request touches the group from here: only the timer can expire the member.
                await asyncio.wait_for(service.timer_expired.wait(), WAIT_S)
                assert service.coordinator.describe((DB, "quiet")) == {"generation": 2, "members": {}}
                body = {"member_id": member["member_id"], "generation": member["generation"]}
                async with s.post(f"{node.url}/v1/dbs/{DB}/groups/quiet/heartbeat", json=body) as r:
                    assert r.status == 409 and (await r.json())["error"] == "UnknownMember"
                async with s.post(join, json={"session_timeout_ms": 10}) as r:
                    assert r.status == 400 and (await r.json())["error"] == "InvalidArgument"

    asyncio.run(main())


def test_the_expiry_timer_outlives_a_failed_pass(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """One failing expiry pass (injected: the coordinator's ``due`` raises once) is logged and
    the timer goes on; before, its task ended and no silent member of any group expired again."""

    async def main() -> None:
        async with serve(tmp_path / "node", port=0) as node:
            await _create(node.url, 2)
            assert node._runner is not None
            service = node._runner.app[GROUPS]
            coordinator = service.coordinator
            due = coordinator.due  # only the timer asks what is due (requests expire their own group)
            failures = []

            def due_failing_once() -> Any:
                if not failures:
                    failures.append(1)
                    raise RuntimeError("injected expiry failure")
                return due()

            coordinator.due = due_failing_once  # type: ignore[method-assign]
            service.deadlines_changed()  # the timer's next pass: the one that fails
            async with aiohttp.ClientSession() as s:
                join = f"{node.url}/v1/dbs/{DB}/groups/quiet/join"
                async with s.post(join, json={"session_timeout_ms": 300}) as r:
                    assert r.status == 200
                await asyncio.wait_for(service.timer_expired.wait(), WAIT_S)
            assert failures == [1]
            assert coordinator.describe((DB, "quiet")) == {"generation": 2, "members": {}}

    with caplog.at_level(logging.ERROR, logger="seglog.server"):
        asyncio.run(main())
    assert any("expiring group sessions failed" in r.getMessage() for r in caplog.records)


def test_heartbeats_outlive_a_failed_beat(tmp_path: Path) -> None:
    """A beat that fails with something unexpected (injected) is logged and the next beats go
    on: the member outlives several session timeouts. Before, the heartbeat task ended and the
    node expired the member while it kept reading its shards."""

    async def main() -> None:
        async with serve(tmp_path / "node", port=0) as node:
            await _create(node.url, 2)
            assert node._runner is not None
            coordinator = node._runner.app[GROUPS].coordinator
            opts: dict[str, Any] = {"group": "hb", "session_timeout_ms": 500, "heartbeat_interval_ms": 50}
            async with Consumer(node.url, DB, **opts) as c:
                post = c._post
                beats = 0
                enough = asyncio.Event()

                async def failing_first_beat(action: str, body: dict[str, Any]) -> Any:
                    nonlocal beats
                    if action == "heartbeat":
                        beats += 1
                        if beats == 1:
                            raise RuntimeError("injected heartbeat failure")
                        if beats >= 40:  # 40 x 50 ms: four session timeouts after the failure
                            enough.set()
                    return await post(action, body)

                c._post = failing_first_beat  # type: ignore[method-assign]
                await asyncio.wait_for(enough.wait(), WAIT_S)
                members = coordinator.describe((DB, "hb"))["members"]
                assert list(members) == [c.member_id] and sorted(c.assignment()) == [0, 1]

    asyncio.run(main())


def test_members_rejoin_by_themselves_after_a_server_restart(server: ServerProcess) -> None:
    async def main() -> None:
        await _create(server.url, 4)
        opts: dict[str, Any] = {"group": "r", "session_timeout_ms": 2000, "heartbeat_interval_ms": 100}
        async with Consumer(server.url, DB, **opts) as a, Consumer(server.url, DB, **opts) as b:
            await _until_settled([a, b], None, 4)
            before = {a.member_id: a.assignment(), b.member_id: b.assignment()}
            generation = a.generation
            await asyncio.to_thread(server.stop)
            await asyncio.to_thread(server.restart)
            # The restarted node knows no member: the first to rejoin gets every shard (an
            # assignment change), then the other rejoins and the split is as before.
            async with asyncio.timeout(WAIT_S):
                await asyncio.wait(
                    [
                        asyncio.ensure_future(a.wait_for_assignment(generation)),
                        asyncio.ensure_future(b.wait_for_assignment(generation)),
                    ],
                    return_when=asyncio.FIRST_COMPLETED,
                )
            await _until_settled([a, b], None, 4)
            assert {a.member_id: a.assignment(), b.member_id: b.assignment()} == before
            await a.commit({a.assignment()[0]: 1})
            await b.commit({b.assignment()[0]: 1})
            assert await a.committed(b.assignment()[0]) == 1

    asyncio.run(main())
