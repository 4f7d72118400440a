"""LeaderEpochCache: KIP-101/KIP-279 answers, truncation, persistence, corruption, crash safety."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seglog.errors import CorruptCheckpoint, EpochRegression, InvalidArgument, StorageError, UsageError
from seglog.segment import LEADER_EPOCH_FILE, UNDEFINED_EPOCH, UNDEFINED_OFFSET, LeaderEpochCache

U = (UNDEFINED_EPOCH, UNDEFINED_OFFSET)
REPO = Path(__file__).resolve().parent.parent


def make(tmp_path: Path, *entries: tuple[int, int]) -> LeaderEpochCache:
    cache = LeaderEpochCache(tmp_path)
    for epoch, start in entries:
        cache.assign(epoch, start)
    return cache


# --- end_offset_for_epoch (KIP-101, KIP-279) ----------------------------------------------


def test_empty_cache_answers_undefined(tmp_path: Path) -> None:
    cache = make(tmp_path)
    assert cache.latest_epoch() is None
    assert cache.entries() == []
    assert cache.end_offset_for_epoch(0, 10) == U
    assert cache.end_offset_for_epoch(UNDEFINED_EPOCH, 10) == U
    assert not (tmp_path / LEADER_EPOCH_FILE).exists()


def test_latest_epoch_answers_log_end(tmp_path: Path) -> None:
    cache = make(tmp_path, (1, 0), (3, 50), (4, 90))
    assert cache.latest_epoch() == 4
    assert cache.end_offset_for_epoch(4, 120) == (4, 120)


def test_middle_epoch_answers_next_start(tmp_path: Path) -> None:
    cache = make(tmp_path, (1, 0), (3, 50), (4, 90))
    assert cache.end_offset_for_epoch(1, 120) == (1, 50)
    assert cache.end_offset_for_epoch(3, 120) == (3, 90)


def test_gap_answers_floor_epoch_and_next_start(tmp_path: Path) -> None:
    cache = make(tmp_path, (1, 0), (3, 50), (6, 90))
    assert cache.end_offset_for_epoch(2, 120) == (1, 50)
    assert cache.end_offset_for_epoch(5, 120) == (3, 90)


def test_epoch_above_latest_is_undefined(tmp_path: Path) -> None:
    cache = make(tmp_path, (1, 0), (3, 50))
    assert cache.end_offset_for_epoch(4, 120) == U
    assert cache.end_offset_for_epoch(1000, 120) == U


def test_epoch_below_first_answers_first_start(tmp_path: Path) -> None:
    # Kafka since KIP-279: (requested epoch, start of the first known epoch); the older
    # history is gone from this log, the follower replicates from there.
    cache = make(tmp_path, (5, 100), (7, 150))
    assert cache.end_offset_for_epoch(2, 200) == (2, 100)
    assert cache.end_offset_for_epoch(0, 200) == (0, 100)


def test_single_entry(tmp_path: Path) -> None:
    cache = make(tmp_path, (2, 10))
    assert cache.end_offset_for_epoch(2, 30) == (2, 30)
    assert cache.end_offset_for_epoch(1, 30) == (1, 10)
    assert cache.end_offset_for_epoch(3, 30) == U


def test_bad_arguments(tmp_path: Path) -> None:
    cache = make(tmp_path, (1, 0))
    for call in (
        lambda: cache.end_offset_for_epoch(-2, 5),
        lambda: cache.end_offset_for_epoch(1, -1),
        lambda: cache.assign(-1, 0),
        lambda: cache.assign(2**31, 0),
        lambda: cache.assign(2, -1),
        lambda: cache.truncate_from_end(-1),
        lambda: cache.truncate_from_start(-1),
    ):
        with pytest.raises(InvalidArgument):
            call()


# --- assign ---------------------------------------------------------------------------------


def test_assign_same_epoch_is_noop(tmp_path: Path) -> None:
    cache = make(tmp_path, (1, 0), (2, 10))
    before = (tmp_path / LEADER_EPOCH_FILE).stat().st_mtime_ns, (tmp_path / LEADER_EPOCH_FILE).read_bytes()
    cache.assign(2, 10)
    cache.assign(2, 25)
    assert cache.entries() == [(1, 0), (2, 10)]
    after = (tmp_path / LEADER_EPOCH_FILE).stat().st_mtime_ns, (tmp_path / LEADER_EPOCH_FILE).read_bytes()
    assert after == before


def test_assign_regressions_raise_and_change_nothing(tmp_path: Path) -> None:
    cache = make(tmp_path, (1, 0), (3, 10))
    with pytest.raises(EpochRegression) as info:
        cache.assign(2, 20)
    assert (info.value.epoch, info.value.latest_epoch, info.value.latest_start_offset) == (2, 3, 10)
    assert isinstance(info.value, UsageError)
    with pytest.raises(EpochRegression):
        cache.assign(4, 9)
    with pytest.raises(EpochRegression):
        cache.assign(3, 9)
    assert cache.entries() == [(1, 0), (3, 10)]
    assert LeaderEpochCache(tmp_path).entries() == [(1, 0), (3, 10)]


def test_assign_higher_epoch_at_same_start_replaces_latest(tmp_path: Path) -> None:
    # Back-to-back failovers: epoch 3 wrote nothing before epoch 4 took over at offset 10.
    cache = make(tmp_path, (1, 0), (3, 10))
    cache.assign(4, 10)
    assert cache.entries() == [(1, 0), (4, 10)]
    assert cache.end_offset_for_epoch(3, 15) == (1, 10)


def test_epoch_for_offset(tmp_path: Path) -> None:
    cache = make(tmp_path)
    assert cache.epoch_for_offset(0) is None
    cache.assign(1, 5)
    cache.assign(3, 10)
    assert cache.epoch_for_offset(4) is None
    assert cache.epoch_for_offset(5) == 1
    assert cache.epoch_for_offset(9) == 1
    assert cache.epoch_for_offset(10) == 3
    assert cache.epoch_for_offset(10**12) == 3


# --- truncation -------------------------------------------------------------------------------


def test_truncate_from_end(tmp_path: Path) -> None:
    cache = make(tmp_path, (1, 0), (3, 50), (4, 90))
    cache.truncate_from_end(91)
    assert cache.entries() == [(1, 0), (3, 50), (4, 90)]
    cache.truncate_from_end(90)
    assert cache.entries() == [(1, 0), (3, 50)]
    assert cache.latest_epoch() == 3
    # Epoch 3 is the latest again: its end is now the log end.
    assert cache.end_offset_for_epoch(3, 90) == (3, 90)
    assert cache.end_offset_for_epoch(4, 90) == U
    cache.truncate_from_end(0)
    assert cache.entries() == []
    assert LeaderEpochCache(tmp_path).entries() == []


def test_truncate_from_end_then_new_leader(tmp_path: Path) -> None:
    cache = make(tmp_path, (1, 0), (2, 40))
    cache.truncate_from_end(30)  # a follower cut back to the leader's answer
    cache.assign(3, 30)
    assert cache.entries() == [(1, 0), (3, 30)]
    assert cache.end_offset_for_epoch(2, 70) == (1, 30)


def test_truncate_from_start(tmp_path: Path) -> None:
    cache = make(tmp_path, (1, 0), (3, 50), (4, 90))
    cache.truncate_from_start(0)
    assert cache.entries() == [(1, 0), (3, 50), (4, 90)]
    cache.truncate_from_start(60)
    assert cache.entries() == [(3, 60), (4, 90)]
    assert cache.end_offset_for_epoch(1, 120) == (1, 60)  # below the first: its start
    assert cache.end_offset_for_epoch(3, 120) == (3, 90)
    assert cache.epoch_for_offset(59) is None
    cache.truncate_from_start(90)
    assert cache.entries() == [(4, 90)]
    cache.truncate_from_start(200)  # past the last entry: the latest epoch covers it
    assert cache.entries() == [(4, 200)]
    assert LeaderEpochCache(tmp_path).entries() == [(4, 200)]


def test_truncate_from_start_before_first_is_noop(tmp_path: Path) -> None:
    cache = make(tmp_path, (2, 100))
    cache.truncate_from_start(50)
    assert cache.entries() == [(2, 100)]


def test_clear(tmp_path: Path) -> None:
    cache = make(tmp_path, (1, 0), (2, 5))
    cache.clear()
    assert cache.entries() == []
    assert (tmp_path / LEADER_EPOCH_FILE).exists()
    assert LeaderEpochCache(tmp_path).entries() == []


# --- persistence and corruption ------------------------------------------------------------------


def test_round_trip_across_reopen(tmp_path: Path) -> None:
    make(tmp_path, (0, 0), (2, 7), (9, 1 << 40), (2**31 - 1, (1 << 62) + 3))
    again = LeaderEpochCache(tmp_path)
    assert again.entries() == [(0, 0), (2, 7), (9, 1 << 40), (2**31 - 1, (1 << 62) + 3)]
    assert again.end_offset_for_epoch(2, 0) == (2, 1 << 40)
    assert not (tmp_path / (LEADER_EPOCH_FILE + ".tmp")).exists()


def test_leftover_temp_file_is_ignored(tmp_path: Path) -> None:
    make(tmp_path, (1, 0))
    (tmp_path / (LEADER_EPOCH_FILE + ".tmp")).write_bytes(b"half a fi")
    assert LeaderEpochCache(tmp_path).entries() == [(1, 0)]


@pytest.mark.parametrize("position", [0, 5, 22, 25, -5, -2])
def test_flipped_byte_is_detected(tmp_path: Path, position: int) -> None:
    make(tmp_path, (1, 0), (3, 50), (4, 90))
    path = tmp_path / LEADER_EPOCH_FILE
    raw = bytearray(path.read_bytes())
    raw[position] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptCheckpoint):
        LeaderEpochCache(tmp_path)


@pytest.mark.parametrize(
    "content",
    [b"", b"\x00" * 64, b"garbage\n", b"seglog-leader-epochs 1\n1\n1 0\n", b"\xff\xfe\n"],
)
def test_garbage_is_detected(tmp_path: Path, content: bytes) -> None:
    (tmp_path / LEADER_EPOCH_FILE).write_bytes(content)
    with pytest.raises(CorruptCheckpoint) as info:
        LeaderEpochCache(tmp_path)
    assert isinstance(info.value, StorageError)


def test_torn_prefix_is_detected(tmp_path: Path) -> None:
    make(tmp_path, (1, 0), (3, 50), (4, 90))
    path = tmp_path / LEADER_EPOCH_FILE
    raw = path.read_bytes()
    for cut in range(len(raw)):
        path.write_bytes(raw[:cut])
        with pytest.raises(CorruptCheckpoint):
            LeaderEpochCache(tmp_path)


def test_valid_crc_but_unordered_entries_is_detected(tmp_path: Path) -> None:
    body = b"seglog-leader-epochs 1\n2\n3 10\n2 20\n"
    (tmp_path / LEADER_EPOCH_FILE).write_bytes(body + f"crc32 {zlib.crc32(body):08x}\n".encode())
    with pytest.raises(CorruptCheckpoint, match="order"):
        LeaderEpochCache(tmp_path)


def test_failed_write_leaves_cache_unchanged(tmp_path: Path) -> None:
    cache = make(tmp_path, (1, 0))
    (tmp_path / (LEADER_EPOCH_FILE + ".tmp")).mkdir()  # atomic_write cannot open its temp file
    with pytest.raises(StorageError):
        cache.assign(2, 10)
    assert cache.entries() == [(1, 0)]
    assert LeaderEpochCache(tmp_path).entries() == [(1, 0)]


# --- crash safety: SIGKILL between (and during) assignments -------------------------------------

_CHILD = """
import os, sys
from seglog.segment import LeaderEpochCache
cache = LeaderEpochCache(sys.argv[1])
ready = int(sys.argv[2])
for i in range(1, 100_000):
    cache.assign(i, i * 10)
    os.write(ready, b"x")
