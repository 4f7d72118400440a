"""seglog embedded, three rows: Record objects (``append``/``read``), Arrow (``append_arrow``)
and Arrow with a key on every record (the key index written with each batch)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from bench.peers import READ_PAGE_RECORDS, PeerContext, PeerUnavailable, Workload

if TYPE_CHECKING:
    from bench.peers import Page

SHARD = 0
DB_NAME = "bench"


class SeglogPeer:
    """seglog opened in-process with ``fsync="always"``, writing ``seglog.Record`` lists."""

    name = "seglog"
    durability = 'fsync="always" (fdatasync per I/O batch before ack)'

    def __init__(self, ctx: PeerContext) -> None:
        self.path = ctx.work_dir / "seglog"
        self.version = "?"
        self.server_pid: int | None = None
        self._stack = contextlib.AsyncExitStack()
        self._db: Any = None
        self._seglog: Any = None

    async def setup(self) -> None:
        """Open the store and create the one-shard database."""
        try:
            import seglog

            open_store = seglog.open
            _ = seglog.Record
        except (ImportError, AttributeError) as exc:
            raise PeerUnavailable(f"seglog core not available yet: {exc}") from exc
        self._seglog = seglog
        self.version = str(getattr(seglog, "__version__", "?"))
        store = await self._stack.enter_async_context(open_store(str(self.path), fsync="always"))
        self._db = await store.create_db(DB_NAME, shards=1, exist_ok=True, compression="none")

    def encode(self, workload: Workload, start: int, stop: int) -> Any:
        """A list of ``seglog.Record``."""
        record = self._seglog.Record
        return [
            record(topic=topic, value=value, ts=ts, key=None)
            for topic, ts, value in zip(
                workload.topics[start:stop],
                workload.ts[start:stop],
                workload.values[start:stop],
                strict=True,
            )
        ]

    async def write_batch(self, batch: Any) -> None:
        """``db.append`` returns once the batch is fsynced."""
        await self._db.append(batch, shard=SHARD)

    async def read_all(self) -> AsyncIterator[Page]:
        """``db.read`` pages from offset 0 until an empty page."""
        offset = 0
        while True:
            records = await self._db.read(SHARD, offset, max_records=READ_PAGE_RECORDS)
            if not records:
                return
            yield [(r.topic, r.ts, r.value) for r in records]
            offset = records[-1].offset + 1

    async def teardown(self) -> None:
        """Close the store."""
        await self._stack.aclose()


class SeglogArrowPeer(SeglogPeer):
    """seglog with Arrow batches in and out (``append_arrow`` / ``read_arrow``)."""

    name = "seglog-arrow"

    def encode(self, workload: Workload, start: int, stop: int) -> Any:
        """A pyarrow Table with ts/topic/key/value columns."""
        import pyarrow as pa

        return pa.table(
            {
                "ts": pa.array(workload.ts[start:stop], pa.int64()),
                "topic": pa.array(workload.topics[start:stop], pa.string()),
                "key": pa.nulls(stop - start, pa.binary()),
                "value": pa.array(workload.values[start:stop], pa.binary()),
            }
        )

    async def write_batch(self, batch: Any) -> None:
        """``db.append_arrow`` returns once the batch is fsynced."""
        await self._db.append_arrow(batch, shard=SHARD)

    async def read_all(self) -> AsyncIterator[Page]:
        """``db.read_arrow`` tables, left columnar (the runner verifies them untimed)."""
        offset = 0
        while True:
            table = await self._db.read_arrow(SHARD, offset, max_records=READ_PAGE_RECORDS)
            if table.num_rows == 0:
                return
            yield table
            offset = table.column("offset")[-1].as_py() + 1


class SeglogArrowKeyedPeer(SeglogArrowPeer):
    """:class:`SeglogArrowPeer` with a key on every record (``Workload.keys``: the device), so
    each batch also writes the key index; the read-back ends with a ``read_key`` check."""

    name = "seglog-arrow-keyed"

    def __init__(self, ctx: PeerContext) -> None:
        super().__init__(ctx)
        self._expected: tuple[bytes, list[int]] | None = None

    def encode(self, workload: Workload, start: int, stop: int) -> Any:
        """A pyarrow Table with ts/topic/key/value columns, the key set on every row."""
        import pyarrow as pa

        table = super().encode(workload, start, stop)
        if start == 0:
            self._expected = workload.probe_key()  # checked after the reads
        return table.set_column(2, "key", pa.array(workload.keys()[start:stop], pa.binary()))

    async def read_all(self) -> AsyncIterator[Page]:
        """:meth:`SeglogArrowPeer.read_all`, then one ``read_key_arrow`` that must find exactly
        the records written with the first record's key (proof the keys were indexed)."""
        async for page in super().read_all():
            yield page
        assert self._expected is not None
        key, offsets = self._expected
        found = await self._db.read_key_arrow(key, shard=SHARD)
        got = found.column("offset").to_pylist()
        if got != offsets:
            raise RuntimeError(f"read_key({key!r}) found offsets {got[:5]}..., expected {offsets[:5]}...")
