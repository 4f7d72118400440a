"""Property: a replica that follows a leader through appends, epoch changes, truncations on
both sides and reopens holds exactly the leader's bytes, and every index answers alike.

The follower catches up the way Kafka's does (KIP-101/279): it asks the leader where its own
latest epoch ends (``end_offset_for_epoch``), truncates to that, then copies frames with
``read_frames``/``append_frames``.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import seglog
import seglog.record

TS0 = 1_700_000_000_000_000
ROOT = Path(__file__).resolve().parent.parent

# One step: ("append", records), ("truncate_leader", fraction), ("truncate_follower", fraction),
# ("sync",), ("reopen",).
_step = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 120)),
    st.tuples(st.just("truncate_leader"), st.floats(0, 1)),
    st.tuples(st.just("truncate_follower"), st.floats(0, 1)),
    st.tuples(st.just("sync"), st.just(0)),
    st.tuples(st.just("reopen"), st.just(0)),
)


async def _sync(leader: seglog.Database, follower: seglog.Database) -> None:
    """Kafka's follower: truncate to where the leader says our latest epoch ends, then fetch."""
    epochs = follower.leader_epochs(0)
    mine = epochs[-1][0] if epochs else 0
    _epoch, end = leader.end_offset_for_epoch(0, mine)
    if end < 0:  # the leader never had our epoch: nothing of ours is known to be shared
        end = 0
    if end < follower.end_offset(0):
        await follower.truncate_to(0, end, force=True)
    offset = follower.end_offset(0)
    while offset < leader.end_offset(0):
        chunk = await leader.read_frames(0, offset, max_bytes=4096)
        offset = await follower.append_frames(0, chunk, expected_base=offset)


async def _frames(db: seglog.Database) -> bytes:
    return await db.read_frames(0, 0, max_bytes=1 << 30) if db.end_offset(0) else b""


def _epochs(db: seglog.Database) -> list[tuple[int, int]]:
    """The epoch cache, with "only epoch 0" written as its documented equal, the empty cache.

    A leader whose later epochs were cut away keeps ``(0, start)`` (Kafka's cache does too);
    a follower that only ever got epoch-0 frames has no entry. Same meaning, and the
    ``end_offset_for_epoch`` answers are compared below.
    """
    entries = db.leader_epochs(0)
    return [] if len(entries) == 1 and entries[0][0] == 0 else entries


async def _check_same(leader: seglog.Database, follower: seglog.Database) -> None:
    assert await _frames(follower) == await _frames(leader)
    assert _epochs(follower) == _epochs(leader)
    end = leader.end_offset(0)
    for key in (b"k0", b"k3", b"k11"):
        a = await leader.read_key(key, shard=0)
        b = await follower.read_key(key, shard=0)
        assert [(r.offset, r.value) for r in a] == [(r.offset, r.value) for r in b]
    for ts in (TS0, TS0 + end // 2, TS0 + end + 5):
        assert await leader.offset_for_time(0, ts) == await follower.offset_for_time(0, ts)
    for epoch in range(0, 8):
        assert leader.end_offset_for_epoch(0, epoch) == follower.end_offset_for_epoch(0, epoch)


async def _scenario(root: Path, steps: list[tuple[str, float]], engine: str = "segment") -> None:
    paths = {"a": root / "a", "b": root / "b"}
    stores = {n: await seglog.open(p) for n, p in paths.items()}
    dbs = {n: await s.create_db("r", shards=1, engine=engine, segment_bytes=16384) for n, s in stores.items()}
    epoch = 0
    bump = False
    counter = 0
    try:
        for op, arg in steps:
            leader, follower = dbs["a"], dbs["b"]
            if op == "append":
                if bump:
                    epoch += 1
                    bump = False
                n = int(arg)
                recs = [
                    seglog.Record(
                        topic=f"t/{i % 5}",
                        value=b"v%d" % (counter + i),
                        key=b"k%d" % ((counter + i) % 13),
                        ts=TS0 + leader.end_offset(0) + i,
                    )
                    for i in range(n)
                ]
                counter += n
                batch = seglog.record.records_to_batch(recs)
                await leader.append_arrow(batch, shard=0, leader_epoch=epoch)
            elif op in ("truncate_leader", "truncate_follower"):
                db = leader if op == "truncate_leader" else follower
                target = int(db.start_offset(0) + arg * (db.end_offset(0) - db.start_offset(0)))
                await db.truncate_to(0, target, force=True)
                if op == "truncate_leader":
                    bump = True  # a leader that lost records comes back with a new epoch
            elif op == "sync":
                await _sync(leader, follower)
                await _check_same(leader, follower)
            elif engine != "memory":  # a memory database comes back empty: nothing to check
                for n in stores:
                    await stores[n].close()
                    stores[n] = await seglog.open(paths[n])
                    dbs[n] = await stores[n].open_db("r")
        await _sync(dbs["a"], dbs["b"])
        await _check_same(dbs["a"], dbs["b"])
    finally:
        for s in stores.values():
            await s.close()


@pytest.mark.parametrize("engine", ["segment", "lmdb", "memory"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_step, min_size=1, max_size=25))
def test_follower_holds_the_leaders_bytes_after_any_history(
    engine: str, steps: list[tuple[str, float]]
) -> None:
    root = Path(tempfile.mkdtemp(prefix="seglog-replica-"))
    try:
        asyncio.run(_scenario(root, steps, engine))
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_follower_catches_up_after_both_stores_were_killed(tmp_path: Path, seed: int) -> None:
    """The same history in a child process, SIGKILLed at a random step (no close, no
    checkpoint): after reopening both stores, one catch-up makes them agree again."""
    rng = random.Random(seed)
    kill_after = rng.randint(5, 40)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.replica_property_child", str(tmp_path), str(seed), "60", "segment"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        for _ in range(kill_after):
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else "child died"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL

    async def verify() -> None:
        a = await seglog.open(tmp_path / "a")
        b = await seglog.open(tmp_path / "b")
        try:
            leader, follower = await a.open_db("r"), await b.open_db("r")
            await _sync(leader, follower)
            await _check_same(leader, follower)
        finally:
            await a.close()
            await b.close()

    asyncio.run(verify())
