"""Records read back through ``read``, ``read_key`` and ``tail`` are exactly the ones appended.

These pin the public behaviour of :class:`seglog.Record` objects built from read tables: every
field's value *and* type (``key=None`` vs ``b""``, ``headers=None`` vs ``{}``), the assigned
``ts``, ``shard`` and ``offset``, equality, ``repr``, unhashability and mutability, on every
engine and on both sides of the size above which ``read`` converts off the event loop.
"""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import pyarrow as pa
import pytest

import seglog
from seglog.db import _INLINE_RECORDS_MAX
from seglog.record import Record, records_from_table

ENGINES = ["segment", "memory", "lmdb"]


def _mixed_records(n: int) -> list[Record]:
    """Records cycling through every distinct shape of the optional fields."""
    shapes: list[tuple[bytes | None, dict[str, bytes] | None]] = [
        (None, None),
        (b"", None),
        (b"k", {}),
        (None, {"a": b"", "content-type": b"json"}),
        (b"\x00\xff" * 20, {"x": b"1"}),
        (b"dev", None),
    ]
    out = []
    for i in range(n):
        key, headers = shapes[i % len(shapes)]
        out.append(
            Record(
                topic=f"sensors/é{i % 13}/t",
                value=b"" if i % 17 == 0 else bytes([i % 256]) * (1 + i % 300),
                ts=None if i % 5 == 0 else -(1 << 63) + i if i % 7 == 0 else 1_700_000_000_000_000 + i,
                key=key,
                headers=None if headers is None else dict(headers),
            )
        )
    return out


def _expected(recs: list[Record], metas: list[seglog.RecordMeta]) -> list[Record]:
    return [
        Record(r.topic, r.value, ts=m.ts, key=r.key, headers=r.headers, shard=m.shard, offset=m.offset)
        for r, m in zip(recs, metas, strict=True)
    ]