"""


@pytest.mark.parametrize("after", [1, 2, 7, 30])
def test_sigkill_leaves_a_consistent_prefix(tmp_path: Path, after: int) -> None:
    read_fd, write_fd = os.pipe()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(tmp_path), str(write_fd)], pass_fds=(write_fd,), env=env
    )
    os.close(write_fd)
    try:
        seen = 0
        while seen < after:
            got = os.read(read_fd, after - seen)
            assert got, f"child exited early with {child.wait()}"
            seen += len(got)
        # The child keeps assigning: the kill lands between or inside later assignments.
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait() == -signal.SIGKILL
    finally:
        os.close(read_fd)
        if child.poll() is None:
            child.kill()
            child.wait()
    entries = LeaderEpochCache(tmp_path).entries()
    assert len(entries) >= after
    assert entries == [(i, i * 10) for i in range(1, len(entries) + 1)]


# --- property test against a reference model -------------------------------------------------------


class Model:
    """The cache as a plain sorted list, each rule written the obvious way."""

    def __init__(self) -> None:
        self.entries: list[tuple[int, int]] = []

    def assign(self, epoch: int, start: int) -> bool:
        """Apply; False when the real cache must raise EpochRegression."""
        if not self.entries:
            self.entries = [(epoch, start)]
            return True
        last_epoch, last_start = self.entries[-1]
        if epoch < last_epoch or start < last_start:
            return False
        if epoch > last_epoch:
            if start == last_start:
                self.entries.pop()
            self.entries.append((epoch, start))
        return True

    def truncate_from_end(self, end: int) -> None:
        self.entries = [e for e in self.entries if e[1] < end]

    def truncate_from_start(self, start: int) -> None:
        covered = [e for e in self.entries if e[1] <= start]
        if covered:
            self.entries = [(covered[-1][0], start)] + [e for e in self.entries if e[1] > start]

    def end_offset_for_epoch(self, epoch: int, leo: int) -> tuple[int, int]:
        if epoch == -1 or not self.entries:
            return U
        if epoch == self.entries[-1][0]:
            return epoch, leo
        above = [e for e in self.entries if e[0] > epoch]
        at_or_below = [e for e in self.entries if e[0] <= epoch]
        if not above:
            return U
        if not at_or_below:
            return epoch, above[0][1]
        return at_or_below[-1][0], above[0][1]

    def epoch_for_offset(self, offset: int) -> int | None:
        covering = [e for e in self.entries if e[1] <= offset]
        return covering[-1][0] if covering else None


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("assign"), st.integers(0, 30), st.integers(0, 200)),
        # Mostly-valid assignments: a step up from the latest entry (0 = same epoch / start).
        st.tuples(st.just("next"), st.integers(0, 3), st.integers(0, 30)),
        st.tuples(st.just("end"), st.integers(0, 220)),
        st.tuples(st.just("start"), st.integers(0, 220)),
        st.tuples(st.just("reopen")),
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(ops=_ops, probes=st.lists(st.integers(-1, 35), min_size=1, max_size=10), data=st.data())
def test_matches_reference_model(
    tmp_path_factory: pytest.TempPathFactory,
    ops: list[tuple[Any, ...]],
    probes: list[int],
    data: st.DataObject,
) -> None:
    directory = tmp_path_factory.mktemp("epochs")
    cache = LeaderEpochCache(directory)
    model = Model()
    for op in ops:
        if op[0] == "next":
            last_epoch, last_start = model.entries[-1] if model.entries else (0, 0)
            op = ("assign", last_epoch + op[1], last_start + op[2])
        if op[0] == "assign":
            if model.assign(op[1], op[2]):
                cache.assign(op[1], op[2])
            else:
                with pytest.raises(EpochRegression):
                    cache.assign(op[1], op[2])
        elif op[0] == "end":
            cache.truncate_from_end(op[1])
            model.truncate_from_end(op[1])
        elif op[0] == "start":
            cache.truncate_from_start(op[1])
            model.truncate_from_start(op[1])
        else:
            cache = LeaderEpochCache(directory)
        assert cache.entries() == model.entries
    leo = max([s for _, s in model.entries], default=0) + data.draw(st.integers(0, 50))
    for epoch in probes:
        assert cache.end_offset_for_epoch(epoch, leo) == model.end_offset_for_epoch(epoch, leo)
    for offset in data.draw(st.lists(st.integers(0, 260), max_size=10)):
        assert cache.epoch_for_offset(offset) == model.epoch_for_offset(offset)
    assert LeaderEpochCache(directory).entries() == model.entries
