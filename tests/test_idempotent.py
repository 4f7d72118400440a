"""Idempotent appends: producer id, epoch and per-shard sequences in frame headers.

A retried batch is not written twice, on every engine, after a reopen (the state is rebuilt
from the frame headers) and on a replica that got the frames byte for byte (a failover).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

import seglog
from seglog.errors import InvalidArgument, OutOfOrderSequence, ProducerFenced
from seglog.record import encode_frame, parse_header, records_to_batch
from seglog.segment.producer_state import RUNS_KEPT, UNKNOWN_OFFSET, ProducerStamp, ShardProducers

TS0 = 1_700_000_000_000_000
ENGINES = ["segment", "lmdb", "memory"]
DURABLE = ["segment", "lmdb"]


def _table(n: int, start: int = 0, *, tag: str = "v") -> pa.Table:
    return pa.table(
        {
            "ts": pa.array([TS0 + i for i in range(start, start + n)], pa.int64()),
            "topic": [f"dev/{i % 5}/t" for i in range(start, start + n)],
            "key": [b"k%d" % (i % 11) for i in range(start, start + n)],
            "value": [f"{tag}-{i}".encode() for i in range(start, start + n)],
        }
    )


def _stamp(pid: int, seqs: dict[int, int], epoch: int = 0) -> ProducerStamp:
    return ProducerStamp(pid, epoch, seqs)


async def _values(db: seglog.Database, shard: int) -> list[bytes]:
    out: list[bytes] = []
    offset = db.start_offset(shard)
    while offset < db.end_offset(shard):
        t = await db.read_arrow(shard, offset, 10_000)
        out.extend(t.column("value").to_pylist())
        offset = t.column("offset")[-1].as_py() + 1
    return out


# --- the rules ---------------------------------------------------------------------------


def test_rules_new_duplicate_partial_out_of_order() -> None:
    t = ShardProducers()
    assert t.check(7, 0, 0, 10).skip == 0  # unknown producer: new
    t.record(7, 0, 0, 10, 100)
    assert t.check(7, 0, 10, 5).skip == 0  # continues
    dup = t.check(7, 0, 0, 10)
    assert (dup.skip, dup.stored) == (10, [(100, 10)])
    part = t.check(7, 0, 4, 10)  # rows 4..9 stored, 10..13 new
    assert (part.skip, part.stored) == (6, [(104, 6)])
    with pytest.raises(OutOfOrderSequence) as info:
        t.check(7, 0, 11, 3)
    assert (info.value.expected, info.value.got) == (10, 11)
    t.record(7, 0, 10, 5, 300)  # another producer wrote in between: offsets jump
    across = t.check(7, 0, 8, 4)
    assert (across.skip, across.stored) == (4, [(108, 2), (300, 2)])


def test_rules_epochs_and_forgotten_runs() -> None:
    t = ShardProducers()
    t.record(1, 3, 0, 1, 0)
    with pytest.raises(ProducerFenced):
        t.check(1, 2, 1, 1)
    with pytest.raises(OutOfOrderSequence):
        t.check(1, 4, 5, 1)  # a new epoch starts at 0
    assert t.check(1, 4, 0, 1).skip == 0
    for i in range(1, RUNS_KEPT + 5):
        t.record(1, 3, i, 1, 10 * i)  # non-contiguous offsets: one run each
    old = t.check(1, 3, 0, 3)
    assert old.skip == 3 and old.stored[0][0] == UNKNOWN_OFFSET
    assert sum(k for _, k in old.stored) == 3


def test_rebuilt_from_headers_like_the_appends_left_it() -> None:
    batch = records_to_batch([seglog.Record("a/b", b"x", ts=TS0 + i) for i in range(4)])
    frames = [
        encode_frame(batch, 0, producer=(5, 0, 0)),
        encode_frame(batch, 4),  # no producer
        encode_frame(batch, 8, producer=(5, 0, 4)),
        encode_frame(batch, 12, producer=(6, 1, 0)),
    ]
    headers = [parse_header(b"".join(bytes(b) for b in f.buffers)) for f in frames]
    t = ShardProducers.from_headers(headers)
    assert (t.last_sequence(5), t.last_sequence(6), t.last_sequence(9)) == (7, 3, None)
    assert t.check(5, 0, 2, 4).stored == [(2, 2), (8, 2)]


# --- databases ---------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_retry_is_not_written_twice(tmp_path: Path, engine: str) -> None:
    async def run() -> None:
        async with seglog.open(tmp_path / "s") as store:
            db = await store.create_db("d", shards=4, engine=engine)
            t = _table(40)
            shards = [db.shard_for(k) for k in t.column("key").to_pylist()]
            with pytest.raises(InvalidArgument, match="sequences name shards"):
                await db.append_arrow(t, producer=_stamp(9, {0: 0}))
            assert [db.end_offset(s) for s in range(4)] == [0, 0, 0, 0]
            firsts = {s: 0 for s in set(shards)}
            first = await db.append_arrow(t, producer=_stamp(9, firsts))
            ends = [db.end_offset(s) for s in range(4)]
            again = await db.append_arrow(t, producer=_stamp(9, firsts))  # the retry
            assert again.to_pydict() == first.to_pydict()
            assert [db.end_offset(s) for s in range(4)] == ends
            # The next batch continues each shard's numbering.
            t2 = _table(40, 40)
            shards2 = [db.shard_for(k) for k in t2.column("key").to_pylist()]
            nxt = {s: shards.count(s) for s in set(shards2)}
            await db.append_arrow(t2, producer=_stamp(9, nxt))
            values = sorted([v for s in range(4) for v in await _values(db, s)])
            assert values == sorted(f"v-{i}".encode() for i in range(80))

    asyncio.run(run())


@pytest.mark.parametrize("engine", ENGINES)
def test_partial_retry_writes_only_the_new_rows(tmp_path: Path, engine: str) -> None:
    async def run() -> None:
        async with seglog.open(tmp_path / "s") as store:
            db = await store.create_db("d", shards=1, engine=engine)
            await db.append_arrow(_table(10), producer=_stamp(3, {0: 0}))
            await db.append_arrow(_table(5, tag="other"))  # another writer in between
            # Rows 6..9 were stored, 10..14 were not: a regrouped retry carries both.
            out = await db.append_arrow(_table(9, 6), producer=_stamp(3, {0: 6}))
            assert out.column("offset").to_pylist() == [6, 7, 8, 9, 15, 16, 17, 18, 19]
            expected = [f"v-{i}".encode() for i in range(10)]
            expected += [f"other-{i}".encode() for i in range(5)]
            expected += [f"v-{i}".encode() for i in range(10, 15)]
            assert await _values(db, 0) == expected
            with pytest.raises(OutOfOrderSequence):
                await db.append_arrow(_table(2, 20), producer=_stamp(3, {0: 20}))
            with pytest.raises(ProducerFenced):
                await db.append_arrow(_table(1, 30), producer=_stamp(3, {0: 0}, epoch=1))
                await db.append_arrow(_table(1, 31), producer=_stamp(3, {0: 15}, epoch=0))
            assert db.end_offset(0) == 21  # the refused batches wrote nothing

    asyncio.run(run())


@pytest.mark.parametrize("engine", DURABLE)
def test_state_is_rebuilt_from_the_log_after_reopen(tmp_path: Path, engine: str) -> None:
    async def run() -> None:
        async with seglog.open(tmp_path / "s") as store:
            db = await store.create_db("d", shards=2, engine=engine)
            await db.append_arrow(_table(3, tag="before"), shard=1)
            first = await db.append_arrow(_table(30), shard=1, producer=_stamp(4, {1: 0}))
        async with seglog.open(tmp_path / "s") as store:
            db = await store.open_db("d")
            assert db._producers.known(1) is None  # nothing in memory: only the log knows
            again = await db.append_arrow(_table(30), shard=1, producer=_stamp(4, {1: 0}))
            assert again.column("offset").to_pylist() == first.column("offset").to_pylist()
            assert db.end_offset(1) == 33
            with pytest.raises(OutOfOrderSequence):
                await db.append_arrow(_table(1, 40), shard=1, producer=_stamp(4, {1: 40}))

    asyncio.run(run())


@pytest.mark.parametrize("engine", ENGINES)
def test_a_replica_that_takes_over_knows_the_producers(tmp_path: Path, engine: str) -> None:
    """Frames shipped byte for byte carry the producer fields: the new leader drops the retry."""

    async def run() -> None:
        async with seglog.open(tmp_path / "a") as a, seglog.open(tmp_path / "b") as b:
            leader = await a.create_db("d", shards=1, engine=engine)
            follower = await b.create_db("d", shards=1, engine=engine)
            await follower.append_arrow(_table(2, tag="x"), producer=_stamp(8, {0: 0}))
            await follower.truncate_to(0, 0, force=True)  # forgets what it had
            first = await leader.append_arrow(_table(25), producer=_stamp(8, {0: 0}))
            frames = await leader.read_frames(0, 0, 1 << 20)
            await follower.append_frames(0, frames, expected_base=0)
            # The producer's ack was lost; it retries on the new leader.
            again = await follower.append_arrow(_table(25), producer=_stamp(8, {0: 0}))
            assert again.to_pydict() == first.to_pydict()
            assert follower.end_offset(0) == 25
            nxt = await follower.append_arrow(_table(5, 25), producer=_stamp(8, {0: 25}))
            assert nxt.column("offset").to_pylist() == [25, 26, 27, 28, 29]

    asyncio.run(run())


@pytest.mark.parametrize("engine", ENGINES)
def test_concurrent_retries_of_one_batch_store_it_once(tmp_path: Path, engine: str) -> None:
    async def run() -> None:
        async with seglog.open(tmp_path / "s") as store:
            db = await store.create_db("d", shards=3, engine=engine)
            t = _table(50)
            seqs = {s: 0 for s in {db.shard_for(k) for k in t.column("key").to_pylist()}}
            others = [db.append_arrow(_table(10, 100 + 10 * i, tag="o")) for i in range(5)]
            outs = await asyncio.gather(
                *(db.append_arrow(t, producer=_stamp(2, seqs)) for _ in range(6)), *others
            )
            assert all(o.to_pydict() == outs[0].to_pydict() for o in outs[:6])
            assert sum(db.end_offset(s) for s in range(3)) == 50 + 50

    asyncio.run(run())


_CHILD = """
import asyncio, sys
import pyarrow as pa
import seglog
from seglog import ProducerStamp
from tests.test_idempotent import _table

