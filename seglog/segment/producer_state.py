"""Idempotent producers: what a shard's log says each producer last wrote (Kafka's
``ProducerStateManager``).

An idempotent producer numbers its records per shard: a producer id (allocated once per
producer session), a producer epoch, and a sequence number per record that starts at 0 and
counts up by one. Every frame it writes carries ``(producer id, epoch, base sequence)`` in its
header (:mod:`seglog.record`), so this state is never stored apart from the log: it is
rebuilt from the headers of a shard's frames (on any replica, after a restart or a failover)
and then kept up to date by the appends of the node that leads the shard.

A batch ``[seq, seq + n)`` from a producer whose last stored sequence is ``last`` is:

* **new** when ``seq == last + 1`` (or the producer is unknown here: its state went with the
  segments that held it, or it never wrote to this shard);
* **a duplicate**, in whole or in its first ``last - seq + 1`` rows, when ``seq <= last``:
  those rows are not written again, and their offsets are answered from the recent runs this
  table keeps (:data:`RUNS_KEPT` per producer; older ones answer offset ``-1``, "stored,
  offset no longer known");
* **out of order** when ``seq > last + 1``: records in between were never stored, and
  writing these would hide that (:class:`~seglog.errors.OutOfOrderSequence`).

A batch with an epoch below the producer's is refused (:class:`~seglog.errors.ProducerFenced`);
a higher epoch starts the producer's numbering again at 0.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from collections.abc import Iterable
from typing import Any, Final, NamedTuple

import numpy as np

from seglog.errors import InvalidArgument, OutOfOrderSequence, ProducerFenced
from seglog.record import MAX_PRODUCER_EPOCH, MAX_SEQUENCE, FrameHeader

__all__ = [
    "MAX_PRODUCERS_PER_SHARD",
    "RUNS_KEPT",
    "Admission",
    "ProducerColumns",
    "ProducerStamp",
    "ShardProducers",
    "check_stamp",
    "producer_runs",
]

RUNS_KEPT: Final = 16
"""Recent runs (a batch's rows at contiguous offsets) kept per producer and shard: enough for
every request a client keeps in flight for the shard, and then some."""
MAX_PRODUCERS_PER_SHARD: Final = 10_000
"""Producers remembered per shard; the least recently written one is forgotten beyond this
(its next batch is taken as new, as after its state expired)."""
UNKNOWN_OFFSET: Final = -1
"""The offset answered for a duplicate row older than the runs kept."""


class ProducerStamp(NamedTuple):
    """An idempotent producer's claim on one append: its id, epoch, and the sequence number
    of each shard's first row (``sequences[shard]``)."""

    producer_id: int
    producer_epoch: int
    sequences: dict[int, int]


class ProducerColumns(NamedTuple):
    """The producer fields of buffered rows, one entry per row (``-1``: no producer): rows
    of idempotent appends wait in an I/O worker's buffer like any others and are framed by
    producer run when written (:func:`producer_runs`)."""

    pid: np.ndarray[Any, np.dtype[np.int64]]
    epoch: np.ndarray[Any, np.dtype[np.int16]]
    seq: np.ndarray[Any, np.dtype[np.int32]]

    @classmethod
    def none(cls, n: int) -> ProducerColumns:
        """``n`` rows without a producer."""
        return cls(np.full(n, -1, np.int64), np.full(n, -1, np.int16), np.full(n, -1, np.int32))

    def take(self, idx: np.ndarray[Any, Any]) -> ProducerColumns:
        """The entries at ``idx``."""
        return ProducerColumns(self.pid[idx], self.epoch[idx], self.seq[idx])

    def slice(self, lo: int, hi: int) -> ProducerColumns:
        """Entries ``[lo, hi)``."""
        return ProducerColumns(self.pid[lo:hi], self.epoch[lo:hi], self.seq[lo:hi])

    @classmethod
    def concat(cls, parts: list[ProducerColumns]) -> ProducerColumns:
        """The entries of ``parts`` one after the other."""
        return cls(
            np.concatenate([p.pid for p in parts]),
            np.concatenate([p.epoch for p in parts]),
            np.concatenate([p.seq for p in parts]),
        )


def producer_runs(
    stamps: ProducerColumns | None, n: int
) -> list[tuple[int, int, tuple[int, int, int] | None]]:
    """``(start, stop, (producer id, epoch, first sequence) or None)`` of each run of ``n``
    rows a frame may hold: one producer's consecutive sequence numbers, or rows without one."""
    if stamps is None or not n:
        return [(0, n, None)]
    pid, epoch, seq = stamps
    breaks = (
        np.flatnonzero(
            (pid[1:] != pid[:-1]) | (epoch[1:] != epoch[:-1]) | ((pid[1:] >= 0) & (seq[1:] != seq[:-1] + 1))
        )
        + 1
    )
    bounds = [0, *breaks.tolist(), n]
    out: list[tuple[int, int, tuple[int, int, int] | None]] = []
    for lo, hi in itertools.pairwise(bounds):
        p = int(pid[lo])
        out.append((lo, hi, None if p < 0 else (p, int(epoch[lo]), int(seq[lo]))))
    return out


def check_stamp(stamp: ProducerStamp) -> None:
    """Raise :class:`InvalidArgument` unless every field of ``stamp`` fits a frame header."""
    pid, epoch, sequences = stamp
    if type(pid) is not int or not 0 <= pid < 2**63:
        raise InvalidArgument(f"producer_id must be an int in 0..2**63-1, not {pid!r}")
    if type(epoch) is not int or not 0 <= epoch <= MAX_PRODUCER_EPOCH:
        raise InvalidArgument(f"producer_epoch must be an int in 0..{MAX_PRODUCER_EPOCH}, not {epoch!r}")
    for shard, seq in sequences.items():
        if type(seq) is not int or not 0 <= seq <= MAX_SEQUENCE:
            raise InvalidArgument(
                f"sequence of shard {shard} must be an int in 0..{MAX_SEQUENCE}, not {seq!r}"
            )


class Admission(NamedTuple):
    """What to do with one producer batch on one shard."""

    skip: int  # leading rows already stored: not written again
    stored: list[tuple[int, int]]  # (base offset or UNKNOWN_OFFSET, rows) of those rows, in order


class _Run(NamedTuple):
    first_seq: int
    last_seq: int
    base_offset: int


class _Producer:
    __slots__ = ("epoch", "last_seq", "runs")

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.last_seq = -1
        self.runs: deque[_Run] = deque(maxlen=RUNS_KEPT)


class ShardProducers:
    """The idempotent producers of one shard: last sequence and recent runs of each."""

    def __init__(self, max_producers: int = MAX_PRODUCERS_PER_SHARD) -> None:
        self._producers: OrderedDict[int, _Producer] = OrderedDict()
        self._max = max_producers

    @classmethod
    def from_headers(cls, headers: Iterable[FrameHeader]) -> ShardProducers:
        """The state a log's frame headers (oldest first) leave behind."""
        table = cls()
        for h in headers:
            if h.producer_id >= 0:
                table.record(h.producer_id, h.producer_epoch, h.base_sequence, h.record_count, h.base_offset)
        return table

    def __len__(self) -> int:
        return len(self._producers)

    def last_sequence(self, producer_id: int) -> int | None:
        """The last sequence stored for ``producer_id`` (``None``: unknown here)."""
        p = self._producers.get(producer_id)
        return None if p is None else p.last_seq

    def check(self, producer_id: int, epoch: int, seq: int, count: int) -> Admission:
        """Classify a batch of ``count`` rows numbered from ``seq`` (nothing is recorded).

        Raises:
            ProducerFenced: ``epoch`` is below the producer's.
            OutOfOrderSequence: Records before ``seq`` were never stored, or a new epoch
                does not start at 0.
        """
        p = self._producers.get(producer_id)
        if p is None:
            return Admission(0, [])
        if epoch < p.epoch:
            raise ProducerFenced(
                f"producer {producer_id} epoch {epoch} is fenced: epoch {p.epoch} wrote here since",
                producer_id=producer_id,
                epoch=p.epoch,
            )
        if epoch > p.epoch:
            if seq != 0:
                raise OutOfOrderSequence(
                    f"producer {producer_id}: epoch {epoch} must start at sequence 0, not {seq}",
                    producer_id=producer_id,
                    expected=0,
                    got=seq,
                )
            return Admission(0, [])
        if seq > p.last_seq + 1:
            raise OutOfOrderSequence(
                f"producer {producer_id}: sequence {seq} follows {p.last_seq}; "
                f"{seq - p.last_seq - 1} records in between were never stored",
                producer_id=producer_id,
                expected=p.last_seq + 1,
                got=seq,
            )
        skip = min(count, p.last_seq + 1 - seq)
        if not skip:
            return Admission(0, [])
        return Admission(skip, self._stored(p, seq, skip))

    @staticmethod
    def _stored(p: _Producer, seq: int, n: int) -> list[tuple[int, int]]:
        """Offsets of sequences ``[seq, seq + n)`` as runs, from the runs kept."""
        out: list[tuple[int, int]] = []
        end = seq + n
        for run in p.runs:
            if run.last_seq < seq:
                continue
            if run.first_seq > seq:
                # Older than the oldest run kept (or a gap the log cannot have): unknown.
                out.append((UNKNOWN_OFFSET, min(run.first_seq, end) - seq))
                seq = min(run.first_seq, end)
                if seq == end:
                    break
            take = min(run.last_seq + 1, end) - seq
            out.append((run.base_offset + seq - run.first_seq, take))
            seq += take
            if seq == end:
                break
        if seq < end:
            out.append((UNKNOWN_OFFSET, end - seq))
        return out

    def record(self, producer_id: int, epoch: int, seq: int, count: int, base_offset: int) -> None:
        """Note that rows ``[seq, seq + count)`` are stored at ``base_offset`` on."""
        p = self._producers.get(producer_id)
        if p is None or epoch > p.epoch:
            p = _Producer(epoch)
            self._producers[producer_id] = p
        self._producers.move_to_end(producer_id)
        last = seq + count - 1
        runs = p.runs
        if (
            runs
            and runs[-1].last_seq + 1 == seq
            and runs[-1].base_offset + seq - runs[-1].first_seq == base_offset
        ):
            runs[-1] = _Run(runs[-1].first_seq, last, runs[-1].base_offset)  # a frame split of one batch
        else:
            runs.append(_Run(seq, last, base_offset))
        p.last_seq = max(p.last_seq, last)
        while len(self._producers) > self._max:
            self._producers.popitem(last=False)
