"""Rows buffered from many-shard appends and the read of frames (the network fetch path).

* An idle store writes buffered rows into their segments once ``buffer_ms`` passed (the I/O
  worker keeps that deadline across its idle flushes).
* ``read_frames`` of a shard with buffered rows flushes them first, together with the
  buffered rows of the other shards read lately (a consumer tailing every shard), and
  concurrent reads share that flush; an append writes the rows of shards read lately into
  their segments at once; shards nobody reads keep their rows buffered.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import seglog
from seglog.record import decode_frames

SHARDS = 8


def _engine(db: Any) -> Any:
    return db._engine  # white box: which shards still hold buffered rows


def _buffered(db: Any) -> set[int]:
    return {s for s in range(SHARDS) if _engine(db)._shards[s].has_pending}


async def _append_keyed(db: Any, tag: int, n: int = 64) -> dict[int, list[bytes]]:
    recs = [seglog.Record(topic="m", value=b"%d-%d" % (tag, i), key=b"dev-%d" % i) for i in range(n)]
    res = await db.append(recs)
    out: dict[int, list[bytes]] = {}
    for meta, rec in zip(res, recs, strict=True):
        out.setdefault(meta.shard, []).append(rec.value)
    return out


def test_idle_store_flushes_buffered_rows_after_buffer_ms(run, data_dir: Path) -> None:
    async def main() -> None:
        # Longer than the worker's idle flush interval (100 ms): that flush must not forget it.
        async with seglog.open(data_dir, io_workers=1, buffer_ms=300) as store:
            db = await store.create_db("t", shards=SHARDS)
            await _append_keyed(db, 0)
            assert _buffered(db), "the append never took the buffered path"
            deadline = time.monotonic() + 10
            while _buffered(db) and time.monotonic() < deadline:
                await asyncio.sleep(0.02)  # nothing else happens: the worker's own deadline flushes
            assert not _buffered(db), "buffered rows stayed out of the segments while idle"

    run(main())


def test_read_frames_flushes_the_tailed_shards_together(run, data_dir: Path) -> None:
    async def main() -> None:
        async with seglog.open(data_dir, io_workers=1, buffer_ms=3_600_000) as store:
            db = await store.create_db("t", shards=SHARDS)
            expected = await _append_keyed(db, 0)
            tailed = sorted(expected)[: SHARDS // 2]
            quiet = sorted(expected)[SHARDS // 2 :]
            for s in tailed:  # a consumer reads these shards from the start
                table = decode_frames(await db.read_frames(s, 0))
                assert table.column("value").to_pylist() == expected[s]
            assert _buffered(db) == set(quiet)  # read shards were flushed, the others wait

            more = await _append_keyed(db, 1)
            # The append itself wrote the tailed shards' rows into their segments (their
            # readers' next poll reads frames); the quiet shards' rows wait.
            assert _buffered(db) == set(quiet) & (set(expected) | set(more))
            first = tailed[0]
            got = decode_frames(await db.read_frames(first, len(expected[first])))
            assert got.column("value").to_pylist() == more[first]

            # Concurrent reads of every shard (one flush shared): each gets exactly its records.
            again = await _append_keyed(db, 2)
            starts = {s: len(expected.get(s, [])) + len(more.get(s, [])) for s in range(SHARDS)}
            frames = await asyncio.gather(*(db.read_frames(s, starts[s]) for s in range(SHARDS)))
            for s, data in enumerate(frames):
                values = decode_frames(data, starts[s]).column("value").to_pylist()
                assert values == again.get(s, []), s
            assert not _buffered(db)

    run(main())