async def main(path):
    store = await seglog.open(path, buffer_ms=600_000)  # rows stay in the journal, not the segments
    db = await store.create_db("d", shards=4)
    t = _table(60)
    shards = {db.shard_for(k) for k in t.column("key").to_pylist()}
    out = await db.append_arrow(t, producer=ProducerStamp(11, 0, {s: 0 for s in shards}))
    print("ACKED", ",".join(f"{s}:{o}" for s, o in zip(out.column("shard").to_pylist(), out.column("offset").to_pylist())), flush=True)
    await asyncio.Event().wait()

asyncio.run(main(sys.argv[1]))
"""


def test_buffered_producer_rows_survive_sigkill_with_their_producer(tmp_path: Path) -> None:
    """Idempotent rows acknowledged from the journal (not yet in a segment) are replayed at
    open into frames that carry their producer fields, so the retry is still dropped."""
    root = Path(__file__).resolve().parents[1]
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(tmp_path / "s")],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()  # blocks until the append is acknowledged
        assert line.startswith("ACKED "), line
        acked = [tuple(map(int, x.split(":"))) for x in line.split()[1].split(",")]
        journal = tmp_path / "s" / "dbs" / "d" / "journal"
        assert any(p.stat().st_size for p in journal.iterdir())
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()

    async def run() -> None:
        async with seglog.open(tmp_path / "s") as store:
            db = await store.open_db("d")
            ends = [db.end_offset(s) for s in range(4)]
            assert sum(ends) == 60
            t = _table(60)
            shards = {db.shard_for(k) for k in t.column("key").to_pylist()}
            again = await db.append_arrow(t, producer=_stamp(11, {s: 0 for s in shards}))
            assert (
                list(zip(again.column("shard").to_pylist(), again.column("offset").to_pylist(), strict=True))
                == acked
            )
            assert [db.end_offset(s) for s in range(4)] == ends
            frames = b"".join([await db.read_frames(s, 0, 1 << 20) for s in range(4) if ends[s]])
            pos, seen = 0, 0
            while pos < len(frames):
                h = parse_header(frames, pos)
                assert h.producer_id == 11
                seen += h.record_count
                pos += h.size
            assert seen == 60

    asyncio.run(run())


@pytest.mark.parametrize("engine", ENGINES)
def test_partial_retry_over_many_shards(tmp_path: Path, engine: str) -> None:
    """A regrouped retry: each shard holds the first rows of its part, the rest is new."""

    async def run() -> None:
        async with seglog.open(tmp_path / "s") as store:
            db = await store.create_db("d", shards=3, engine=engine)
            full = _table(90)
            shard_of = [db.shard_for(k) for k in full.column("key").to_pylist()]
            first = full.slice(0, 40)
            out1 = await db.append_arrow(first, producer=_stamp(5, dict.fromkeys(set(shard_of[:40]), 0)))
            await db.append_arrow(_table(7, tag="other"))  # other writers move the ends
            out = await db.append_arrow(full, producer=_stamp(5, dict.fromkeys(set(shard_of), 0)))
            assert out.slice(0, 40).to_pydict() == out1.to_pydict()  # the stored rows: first offsets
            again = await db.append_arrow(full, producer=_stamp(5, dict.fromkeys(set(shard_of), 0)))
            assert again.to_pydict() == out.to_pydict()
            for s in range(3):
                mine = [f"v-{i}".encode() for i in range(90) if shard_of[i] == s]
                assert [v for v in await _values(db, s) if v.startswith(b"v-")] == mine
            # Every row's offset holds that row.
            for i, (s, o) in enumerate(
                zip(out.column("shard").to_pylist(), out.column("offset").to_pylist(), strict=True)
            ):
                got = await db.read_arrow(s, o, 1)
                assert got.column("value")[0].as_py() == f"v-{i}".encode()

    asyncio.run(run())


def test_reply_runs_per_shard_in_first_appearance_order_break_at_gaps_and_unplaceable_rows() -> None:
    # The idempotent produce reply: per shard (in the order the request's rows first name
    # them), runs of consecutive offsets in row order; a row too old to place (-1) starts a run.
    import numpy as np

    from seglog.cluster.produce import reply_runs

    shards = np.array([3, 3, 1, 3, 1, 1, 3, 0, 3, 3], np.int32)
    offsets = np.array([10, 11, 5, 12, -1, 7, -1, 0, 20, 21], np.int64)
    assert reply_runs(shards, offsets) == [
        {"shard": 3, "base_offset": 10, "count": 3},
        {"shard": 3, "base_offset": -1, "count": 1},
        {"shard": 3, "base_offset": 20, "count": 2},
        {"shard": 1, "base_offset": 5, "count": 1},
        {"shard": 1, "base_offset": -1, "count": 1},
        {"shard": 1, "base_offset": 7, "count": 1},
        {"shard": 0, "base_offset": 0, "count": 1},
    ]
    one = np.zeros(5, np.int32)
    assert reply_runs(one, np.arange(40, 45)) == [{"shard": 0, "base_offset": 40, "count": 5}]
    assert reply_runs(np.empty(0, np.int32), np.empty(0, np.int64)) == []
