"""A bit-flipped or truncated data file on one replica (Jepsen's NATS 2.12.1 case), on real processes.

The damaged replica detects the damage when it opens the shard (frame CRC / length checks
cut the log at the first bad frame), is never elected while it lacks acknowledged records,
refetches the rest from the leader and ends byte-identical to the others below the high
watermark; nothing corrupt is ever served.

The election check is deterministic: the follower is killed while in the ISR and the two
other nodes are paused (SIGSTOP) at once, so no controller removes it from the ISR when its
lease expires. The damaged follower restarts alone and becomes the controller; it must not
elect itself (it restarted, so it is out of the ISR until it catches up). With the old code
it did, and the paused nodes then truncated their acknowledged records to its cut log.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Final, TypeVar

import pytest

from seglog.client._http import NodeSession
from seglog.cluster.metadata import NO_LEADER
from seglog.errors import CorruptFrame, NotEnoughReplicas, NotLeader
from seglog.record import FRAME_HEADER_BYTES, decode_frames, parse_header, verify_frame
from tests.etcd_fixtures import EtcdProcess
from tests.queue_checker import check_queue
from tests.server_fixtures import ServerFactory, ServerProcess
from tests.test_cluster import (
    DB,
    _produce_ok,
    _when_hw,
    cluster_view,
    create_replicated,
    produce,
    read_all,
    start_cluster,
    until,
)

T = TypeVar("T")
Run = Callable[[Coroutine[Any, Any, T]], T]
BATCHES: Final = 40
PER_BATCH: Final = 25


def shard_segments(data: Path, shard: int = 0) -> list[Path]:
    """The segment files of ``shard`` of the test database under a node's data directory."""
    found = sorted(p for p in data.rglob(f"shard-{shard:04d}/*.log") if DB in p.parts)
    assert found, f"no segment files for {DB}/{shard} under {data}"
    return found


def frames_of(path: Path) -> list[tuple[int, int, int, int]]:
    """(position, size, base offset, next offset) of every frame in a segment file."""
    buf = path.read_bytes()
    out = []
    pos = 0
    while pos < len(buf):
        header = parse_header(buf, pos)
        out.append((pos, header.size, header.base_offset, header.next_offset))
        pos += header.size
    return out


