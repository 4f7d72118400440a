"""Read-only following of a shard: in-process API tests and a cross-process CLI test."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import IO, Any, TypeVar

import pyarrow as pa
import pytest

import seglog
from seglog.errors import (
    BusyResourceError,
    DatabaseNotFound,
    InvalidArgument,
    InvalidName,
    OffsetOutOfRange,
    StorageError,
)
from tests.helpers import T0, make_records, segment_files

T = TypeVar("T")
Run = Callable[[Coroutine[Any, Any, T]], T]
SEGLOG = str(Path(sys.executable).parent / "seglog")
WAIT_S = 60.0


async def _next_rows(it: Any, want: int) -> list[int]:
    """Offsets of the next ``want`` rows the follower delivers."""
    got: list[int] = []
    while len(got) < want:
        table: pa.Table = await asyncio.wait_for(it.__anext__(), WAIT_S)
        got.extend(table.column("offset").to_pylist())
    return got


def test_follows_appends_across_segment_rolls(data_dir: Path, run: Run[None]) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:  # this process holds the lock
            db = await store.create_db("f", 1, segment_bytes=4096)
            await db.append(make_records(300), shard=0)
            async with seglog.follow(data_dir, "f", 0, offset=120, poll_interval_ms=5) as follower:
                it = follower.batches()
                assert await _next_rows(it, 180) == list(range(120, 300))
                for start in range(300, 900, 50):  # roll several segments while following
                    await db.append(make_records(50, start=start), shard=0)
                got = await _next_rows(it, 600)
                assert got == list(range(300, 900))
                assert follower.position == 900
                await it.aclose()
            assert len(segment_files(data_dir, "f", 0)) > 3
            # Values come back exactly.
            async with seglog.follow(data_dir, "f", 0) as again:
                tables = [t async for t in again.batches(stop_at_end=True)]
            values = pa.concat_tables(tables).column("value").to_pylist()
            assert values == [r.value for r in make_records(900)]

    run(main())


def test_from_time_and_groups(data_dir: Path, run: Run[None]) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("f", 1, segment_bytes=4096)
            await db.append(make_records(400), shard=0)  # ts = T0 + 10 * i
            async with seglog.follow(data_dir, "f", 0, from_time_us=T0 + 10 * 250 - 5) as f:
                first = await f.read_available()
                assert first.column("offset")[0].as_py() == 250
                assert first.column("offset")[-1].as_py() == 399
            with pytest.raises(BusyResourceError, match="open in this process"):
                await seglog.follow(data_dir, "f", 0, group="g").open()
        # With no owner (or an owner in another process), a follower commits for its group.
        async with seglog.follow(data_dir, "f", 0, group="g") as f:
            table = await f.read_available()
            assert table.num_rows == 400
            await f.commit(123)
        async with seglog.follow(data_dir, "f", 0, group="g") as f:
            assert f.position == 123
            with pytest.raises(InvalidArgument):
                await f.commit(-1)
        async with seglog.follow(data_dir, "f", 0) as f:
            with pytest.raises(InvalidArgument, match="no group"):
                await f.commit(5)
        async with seglog.open(data_dir) as store:
            db = await store.open_db("f")
            assert await db.committed("g", 0) == 123

    run(main())


def test_followers_of_several_shards_share_the_group_store(data_dir: Path, run: Run[None]) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("f", 2)
            await db.append(make_records(10), shard=0)
            await db.append(make_records(10), shard=1)
        # LMDB allows one handle per environment per process: the followers share it.
        async with (
            seglog.follow(data_dir, "f", 0, group="g") as f0,
            seglog.follow(data_dir, "f", 1, group="g") as f1,
        ):
            await f0.commit(4)
            await f1.commit(7)
        async with seglog.follow(data_dir, "f", 1, group="g") as f1:
            assert f1.position == 7
        async with seglog.open(data_dir) as store:
            db = await store.open_db("f")
            assert [await db.committed("g", s) for s in (0, 1)] == [4, 7]

    run(main())


def test_validation_and_out_of_range(data_dir: Path, run: Run[None]) -> None:
    async def main() -> None:
        with pytest.raises(DatabaseNotFound):
            await seglog.follow(data_dir, "nope", 0).open()
        async with seglog.open(data_dir) as store:
            db = await store.create_db("f", 2, segment_bytes=4096)
            await store.create_db("m", 1, engine="memory")
            await store.create_db("l", 1, engine="lmdb")
            for start in range(0, 200, 20):  # ~2 frames per 4 KiB segment
                await db.append(make_records(20, start=start), shard=0)
            with pytest.raises(DatabaseNotFound):
                await seglog.follow(data_dir, "nope", 0).open()
            # Engines without a cross-process reader are refused by name (the registry says so).
            for name, engine in (("m", "memory"), ("l", "lmdb")):
                with pytest.raises(InvalidArgument) as refused:
                    await seglog.follow(data_dir, name, 0).open()
                assert str(refused.value) == (
                    f"database {name!r} uses the {engine!r} engine; only 'segment' databases "
                    "can be followed from another process"
                )
            with pytest.raises(InvalidArgument, match=r"^shard 2 out of range 0\.\.1$"):
                await seglog.follow(data_dir, "f", 2).open()
            with pytest.raises(InvalidName):
                seglog.follow(data_dir, "../f", 0)
            with pytest.raises(InvalidArgument):
                seglog.follow(data_dir, "f", 0, offset=1, from_time_us=1)
            with pytest.raises(InvalidArgument):
                seglog.follow(data_dir, "f", 0, poll_interval_ms=0)
            with pytest.raises(OffsetOutOfRange):
                await seglog.follow(data_dir, "f", 0, offset=201).open()
            async with seglog.follow(data_dir, "f", 0, offset=200) as f:  # the end is fine
                assert (await f.read_available()).num_rows == 0
            # Retention moves the start past a follower that has not read yet: it still
            # reads the segment it holds open, then finds the next one gone.
            async with seglog.follow(data_dir, "f", 0, offset=0) as behind:
                await db.truncate_before(0, 200)
                await db.append(make_records(10, start=200), shard=0)
                first = await behind.read_available()
                assert 0 < first.num_rows < 200
                assert first.column("offset").to_pylist() == list(range(first.num_rows))
                with pytest.raises(OffsetOutOfRange) as info:
                    await behind.read_available()
                assert info.value.offset == first.num_rows and info.value.start == 200
            with pytest.raises(OffsetOutOfRange):
                await seglog.follow(data_dir, "f", 0, offset=0).open()
            async with seglog.follow(data_dir, "f", 0) as f:
                assert f.position == 200
                assert (await f.read_available()).column("offset").to_pylist() == list(range(200, 210))
            f2 = seglog.follow(data_dir, "f", 0)
            await f2.open()
            await f2.close()
            with pytest.raises(seglog.ClosedResourceError):
                await f2.read_available()

    run(main())


def test_torn_tail_waits_and_sealed_corruption_raises(data_dir: Path, run: Run[None]) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("f", 1, segment_bytes=4096)
            for start in range(0, 300, 30):
                await db.append(make_records(30, start=start), shard=0)
        segs = segment_files(data_dir, "f", 0)
        assert len(segs) > 2
        active = segs[-1]
        os.chmod(active, 0o644)
        with active.open("ab") as fh:  # a torn frame: the owner's next recovery would cut it
            fh.write(b"SGLF" + b"\x01" * 40)
        async with seglog.follow(data_dir, "f", 0) as f:
            rows = [t.num_rows async for t in f.batches(stop_at_end=True)]
            assert sum(rows) == 300  # everything valid, then it waits at the torn frame
            assert f.position == 300
        sealed = segs[0]
        os.chmod(sealed, 0o644)
        with sealed.open("r+b") as fh:
            fh.seek(100)
            b = fh.read(1)
            fh.seek(100)
            fh.write(bytes([b[0] ^ 0xFF]))
        async with seglog.follow(data_dir, "f", 0) as f:
            with pytest.raises(StorageError, match="corrupt"):
                async for _ in f.batches(stop_at_end=True):
                    pass

    run(main())


class _Lines:
    """Lines of a child's stdout, read by a thread so the test can wait with a timeout."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._q: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: IO[bytes]) -> None:
        for line in stream:
            self._q.put(line)
        self._q.put(b"")

    def next(self) -> bytes:
        line = self._q.get(timeout=WAIT_S)
        assert line, "the child closed its output"
        return line

    def take(self, n: int) -> list[bytes]:
        return [self.next() for _ in range(n)]