def _assert_identical(got: list[Record], want: list[Record]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert type(g) is Record
        assert g == w
        assert (g != w) is False
        assert repr(g) == repr(w)
        for name in Record.__slots__:
            gv, wv = getattr(g, name), getattr(w, name)
            assert type(gv) is type(wv), (name, g, w)
            assert gv == wv, (name, g, w)


@pytest.mark.parametrize("engine", ENGINES)
def test_records_read_back_identical(run, data_dir: Path, engine: str) -> None:
    n = _INLINE_RECORDS_MAX + 1500  # one read below and one above the off-loop threshold

    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db(
                "t", shards=2, engine=engine, compression="zstd", min_ts_us=None, max_ts_us=None
            )
            recs = _mixed_records(n)
            metas: list[seglog.RecordMeta] = []
            for i in range(0, n, 1000):
                metas.extend(await db.append(recs[i : i + 1000], shard=1))
            assert [m.offset for m in metas] == list(range(n))
            want = _expected(recs, metas)
            assert all(m.ts == r.ts for r, m in zip(recs, metas, strict=True) if r.ts is not None)

            _assert_identical(await db.read(1, 0, n), want)  # off the loop
            _assert_identical(await db.read(1, 3, 1000), want[3:1003])  # inline
            _assert_identical(await db.read(1, n - 1, 10), want[n - 1 :])
            assert await db.read(1, n) == []
            assert await db.read(0, 0) == []

            _assert_identical(await db.read_key(1, b""), [w for w in want if w.key == b""])
            _assert_identical(await db.read_key(1, b"dev"), [w for w in want if w.key == b"dev"])

            got: list[Record] = []
            tail = db.tail(1, n - 2500, batch_records=700)
            async for rec in tail:
                got.append(rec)
                if len(got) == 2500:
                    break
            await tail.aclose()
            _assert_identical(got, want[n - 2500 :])

            # Read-back records behave like constructed ones.
            r = (await db.read(1, 1, 1))[0]
            with pytest.raises(TypeError):
                hash(r)
            assert not hasattr(r, "__dict__")
            r.ts = 5
            r.headers = {}
            assert r == Record(r.topic, r.value, ts=5, key=b"", headers=None, shard=1, offset=1)
            assert r != want[1] and r != (r.topic, r.value)
            # A read-back record appends like any other (its shard attribute routes it).
            meta = (await db.append([r]))[0]
            assert (meta.shard, meta.offset, meta.ts) == (1, n, 5)

    run(main())


def test_records_from_table_sliced_chunked_and_nullable() -> None:
    """Any read-shaped table converts like ``to_pylist`` would, whatever its chunking."""
    from seglog.engines.base import READ_SCHEMA

    rows = {
        "offset": [7, 8, 9, 10, 11],
        "ts": [1, -(1 << 63), (1 << 63) - 1, 0, 4],
        "topic": ["a", "é", "a/b", "c", "a"],
        "key": [None, b"", b"k", None, b"\x00"],
        "value": [b"", b"v", b"\x00" * 3, b"w", b"x"],
        "headers": [None, [], [("h", b"1"), ("g", b"")], None, [("z", b"")]],
        "stream": [0, 0, 0, 0, 0],
    }
    table = pa.Table.from_pydict(rows, schema=READ_SCHEMA)
    chunked = pa.concat_tables([table.slice(0, 2), table.slice(2)])
    assert chunked.column("topic").num_chunks == 2
    for t in (table, chunked):
        got = records_from_table(t, 3)
        assert [(r.offset, r.ts, r.topic, r.key, r.value, r.headers, r.shard) for r in got] == [
            (7, 1, "a", None, b"", None, 3),
            (8, -(1 << 63), "é", b"", b"v", {}, 3),
            (9, (1 << 63) - 1, "a/b", b"k", b"\x00" * 3, {"h": b"1", "g": b""}, 3),
            (10, 0, "c", None, b"w", None, 3),
            (11, 4, "a", b"\x00", b"x", {"z": b""}, 3),
        ]
        sliced = records_from_table(t.slice(1, 3), 0)
        assert [r.offset for r in sliced] == [8, 9, 10] and sliced[0].headers == {}
        assert records_from_table(t.slice(5), 0) == []
    assert records_from_table(READ_SCHEMA.empty_table(), 0) == []


@pytest.mark.parametrize("initially_enabled", [True, False])
def test_bulk_conversion_leaves_the_garbage_collector_as_it_was(
    run, data_dir: Path, initially_enabled: bool
) -> None:
    """Large conversions pause the cyclic GC; concurrent ones (on threads) restore it exactly."""

    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", shards=1, engine="memory", min_ts_us=None, max_ts_us=None)
            for _ in range(0, 20_000, 2000):
                await db.append(_mixed_records(2000), shard=0)
            was = gc.isenabled()
            (gc.enable if initially_enabled else gc.disable)()
            try:
                results = await asyncio.gather(*(db.read(0, o, 6000) for o in range(0, 20_000, 1000)))
                assert gc.isenabled() is initially_enabled
                assert [len(r) for r in results] == [min(6000, 20_000 - o) for o in range(0, 20_000, 1000)]
                table = await db.read_arrow(0, 0, 5000)
                await asyncio.gather(*(asyncio.to_thread(records_from_table, table, 0) for _ in range(8)))
                assert gc.isenabled() is initially_enabled
            finally:
                (gc.enable if was else gc.disable)()

    run(main())


def _read_table(n: int) -> pa.Table:
    from seglog.engines.base import READ_SCHEMA

    return pa.Table.from_pydict(
        {
            "offset": list(range(n)),
            "ts": list(range(n)),
            "topic": [f"t/{i}" for i in range(n)],
            "key": [None] * n,
            "value": [b"v"] * n,
            "headers": [None if i % 2 else [("h", b"1")] for i in range(n)],
            "stream": [0] * n,
        },
        schema=READ_SCHEMA,
    )


def test_bulk_conversion_files_records_in_the_oldest_generation() -> None:
    """A large conversion leaves its records in generation 2, so holding them while the
    application allocates never promotes them through the young generations (which would count
    toward CPython's full-collection trigger); cyclic garbage the application made before the
    read is still collected, not swept into the old generation with them."""
    table = _read_table(2000)
    was = gc.isenabled()
    gc.enable()
    try:
        collected: list[str] = []

        class Cycle:
            def __init__(self) -> None:
                self.me = self

            def __del__(self) -> None:
                collected.append("cycle")

        gc.collect()
        Cycle()  # unreachable at once, but only the cyclic collector can free it
        records = records_from_table(table, 0)
        assert collected == ["cycle"]
        oldest = {id(o) for o in gc.get_objects(generation=2)}
        assert all(id(r) in oldest for r in records)
        # Header dicts (str -> bytes) are not even tracked by CPython; if they were, they would be here.
        headers = [r.headers for r in records if r.headers is not None]
        assert headers and all(id(h) in oldest for h in headers if gc.is_tracked(h))
        assert gc.isenabled() and gc.get_freeze_count() == 0
        # Below the pause threshold nothing is moved: the records start young like any object.
        few = records_from_table(table.slice(0, 10), 0)
        assert not any(id(r) in {id(o) for o in gc.get_objects(generation=2)} for r in few)
    finally:
        (gc.enable if was else gc.disable)()


def test_bulk_conversion_keeps_an_application_freeze() -> None:
    """An application that froze its objects (``gc.freeze()`` before ``fork``) keeps them frozen."""
    table = _read_table(2000)
    was = gc.isenabled()
    gc.enable()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        assert frozen > 0
        records = records_from_table(table, 0)
        after = gc.get_freeze_count()
        # Not one of the 2,000 records (or their lists) was frozen, and the application's
        # objects were not unfrozen (that would empty the permanent generation). Frozen
        # objects that other threads of the suite free meanwhile leave it: a few, not all.
        assert frozen - 1000 <= after <= frozen, (frozen, after)
        assert len(records) == 2000 and gc.isenabled()
    finally:
        gc.unfreeze()
        (gc.enable if was else gc.disable)()


def test_bulk_conversion_does_not_collect_when_the_application_disabled_the_collector() -> None:
    table = _read_table(2000)
    was = gc.isenabled()
    gc.disable()
    try:
        collected: list[str] = []

        class Cycle:
            def __init__(self) -> None:
                self.me = self

            def __del__(self) -> None:
                collected.append("cycle")

        Cycle()
        assert len(records_from_table(table, 0)) == 2000
        assert collected == [] and not gc.isenabled()
        gc.collect()
        assert collected == ["cycle"]
    finally:
        (gc.enable if was else gc.disable)()


@pytest.mark.parametrize("engine", ENGINES)
def test_read_converts_on_the_thread_that_read_the_table(run, data_dir: Path, engine: str) -> None:
    """``read_arrow_then`` hands ``then`` the table ``read_arrow`` would return, on the read
    thread (not the event loop), and its errors reach the caller; ``read`` goes through it."""
    import threading

    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", shards=1, engine=engine, min_ts_us=None, max_ts_us=None)
            recs = _mixed_records(3000)
            for i in range(0, 3000, 1000):
                await db.append(recs[i : i + 1000], shard=0)
            eng = db._engine
            loop_thread = threading.get_ident()
            seen: list[tuple[int, pa.Table]] = []

            def then(table: pa.Table) -> int:
                seen.append((threading.get_ident(), table))
                return table.num_rows

            assert await eng.read_arrow_then(0, 10, 2500, then) == 2500
            assert await eng.read_arrow_then(0, 10, 2500, then, upper=20) == 10
            want = await eng.read_arrow(0, 10, 2500)
            assert seen[0][1].equals(want)
            assert all(ident != loop_thread for ident, _ in seen)

            def boom(table: pa.Table) -> None:
                raise seglog.errors.InvalidArgument("from then")

            with pytest.raises(seglog.errors.InvalidArgument, match="from then"):
                await eng.read_arrow_then(0, 0, 10, boom)
            with pytest.raises(seglog.errors.OffsetOutOfRange):
                await eng.read_arrow_then(0, 3001, 10, then)
            # ``read`` (small and large) is the same records either way.
            got = await db.read(0, 0, 3000)
            assert [(r.topic, r.value, r.key, r.headers, r.offset, r.shard) for r in got] == [
                (r.topic, r.value, r.key, r.headers, i, 0) for i, r in enumerate(recs)
            ]
            assert await db.read(0, 5, 1, upper=5) == []

    run(main())
