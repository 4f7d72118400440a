"""The producer's buffers (seglog.client._buffer): ids, acks, the commit file, segments, recovery."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from seglog import _fs
from seglog.client._buffer import (
    COMMIT_NAME,
    ITEM_HEADER_BYTES,
    Buffer,
    DiskBuffer,
    FsyncPolicy,
    MemoryBuffer,
)
from seglog.errors import BusyResourceError, ClosedResourceError, CorruptBuffer, InvalidArgument

MAX = 1 << 20


def _items(n: int, start: int = 0) -> list[bytes]:
    return [f"item-{i:04d}-".encode() * (1 + i % 3) for i in range(start, start + n)]


def _segments(path: Path) -> list[Path]:
    return sorted(path.glob("*.seg"))


@pytest.fixture(params=["memory", "disk"])
def buffer(request: pytest.FixtureRequest, tmp_path: Path) -> Buffer:
    if request.param == "memory":
        return MemoryBuffer(MAX)
    return DiskBuffer(tmp_path / "buf", max_bytes=MAX)


def test_one_interface_ids_pending_acks_bytes(buffer: Buffer) -> None:
    items = _items(5)
    assert buffer.append(items[0]) == 0
    assert buffer.append_many(items[1:]) == [1, 2, 3, 4]
    assert buffer.bytes == sum(map(len, items))
    assert buffer.pending() == list(enumerate(items))
    buffer.ack(3)
    buffer.ack(0)
    buffer.ack(3)  # twice: ignored
    buffer.ack(99)  # unknown: ignored
    assert buffer.pending() == [(1, items[1]), (2, items[2]), (4, items[4])]
    assert buffer.bytes == len(items[1]) + len(items[2]) + len(items[4])
    buffer.commit()
    assert buffer.append(b"more") == 5
    buffer.close()


def test_reopen_resumes_from_the_commit_position(tmp_path: Path) -> None:
    path = tmp_path / "buf"
    items = _items(6)
    buf = DiskBuffer(path, max_bytes=MAX)
    buf.append_many(items)
    for i in (0, 1, 3):
        buf.ack(i)
    assert buf.acked_position == 2
    buf.close()  # commits position 2; the ack of 3 lies above a gap and is not persisted
    buf = DiskBuffer(path, max_bytes=MAX)
    assert buf.pending() == [(i, items[i]) for i in (2, 3, 4, 5)]
    assert buf.acked_position == 2 and buf.bytes == sum(len(items[i]) for i in (2, 3, 4, 5))
    assert buf.append(b"x") == 6  # ids continue
    buf.close()


def test_acks_without_commit_are_not_durable(tmp_path: Path) -> None:
    path = tmp_path / "buf"
    buf = DiskBuffer(path, max_bytes=MAX)
    buf.append_many(_items(3))
    buf.ack(0)
    buf.commit()
    buf.ack(1)
    # A crash now (no close): the commit file still says 1.
    buf._release()
    reopened = DiskBuffer(path, max_bytes=MAX)
    assert [i for i, _ in reopened.pending()] == [1, 2]
    reopened.close()


def test_segments_roll_and_are_deleted_once_acknowledged(tmp_path: Path) -> None:
    path = tmp_path / "buf"
    buf = DiskBuffer(path, max_bytes=MAX, segment_bytes=100)
    ids = [buf.append(item) for item in _items(20)]
    assert len(_segments(path)) > 3
    assert _segments(path)[0].name == f"{0:020d}.seg"
    for i in ids[:-1]:
        buf.ack(i)
    buf.commit()
    # Every segment below the commit position is gone; the newest stays.
    remaining = _segments(path)
    assert len(remaining) == 1 and int(remaining[0].stem) <= ids[-1]
    buf.ack(ids[-1])
    buf.close()
    reopened = DiskBuffer(path, max_bytes=MAX, segment_bytes=100)
    assert reopened.pending() == [] and reopened.bytes == 0
    assert _segments(path) == []  # a fully acknowledged newest segment goes on open
    assert reopened.append(b"next") == 20
    reopened.close()


@pytest.mark.parametrize("into", ["header", "payload", "last byte"])
def test_torn_tail_is_truncated_to_the_valid_prefix(tmp_path: Path, into: str) -> None:
    path = tmp_path / "buf"
    items = _items(4)
    buf = DiskBuffer(path, max_bytes=MAX)
    buf.append_many(items)
    buf._release()  # as a SIGKILL: no close
    (seg,) = _segments(path)
    size = seg.stat().st_size
    good = size - len(items[-1]) - ITEM_HEADER_BYTES
    cut = {"header": good + 3, "payload": good + ITEM_HEADER_BYTES + 1, "last byte": size - 1}[into]
    with open(seg, "r+b") as f:
        f.truncate(cut)
    reopened = DiskBuffer(path, max_bytes=MAX)
    assert reopened.pending() == list(enumerate(items[:3]))
    assert seg.stat().st_size == good  # the torn item is cut off the file
    # The buffer appends where the valid prefix ends.
    assert reopened.append(b"after") == 3
    reopened.close()
    assert DiskBuffer(path, max_bytes=MAX).pending() == [*enumerate(items[:3]), (3, b"after")]


def test_a_bad_last_item_is_a_torn_tail(tmp_path: Path) -> None:
    # A flipped byte in the newest segment's last item cannot be told from a torn write
    # (data blocks not written, length intact): it is truncated like one.
    path = tmp_path / "buf"
    items = _items(3)
    buf = DiskBuffer(path, max_bytes=MAX)
    buf.append_many(items)
    buf._release()
    (seg,) = _segments(path)
    _flip(seg, seg.stat().st_size - 2)
    reopened = DiskBuffer(path, max_bytes=MAX)
    assert reopened.pending() == list(enumerate(items[:2]))
    reopened.close()


def test_a_bad_item_followed_by_a_good_one_raises(tmp_path: Path) -> None:
    path = tmp_path / "buf"
    buf = DiskBuffer(path, max_bytes=MAX)
    items = _items(3)
    buf.append_many(items)
    buf._release()
    (seg,) = _segments(path)
    second = ITEM_HEADER_BYTES + len(items[0])
    _flip(seg, second + ITEM_HEADER_BYTES + 1)  # a payload byte of item 1 (item 2 is good)
    size = seg.stat().st_size
    with pytest.raises(CorruptBuffer) as info:
        DiskBuffer(path, max_bytes=MAX)
    assert info.value.path == str(seg) and info.value.position == second
    assert seg.stat().st_size == size  # nothing was cut
    # A damaged length field (the item boundaries are lost) is found the same way.
    _flip(seg, second + ITEM_HEADER_BYTES + 1)
    _flip(seg, second + 5)
    with pytest.raises(CorruptBuffer):
        DiskBuffer(path, max_bytes=MAX)


def test_a_bad_item_in_an_older_segment_raises(tmp_path: Path) -> None:
    path = tmp_path / "buf"
    buf = DiskBuffer(path, max_bytes=MAX, segment_bytes=40)
    for item in _items(6):
        buf.append(item)
    buf._release()
    first = _segments(path)[0]
    assert len(_segments(path)) > 1
    _flip(first, first.stat().st_size - 1)  # its last item: no good item after it in the file
    with pytest.raises(CorruptBuffer, match="older than the newest"):
        DiskBuffer(path, max_bytes=MAX, segment_bytes=40)


def test_a_bad_commit_file_raises(tmp_path: Path) -> None:
    path = tmp_path / "buf"
    buf = DiskBuffer(path, max_bytes=MAX)
    buf.append_many(_items(2))
    buf.ack(0)
    buf.close()
    _flip(path / COMMIT_NAME, 7)
    with pytest.raises(CorruptBuffer, match="commit file"):
        DiskBuffer(path, max_bytes=MAX)


def test_one_process_at_a_time_and_closed_use(tmp_path: Path) -> None:
    path = tmp_path / "buf"
    buf = DiskBuffer(path, max_bytes=MAX)
    with pytest.raises(BusyResourceError):
        DiskBuffer(path, max_bytes=MAX)
    buf.close()
    buf.close()  # idempotent
    with pytest.raises(ClosedResourceError):
        buf.append(b"x")
    DiskBuffer(path, max_bytes=MAX).close()  # the lock went with the close
    with pytest.raises(InvalidArgument):
        DiskBuffer(path, max_bytes=0)
    with pytest.raises(InvalidArgument):
        DiskBuffer(path, max_bytes=MAX, fsync="sometimes")  # type: ignore[arg-type]


@pytest.mark.parametrize(("policy", "syncs"), [("always", 3), ("interval", 0), ("never", 0)])
def test_fsync_policy_decides_the_syncs_per_append(tmp_path: Path, policy: FsyncPolicy, syncs: int) -> None:
    calls: list[float] = []
    _fs.add_fsync_observer(calls.append)
    try:
        buf = DiskBuffer(tmp_path / "buf", max_bytes=MAX, fsync=policy, fsync_interval_s=3600)
        buf.append(b"a")
        buf.append_many([b"b", b"c"])
        buf.append(b"d")
        assert len(calls) == syncs
        buf.sync()  # an explicit sync syncs whatever the policy
        assert len(calls) == syncs + (0 if policy == "always" else 1)
        buf.close()
    finally:
        _fs.remove_fsync_observer(calls.append)


def _flip(path: Path, pos: int) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        byte = f.read(1)
        f.seek(pos)
        f.write(bytes([byte[0] ^ 0x5A]))
        f.flush()
        os.fsync(f.fileno())


def test_an_item_given_in_parts_is_stored_as_the_whole_item(tmp_path: Path) -> None:
    # The producer appends (header, Arrow message) without joining them: the segment must
    # hold exactly what appending the joined item writes (one frame, the CRC of the whole),
    # and a reopened buffer must return the item whole.
    whole = [b"header-1" + b"message-one" * 7, b"h2" + b"m" * 1000]
    parts = [(b"header-1", memoryview(b"message-one" * 7)), (b"h2", b"m" * 500, memoryview(b"m" * 500))]
    joined = DiskBuffer(tmp_path / "joined", max_bytes=MAX)
    split = DiskBuffer(tmp_path / "split", max_bytes=MAX)
    assert joined.append_many(whole) == split.append_many(parts) == [0, 1]
    assert joined.bytes == split.bytes == sum(len(w) for w in whole)
    joined.close()
    split.close()
    assert [p.read_bytes() for p in _segments(tmp_path / "split")] == [
        p.read_bytes() for p in _segments(tmp_path / "joined")
    ]
    assert DiskBuffer(tmp_path / "split", max_bytes=MAX).pending() == list(enumerate(whole))
    memory = MemoryBuffer(MAX)
    memory.append_many(parts)
    memory.ack(0)
    assert memory.bytes == len(whole[1])
