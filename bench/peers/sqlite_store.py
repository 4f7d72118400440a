"""SQLite (stdlib sqlite3): WAL, ``synchronous=FULL``, one transaction + executemany per batch."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from bench.peers import READ_PAGE_RECORDS, PeerContext, Workload

if TYPE_CHECKING:
    from bench.peers import Page

SqlRow = tuple[int, str, int, bytes]


class SqlitePeer:
    """A ``log(seq PRIMARY KEY, topic, ts, value)`` table; each COMMIT fsyncs the WAL."""

    name = "sqlite"
    durability = "journal_mode=WAL, synchronous=FULL, 1 txn per batch"

    def __init__(self, ctx: PeerContext) -> None:
        self.path = ctx.work_dir / "bench.sqlite"
        self.version = f"SQLite {sqlite3.sqlite_version}"
        self.server_pid: int | None = None
        self._conn: sqlite3.Connection | None = None

    async def setup(self) -> None:
        """Create the database and the table."""
        conn = sqlite3.connect(self.path, isolation_level=None)
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode != "wal":
            raise RuntimeError(f"journal_mode is {mode!r}, not WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(
            "CREATE TABLE log (seq INTEGER PRIMARY KEY, topic TEXT NOT NULL, "
            "ts INTEGER NOT NULL, value BLOB NOT NULL)"
        )
        self._conn = conn

    def encode(self, workload: Workload, start: int, stop: int) -> list[SqlRow]:
        """Parameter tuples for executemany."""
        return list(
            zip(
                range(start, stop),
                workload.topics[start:stop],
                workload.ts[start:stop],
                workload.values[start:stop],
                strict=True,
            )
        )

    async def write_batch(self, batch: list[SqlRow]) -> None:
        """BEGIN; executemany INSERT; COMMIT (fsync of the WAL)."""
        assert self._conn is not None
        self._conn.execute("BEGIN")
        self._conn.executemany("INSERT INTO log VALUES (?, ?, ?, ?)", batch)
        self._conn.execute("COMMIT")

    async def read_all(self) -> AsyncIterator[Page]:
        """``SELECT ... ORDER BY seq`` with fetchmany pages."""
        assert self._conn is not None
        cursor = self._conn.execute("SELECT topic, ts, value FROM log ORDER BY seq")
        while page := cursor.fetchmany(READ_PAGE_RECORDS):
            yield page
        cursor.close()

    async def teardown(self) -> None:
        """Close the connection."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