def _ask(child: subprocess.Popen[bytes], lines: _Lines, command: str) -> str:
    assert child.stdin is not None
    child.stdin.write(command.encode() + b"\n")
    child.stdin.flush()
    return lines.next().decode().strip()


def test_cli_follow_sees_another_process_appends(tmp_path: Path) -> None:
    data = str(tmp_path / "d")
    owner = subprocess.Popen(
        [sys.executable, "-m", "tests.owner_child", data, "live"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=Path(__file__).parent.parent,
    )
    followers: list[subprocess.Popen[bytes]] = []
    try:
        assert owner.stdout is not None
        owner_out = _Lines(owner.stdout)
        assert owner_out.next() == b"ready\n"
        assert _ask(owner, owner_out, "append 100") == "acked 100"
        cmd = [SEGLOG, "consume", data, "live", "--follow", "--format", "raw"]
        follower = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        followers.append(follower)
        assert follower.stdout is not None
        out = _Lines(follower.stdout)
        assert out.take(100) == [b"v%d\n" % i for i in range(100)]
        # New appends in the owner (rolling segments) reach the follower.
        assert _ask(owner, owner_out, "append 250") == "acked 350"
        assert out.take(250) == [b"v%d\n" % i for i in range(100, 350)]
        # Without --follow, a locked store is read read-only up to its end, then exits.
        once = subprocess.run(
            [SEGLOG, "consume", data, "live", "--from", "340", "--format", "json"],
            capture_output=True,
            timeout=WAIT_S,
        )
        assert once.returncode == 0, once.stderr
        assert [json.loads(x)["offset"] for x in once.stdout.splitlines()] == list(range(340, 350))
        # A following group commits as it prints; the owner sees the commits.
        grouped = subprocess.Popen(
            [*cmd, "--group", "g", "--max", "30"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        followers.append(grouped)
        stdout, stderr = grouped.communicate(timeout=WAIT_S)
        assert grouped.returncode == 0, stderr
        assert stdout.splitlines() == [b"v%d" % i for i in range(30)]
        assert _ask(owner, owner_out, "committed g") == "committed g 30"
        grouped = subprocess.Popen([*cmd, "--group", "g"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        followers.append(grouped)
        assert grouped.stdout is not None
        resumed = _Lines(grouped.stdout)
        assert resumed.next() == b"v30\n"
        # The first follower is still live.
        assert _ask(owner, owner_out, "append 5") == "acked 355"
        assert out.take(5) == [b"v%d\n" % i for i in range(350, 355)]
        # Errors are one line and a non-zero exit.
        bad = subprocess.run(
            [SEGLOG, "consume", data, "nope", "--follow"], capture_output=True, timeout=WAIT_S
        )
        assert bad.returncode == 1
        assert bad.stderr.decode().strip().startswith("seglog: error:") and b"Traceback" not in bad.stderr
    finally:
        for p in [*followers, owner]:
            p.kill()
            p.wait(timeout=WAIT_S)


def test_engine_readers_in_the_registry(data_dir: Path, run: Run[None]) -> None:
    from seglog.engines.registry import engine_names, followable_engines, get_engine

    assert followable_engines() == "'segment'"
    assert all(get_engine(n).shard_files is not None for n in engine_names())

    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("f", 2, segment_bytes=4096)
            await db.append(make_records(20), shard=1)
            db_dir = data_dir / "dbs" / "f"
            reader = get_engine("segment").reader(db_dir, 2)
            cursor = reader.open_shard(1)
            try:
                assert (cursor.start_offset(), cursor.durable_end()) == (0, 20)
                cursor.seek(0)
                frames = cursor.read(1 << 20)
                assert [f.header.base_offset for f in frames] == [0] and cursor.next_offset == 20
                assert list(cursor.read(1 << 20)) == []  # caught up: empty, never blocks
            finally:
                cursor.close()
                reader.close()
            files = get_engine("segment").shard_files(db_dir, 2)
            assert [(f.start_offset, f.end_offset) for f in files] == [(0, 0), (0, 20)]

    run(main())
