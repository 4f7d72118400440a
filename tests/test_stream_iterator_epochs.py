"""Stream iterators notice a log cut back under them and rewritten under a newer leader epoch (KIP-320)."""

from __future__ import annotations

import asyncio
import struct
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import seglog
from seglog import Iterator
from seglog.errors import InvalidIterator

TS0 = 1_700_000_000_000_000


def records(first: int, n: int, tag: bytes) -> pa.Table:
    i = np.arange(first, first + n)
    return pa.table(
        {
            "ts": pa.array(TS0 + i, pa.int64()),
            "topic": pa.array([f"plant/dev{k % 7}" for k in i.tolist()], pa.string()),
            "value": pa.array([tag + b"%d" % k for k in i.tolist()], pa.binary()),
        }
    )


async def read_to_end(db: seglog.Database, it: Iterator) -> tuple[Iterator, list[tuple[int, bytes]]]:
    got: list[tuple[int, bytes]] = []
    while True:
        it, t = await db.next_arrow(it, 1000)
        if not t.num_rows:
            return it, got
        got += list(zip(t.column("offset").to_pylist(), t.column("value").to_pylist(), strict=True))


def test_an_iterator_goes_on_where_a_failover_cut_the_log_back(tmp_path: Path) -> None:
    """A replica read to offset 100 under epoch 1, was cut back to 60 by its new leader and
    took 80 records of epoch 2 there: a saved iterator reads those 80, not only the 40 past 100."""

    async def main() -> None:
        async with seglog.open(tmp_path / "d") as store:
            db = await store.create_db("e", lts_thresholds=[100, 0])
            for first in range(0, 100, 10):  # frames of 10: the cut at 60 is a frame boundary
                await db.append_arrow(records(first, 10, b"old"), shard=0, leader_epoch=1)
            (stream,) = db.get_streams("plant/#")
            it, got = await read_to_end(db, db.make_iterator(stream, "plant/#"))
            assert [o for o, _ in got] == list(range(100))
            assert (it.position, it.epoch) == (100, 1)
            saved = it.to_bytes()
            assert await db.truncate_to(0, 60, force=True) == 60
            await db.append_arrow(records(60, 80, b"new"), shard=0, leader_epoch=2)
        async with seglog.open(tmp_path / "d") as store:  # and across a restart
            db = await store.open_db("e")
            it, got = await read_to_end(db, Iterator.from_bytes(saved))
            assert [o for o, _ in got] == list(range(60, 140))
            assert all(v.startswith(b"new") for _, v in got)
            assert (it.position, it.epoch) == (140, 2)

    asyncio.run(main())


def test_a_newer_epoch_without_a_cut_reads_nothing_twice(tmp_path: Path) -> None:
    async def main() -> None:
        async with seglog.open(tmp_path / "d") as store:
            db = await store.create_db("e", lts_thresholds=[100, 0])
            await db.append_arrow(records(0, 100, b"a"), shard=0, leader_epoch=1)
            (stream,) = db.get_streams("plant/#")
            it, got = await read_to_end(db, db.make_iterator(stream, "plant/#"))
            await db.append_arrow(records(100, 50, b"b"), shard=0, leader_epoch=2)
            await db.append_arrow(records(150, 50, b"c"), shard=0, leader_epoch=5)
            it, more = await read_to_end(db, it)
            assert [o for o, _ in more] == list(range(100, 200))
            assert it.epoch == 5
            # A standalone log (every frame epoch 0, no epoch entries): the epoch stays unknown.
            plain = await store.create_db("p", lts_thresholds=[100, 0])
            await plain.append_arrow(records(0, 10, b"p"), shard=0)
            (s,) = plain.get_streams("plant/#")
            it, got = await read_to_end(plain, plain.make_iterator(s, "plant/#"))
            assert len(got) == 10 and it.epoch == -1

    asyncio.run(main())


def test_version_2_bytes_read_with_an_unknown_epoch() -> None:
    it = Iterator(9, 1, 2, 3, 40, 50, (None, "x"), generation=4, epoch=7)
    v3 = it.to_bytes()
    # Version 2: the same bytes without the epoch field.
    body = bytearray(v3[:-4])
    body[2] = 2
    del body[44:48]
    v2 = bytes(body) + struct.pack("<I", zlib.crc32(bytes(body)))
    old = Iterator.from_bytes(v2)
    assert old == Iterator(9, 1, 2, 3, 40, 50, (None, "x"), generation=4)
    assert old.epoch == -1
    bad = bytearray(v3[:-4])
    bad[44:48] = struct.pack("<i", -2)
    with pytest.raises(InvalidIterator, match="epoch"):
        Iterator.from_bytes(bytes(bad) + struct.pack("<I", zlib.crc32(bytes(bad))))