def damage(data: Path, how: str, below: int) -> int:
    """Flip a byte in, or cut the file inside, the frame holding offset ``below // 2``.

    Returns the base offset of the damaged frame (recovery must cut the log there).
    """
    target = below // 2
    for path in shard_segments(data):
        for pos, size, base, nxt in frames_of(path):
            if base <= target < nxt:
                assert nxt <= below
                if how == "flip":
                    at = pos + FRAME_HEADER_BYTES + (size - FRAME_HEADER_BYTES) // 2
                    with open(path, "r+b") as f:
                        f.seek(at)
                        byte = f.read(1)
                        f.seek(at)
                        f.write(bytes([byte[0] ^ 0x10]))
                else:
                    os.truncate(path, pos + size // 2)
                return base
    raise AssertionError(f"no frame holds offset {target}")


async def raw_frames(session: NodeSession, hw: int) -> bytes:
    """The stored frames of shard 0 below ``hw``, byte for byte, as the node serves them."""
    out = bytearray()
    offset = 0
    while offset < hw:
        reply = await session.request(
            "GET", f"/v1/dbs/{DB}/shards/0/frames", params={"offset": offset, "max_bytes": 1 << 20}
        )
        body = reply.body
        if not body:
            break
        pos = 0
        while pos < len(body):
            header = parse_header(body, pos)
            if header.base_offset >= hw:
                return bytes(out)
            out += body[pos : pos + header.size]
            offset = header.next_offset
            pos += header.size
    return bytes(out)


async def shard_state(session: NodeSession) -> dict[str, Any] | None:
    view = await cluster_view(session)
    states = view["dbs"].get(DB, {}).get("state", [])
    return dict(states[0]) if states else None


async def _led(sessions: dict[int, NodeSession]) -> tuple[int, dict[str, Any]] | None:
    """``(leader, shard state)`` once a leader that knows it leads has the full ISR, else None."""
    state = await shard_state(sessions[1])
    if state is None or state["leader"] <= 0 or sorted(state["isr"]) != [1, 2, 3]:
        return None
    leader = int(state["leader"])
    view = await cluster_view(sessions[leader])
    return (leader, state) if any(p["db"] == DB for p in view["leading"]) else None


async def _produce_batches(session: NodeSession, acked: dict[str, int]) -> None:
    """``BATCHES`` acks=all batches to shard 0; each value's acknowledged offset into ``acked``."""
    for b in range(BATCHES):
        values = [f"a{b}-{i}" for i in range(PER_BATCH)]
        reply = await produce(session, 0, values)
        base = reply["parts"][0]["base_offset"]
        acked.update({v: base + i for i, v in enumerate(values)})


@pytest.mark.parametrize("how", ["flip", "truncate"])
def test_a_damaged_follower_is_repaired_and_never_elected_while_behind(
    how: str, server_factory: ServerFactory, etcd: EtcdProcess, run: Run[None]
) -> None:
    nodes = start_cluster(server_factory, etcd)

    async def main() -> None:
        sessions = {i: NodeSession(p.url, timeout_s=5) for i, p in nodes.items()}
        acked: dict[str, int] = {}
        try:
            await create_replicated(sessions[1], 1, 3, 2)

            leader, state = await until(lambda: _led(sessions), "a leader and a full ISR")
            await _produce_batches(sessions[leader], acked)
            hw = len(acked)
            # acks=all: every ISR member holds all of it; the follower's copy is complete.
            follower = next(r for r in state["replicas"] if r != leader)
            others = [i for i in (1, 2, 3) if i != follower]
            await until(lambda: _when_hw(sessions[follower], 0, hw), "the follower at the HW")

            # The follower crashes while in the ISR; the others pause at once, so nobody
            # removes it from the ISR when its lease expires.
            nodes[follower].kill()
            for i in others:
                _signal(nodes[i], signal.SIGSTOP)
            cut_at = damage(nodes[follower].data, how, hw)
            nodes[follower].restart()
            await sessions[follower].close()
            sessions[follower] = NodeSession(nodes[follower].url, timeout_s=5)

            # Detected at open: the log is cut at the damaged frame; what it serves is intact.
            async def cut() -> dict[str, Any] | None:
                offsets = (await sessions[follower].request("GET", f"/v1/dbs/{DB}")).json()["offsets"]
                return dict(offsets[0]) if offsets else None

            local = await until(cut, "the damaged follower's copy")
            assert local["end"] == cut_at, (local, cut_at)
            records, served_hw = await read_all(sessions[follower], 0)
            assert served_hw <= cut_at
            assert all(acked[v.decode()] == o for o, v in records)

            # Alone, it becomes the controller: it must not elect itself (it lacks acked records).
            async def decided() -> dict[str, Any] | None:
                view = await cluster_view(sessions[follower])
                if not view["controller"] or list(view["nodes"]) != [str(follower)]:
                    return None  # the paused nodes' leases have not all expired yet
                state = await shard_state(sessions[follower])
                return state if state is not None and state["leader"] in (NO_LEADER, follower) else None

            state = await until(decided, "the restarted follower alone, controlling the cluster")
            assert state["leader"] == NO_LEADER, state
            assert follower not in state["isr"], state
            with pytest.raises((NotLeader, NotEnoughReplicas)):
                await produce(sessions[follower], 0, ["never"])

            # The others wake up: a good replica leads, the damaged one refetches and rejoins.
            for i in others:
                _signal(nodes[i], signal.SIGCONT)

            async def healed() -> int | None:
                # The newest state any node knows (a node just woken from SIGSTOP still has
                # the old one), with all three in the ISR and a leader that knows it leads.
                views = [await cluster_view(sessions[i]) for i in (1, 2, 3)]
                states = [v["dbs"][DB]["state"][0] for v in views if DB in v["dbs"]]
                state = max(states, key=lambda s: s["partition_epoch"])
                if state["leader"] <= 0 or sorted(state["isr"]) != [1, 2, 3]:
                    return None
                leads = views[state["leader"] - 1]["leading"]
                return int(state["leader"]) if any(p["db"] == DB for p in leads) else None

            async def produce_more(values: list[str]) -> bool:
                new_leader = await healed()
                return new_leader is not None and await _produce_ok(sessions[new_leader], values)

            await until(healed, "a leader with all three replicas in the ISR")
            more = [f"b{i}" for i in range(PER_BATCH)]
            await until(lambda: produce_more(more), "a produce after healing")
            new_leader = await until(healed, "the leader after healing")
            hw_now = len(acked) + len(more)
            final, final_hw = await until(lambda: _when_hw(sessions[new_leader], 0, hw_now), "the HW")
            acked.update({v: o for o, v in ((o, v.decode()) for o, v in final) if v in more})
            logs = {}
            for i in (1, 2, 3):
                logs[i], _ = await until(
                    lambda i=i: _when_hw(sessions[i], 0, final_hw), f"node {i} at the HW"
                )
            check_queue(final, logs, acked, refused=["never"], unknown=[])
            # Byte-identical frames below the high watermark on every replica.
            copies = {i: await raw_frames(sessions[i], final_hw) for i in (1, 2, 3)}
            assert copies[follower] == copies[new_leader]
            assert len({*copies.values()}) == 1
        finally:
            for i in (1, 2, 3):
                if nodes[i].proc is not None and nodes[i].proc.poll() is None:  # type: ignore[union-attr]
                    _signal(nodes[i], signal.SIGCONT)
            for s in sessions.values():
                await s.close()

    run(main())


def _signal(node: ServerProcess, sig: signal.Signals) -> None:
    assert node.proc is not None
    node.proc.send_signal(sig)


def cut_before(data: Path, offset: int) -> int:
    """Cut a node's shard 0 file back to the start of the frame holding ``offset``; its base."""
    for path in shard_segments(data):
        for pos, _size, base, nxt in frames_of(path):
            if base <= offset < nxt:
                os.truncate(path, pos)
                return base
    raise AssertionError(f"no frame holds offset {offset}")


@pytest.mark.parametrize("trigger", ["consumer", "follower"])
def test_a_damaged_frame_on_the_leader_is_never_served_and_is_repaired(
    trigger: str, server_factory: ServerFactory, etcd: EtcdProcess, run: Run[None]
) -> None:
    """A byte flips in the running leader's file below the HW. A read that reaches the frame
    (a consumer's, or a lagging follower's fetch) gets ``CorruptFrame``, never the bytes; the
    leader hands the shard to the in-sync replica that holds the frame, cuts its own copy
    there and refetches it: every replica ends byte-identical, nothing acknowledged lost."""
    nodes = start_cluster(server_factory, etcd)

    async def main() -> None:
        sessions = {i: NodeSession(p.url, timeout_s=5) for i, p in nodes.items()}
        acked: dict[str, int] = {}
        try:
            await create_replicated(sessions[1], 1, 3, 2)

            leader, state = await until(lambda: _led(sessions), "a leader and a full ISR")
            await _produce_batches(sessions[leader], acked)
            hw = len(acked)
            lagger, keeper = (r for r in state["replicas"] if r != leader)
            await until(lambda: _when_hw(sessions[keeper], 0, hw), "the keeper at the HW")
            # A follower that will have to fetch across the damaged frame: down, and cut back.
            nodes[lagger].kill()

            async def without_lagger() -> bool:
                state = await shard_state(sessions[leader])
                return state is not None and sorted(state["isr"]) == sorted([leader, keeper])

            await until(without_lagger, "the stopped follower out of the ISR")
            cut_before(nodes[lagger].data, hw // 5)
            bad = damage(nodes[leader].data, "flip", hw)  # while the leader runs
            bad_values = {v for v, o in acked.items() if o >= bad}
            if trigger == "consumer":
                with pytest.raises(CorruptFrame):
                    await sessions[leader].request(
                        "GET", f"/v1/dbs/{DB}/shards/0/frames", params={"offset": bad, "max_bytes": 1 << 20}
                    )
                # What precedes the frame is still served; the frame itself never.
                reply = await sessions[leader].request(
                    "GET", f"/v1/dbs/{DB}/shards/0/frames", params={"offset": 0, "max_bytes": 1 << 24}
                )
                served = decode_frames(reply.body, 0, hw)
                assert not bad_values & {v.decode() for v in served.column("value").to_pylist()}
            nodes[lagger].restart()
            await sessions[lagger].close()
            sessions[lagger] = NodeSession(nodes[lagger].url, timeout_s=5)

            # The keeper (it holds the frame) takes over under a new epoch.
            async def handed_over() -> dict[str, Any] | None:
                state = await shard_state(sessions[keeper])
                if state is None or state["leader"] != keeper:
                    return None
                view = await cluster_view(sessions[keeper])
                return state if any(p["db"] == DB for p in view["leading"]) else None

            state = await until(handed_over, "the keeper leading")
            assert state["leader_epoch"] > 0

            async def healed() -> bool:
                state = await shard_state(sessions[keeper])
                return state is not None and state["leader"] == keeper and sorted(state["isr"]) == [1, 2, 3]

            await until(healed, "all three back in the ISR")
            more = [f"b{i}" for i in range(PER_BATCH)]
            await until(lambda: _produce_ok(sessions[keeper], more), "a produce after the repair")
            final, final_hw = await until(lambda: _when_hw(sessions[keeper], 0, hw + len(more)), "the HW")
            acked.update({v: o for o, v in ((o, v.decode()) for o, v in final) if v in more})
            logs = {}
            for i in (1, 2, 3):
                logs[i], _ = await until(
                    lambda i=i: _when_hw(sessions[i], 0, final_hw), f"node {i} at the HW"
                )
            check_queue(final, logs, acked, refused=[], unknown=[])
            copies = {i: await raw_frames(sessions[i], final_hw) for i in (1, 2, 3)}
            assert len({*copies.values()}) == 1, {i: len(c) for i, c in copies.items()}
            assert any("is damaged" in line for line in nodes[leader].output)
        finally:
            for s in sessions.values():
                await s.close()

    run(main())


async def served_intact(session: NodeSession, hw: int) -> list[tuple[int, bytes]] | None:
    """Every record below ``hw`` the node serves, each frame checked here too; ``None`` while
    it refuses a damaged frame (``CorruptFrame``, retried by :func:`until`)."""
    out: list[tuple[int, bytes]] = []
    offset = 0
    while offset < hw:
        reply = await session.request(
            "GET", f"/v1/dbs/{DB}/shards/0/frames", params={"offset": offset, "max_bytes": 1 << 20}
        )
        if not reply.body:
            return None
        pos = 0
        while pos < len(reply.body):
            header = parse_header(reply.body, pos)
            try:
                verify_frame(reply.body, pos, header)
            except CorruptFrame as exc:  # not retried by until(): the node served rot
                raise AssertionError(f"a damaged frame was served: {exc}") from exc
            pos += header.size
        table = decode_frames(reply.body, offset, hw)
        out += zip(table.column("offset").to_pylist(), table.column("value").to_pylist(), strict=True)
        offset = out[-1][0] + 1
    return out


def test_a_flipped_byte_in_a_followers_sealed_segment_is_never_served_and_is_refetched(
    server_factory: ServerFactory, etcd: EtcdProcess, run: Run[None]
) -> None:
    """Sealed segments below the recovery checkpoint are trusted at open (not rescanned), so
    rot there is found by the CRC check of the first read that reaches it: the follower
    refuses to serve the frame, leaves the ISR, cuts its log there and refetches it."""
    nodes = start_cluster(server_factory, etcd)

    async def main() -> None:
        sessions = {i: NodeSession(p.url, timeout_s=5) for i, p in nodes.items()}
        acked: dict[str, int] = {}
        try:
            await create_replicated(sessions[1], 1, 3, 2, segment_bytes=8192)

            leader, state = await until(lambda: _led(sessions), "a leader and a full ISR")
            await _produce_batches(sessions[leader], acked)
            hw = len(acked)
            follower = next(r for r in state["replicas"] if r != leader)
            await until(lambda: _when_hw(sessions[follower], 0, hw), "the follower at the HW")
            nodes[follower].kill()
            segments = shard_segments(nodes[follower].data)
            assert len(segments) >= 3, segments
            sealed = segments[len(segments) // 2 - 1]
            pos, size, bad, _ = frames_of(sealed)[len(frames_of(sealed)) // 2]
            with open(sealed, "r+b") as f:
                f.seek(pos + FRAME_HEADER_BYTES + (size - FRAME_HEADER_BYTES) // 2)
                byte = f.read(1)
                f.seek(-1, os.SEEK_CUR)
                f.write(bytes([byte[0] ^ 0x01]))
            nodes[follower].restart()
            await sessions[follower].close()
            sessions[follower] = NodeSession(nodes[follower].url, timeout_s=5)

            async def whole() -> bool:
                state = await shard_state(sessions[leader])
                return state is not None and sorted(state["isr"]) == [1, 2, 3]

            await until(whole, "the follower back in the ISR")
            # Whatever recovery trusted, the follower serves only intact frames and ends with
            # the right records (the first read that reaches the rot starts the refetch).
            records = await until(
                lambda: served_intact(sessions[follower], hw), "the follower's records intact"
            )
            assert records == sorted((o, v.encode()) for v, o in acked.items())
            await until(whole, "the follower back in the ISR after its repair")
            more = [f"b{i}" for i in range(PER_BATCH)]
            await until(lambda: _produce_ok(sessions[leader], more), "a produce after the repair")
            final, final_hw = await until(lambda: _when_hw(sessions[leader], 0, hw + len(more)), "the HW")
            acked.update({v: o for o, v in ((o, v.decode()) for o, v in final) if v in more})
            logs = {}
            for i in (1, 2, 3):
                logs[i], _ = await until(
                    lambda i=i: _when_hw(sessions[i], 0, final_hw), f"node {i} at the HW"
                )
            check_queue(final, logs, acked, refused=[], unknown=[])
            copies = {i: await raw_frames(sessions[i], final_hw) for i in (1, 2, 3)}
            assert len({*copies.values()}) == 1, {i: len(c) for i, c in copies.items()}
            found = [
                line for line in nodes[follower].output if "recovery cut" in line or "is damaged" in line
            ]
            print(f"damaged frame at offset {bad} in {sealed.name}: {found}")
            assert found
        finally:
            for s in sessions.values():
                await s.close()

    run(main())


def test_a_leader_damaged_while_down_is_cut_at_open_and_refetches(
    server_factory: ServerFactory, etcd: EtcdProcess, run: Run[None]
) -> None:
    """The leader is SIGKILLed and a byte flipped in its file before it restarts: an in-sync
    replica takes over, and the old leader's recovery cuts its log at the frame, so it
    follows, refetches and ends byte-identical; it never serves the damaged frame."""
    nodes = start_cluster(server_factory, etcd)

    async def main() -> None:
        sessions = {i: NodeSession(p.url, timeout_s=5) for i, p in nodes.items()}
        acked: dict[str, int] = {}
        try:
            await create_replicated(sessions[1], 1, 3, 2)

            old, _ = await until(lambda: _led(sessions), "a leader and a full ISR")
            await _produce_batches(sessions[old], acked)
            hw = len(acked)
            nodes[old].kill()
            cut_at = damage(nodes[old].data, "flip", hw)
            others = [i for i in (1, 2, 3) if i != old]

            async def new_leader() -> int | None:
                for i in others:
                    view = await cluster_view(sessions[i])
                    state = view["dbs"][DB]["state"][0]
                    if state["leader"] == i and any(p["db"] == DB for p in view["leading"]):
                        return i
                return None

            leader = await until(new_leader, "an in-sync replica leading")
            nodes[old].restart()
            await sessions[old].close()
            sessions[old] = NodeSession(nodes[old].url, timeout_s=5)

            async def detected() -> bool:
                return any("recovery cut" in line for line in nodes[old].output)

            await until(detected, "the damage detected when the old leader opens the shard")
            records = await until(lambda: served_intact(sessions[old], hw), "the old leader's records intact")
            assert records == sorted((o, v.encode()) for v, o in acked.items())

            async def whole() -> bool:
                state = await shard_state(sessions[leader])
                return state is not None and sorted(state["isr"]) == [1, 2, 3]

            await until(whole, "the old leader back in the ISR")
            more = [f"b{i}" for i in range(PER_BATCH)]
            await until(lambda: _produce_ok(sessions[leader], more), "a produce after the repair")
            final, final_hw = await until(lambda: _when_hw(sessions[leader], 0, hw + len(more)), "the HW")
            acked.update({v: o for o, v in ((o, v.decode()) for o, v in final) if v in more})
            logs = {}
            for i in (1, 2, 3):
                logs[i], _ = await until(
                    lambda i=i: _when_hw(sessions[i], 0, final_hw), f"node {i} at the HW"
                )
            check_queue(final, logs, acked, refused=[], unknown=[])
            copies = {i: await raw_frames(sessions[i], final_hw) for i in (1, 2, 3)}
            assert len({*copies.values()}) == 1, {i: len(c) for i, c in copies.items()}
            assert cut_at < hw
        finally:
            for s in sessions.values():
                await s.close()

    run(main())
