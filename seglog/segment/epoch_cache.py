"""The leader-epoch cache of a shard: which leader epoch wrote which offsets (KIP-101).

Every leader stamps its epoch into the frames it writes; this cache keeps, per shard, the
first offset of each epoch, as Kafka's ``LeaderEpochFileCache`` does. A follower that comes
back asks the leader for the end offset of its own latest epoch
(:meth:`LeaderEpochCache.end_offset_for_epoch`, Kafka's OffsetsForLeaderEpoch) and truncates
there rather than to its high watermark, which is what lost acknowledged data before KIP-101.

The cache lives in ``<shard>/leader-epoch-checkpoint``, a small text file replaced whole by
:func:`seglog._fs.atomic_write` on every change, so a crash leaves either the old or the new
content::

    seglog-leader-epochs 1        magic and version
    3                             number of entries
    0 0                           epoch start_offset, strictly increasing in both
    2 120
    5 300
    crc32 1a2b3c4d                zlib crc32 of every byte above this line

A file that fails any check raises :class:`~seglog.errors.CorruptCheckpoint`; a missing file
is an empty cache. The class is not thread-safe: one owner per shard directory.
"""

from __future__ import annotations

import bisect
import os
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from seglog._fs import atomic_write
from seglog.errors import CorruptCheckpoint, EpochRegression, InvalidArgument, StorageError

__all__ = [
    "LEADER_EPOCH_FILE",
    "MAX_EPOCH",
    "UNDEFINED_EPOCH",
    "UNDEFINED_OFFSET",
    "EpochEntry",
    "LeaderEpochCache",
    "assign_entry",
    "end_offset_for_epoch",
    "entries_truncated_from_end",
    "entries_truncated_from_start",
    "epoch_for_offset",
]

LEADER_EPOCH_FILE: Final = "leader-epoch-checkpoint"
# Kafka's "no epoch" / "no offset" answers of OffsetsForLeaderEpoch.
UNDEFINED_EPOCH: Final = -1
UNDEFINED_OFFSET: Final = -1
# The frame header stores the epoch as an int32.
MAX_EPOCH: Final = 2**31 - 1
_MAGIC: Final = "seglog-leader-epochs"
_VERSION: Final = 1
_CRC_PREFIX: Final = "crc32 "
# A real cache holds one entry per leadership change still in the log; this bounds what a
# damaged count can make the loader believe.
_MAX_ENTRIES: Final = 1 << 20

EpochEntry = tuple[int, int]
"""``(epoch, start_offset)``: the first offset written under ``epoch``."""


def _encode(entries: list[EpochEntry]) -> bytes:
    lines = [f"{_MAGIC} {_VERSION}", str(len(entries))]
    lines.extend(f"{epoch} {start}" for epoch, start in entries)
    body = ("\n".join(lines) + "\n").encode("ascii")
    return body + f"{_CRC_PREFIX}{zlib.crc32(body):08x}\n".encode("ascii")


def _decode(raw: bytes, path: Path) -> list[EpochEntry]:
    """Parse a checkpoint; every failure is a :class:`CorruptCheckpoint` naming ``path``."""

    def bad(why: str) -> CorruptCheckpoint:
        return CorruptCheckpoint(f"{path}: {why}")

    if not raw.endswith(b"\n"):
        raise bad("truncated (no final newline)")
    cut = raw.rfind(b"\n", 0, len(raw) - 1) + 1
    body, crc_line = raw[:cut], raw[cut:-1]
    try:
        crc_text = crc_line.decode("ascii")
        text = body.decode("ascii")
    except UnicodeDecodeError:
        raise bad("not ASCII") from None
    if not crc_text.startswith(_CRC_PREFIX) or len(crc_text) != len(_CRC_PREFIX) + 8:
        raise bad("no crc line")
    try:
        crc = int(crc_text[len(_CRC_PREFIX) :], 16)
    except ValueError:
        raise bad("bad crc value") from None
    if crc != zlib.crc32(body):
        raise bad(f"crc mismatch (stored {crc:08x}, computed {zlib.crc32(body):08x})")
    lines = text.splitlines()
    if len(lines) < 2 or lines[0] != f"{_MAGIC} {_VERSION}":
        raise bad(f"unknown header {lines[0] if lines else ''!r}")
    try:
        count = int(lines[1])
        if not 0 <= count <= _MAX_ENTRIES or len(lines) != 2 + count:
            raise bad(f"entry count {lines[1]!r} does not match {len(lines) - 2} lines")
        entries: list[EpochEntry] = []
        for line in lines[2:]:
            epoch_text, start_text = line.split(" ")
            entries.append((int(epoch_text), int(start_text)))
    except ValueError:
        raise bad("malformed entry") from None
    problem = _order_problem(entries)
    if problem is not None:
        raise bad(problem)
    return entries


def _order_problem(entries: list[EpochEntry]) -> str | None:
    """Why ``entries`` break the cache's invariant, or ``None``."""
    for i, (epoch, start) in enumerate(entries):
        ok = 0 <= epoch <= MAX_EPOCH and start >= 0
        if i and ok:
            prev_epoch, prev_start = entries[i - 1]
            ok = epoch > prev_epoch and start > prev_start
        if not ok:
            return f"entry {i} ({epoch}, {start}) breaks the order or range of epochs"
    return None


# --- the rules, as pure functions over a list of entries ----------------------------------
# LeaderEpochCache applies them to its file; engines that persist entries elsewhere (the
# ``lmdb`` engine keeps them in its environment, ``memory`` in RAM) apply the same ones.


def epoch_for_offset(entries: Sequence[EpochEntry], offset: int) -> int | None:
    """The epoch that wrote ``offset``: the last entry starting at or before it.

    Offsets past the latest entry's start belong to the latest epoch (it is still being
    written); offsets before the first entry, or any offset of no entries, give ``None``.
    """
    i = bisect.bisect_right(entries, offset, key=lambda e: e[1])
    return entries[i - 1][0] if i else None


def end_offset_for_epoch(entries: Sequence[EpochEntry], epoch: int, log_end_offset: int) -> tuple[int, int]:
    """Kafka's OffsetsForLeaderEpoch answer: ``(epoch, end offset)`` for a follower's ``epoch``.

    The end offset of an epoch is the first offset *not* written under it or an earlier
    epoch; the follower truncates its log there. The rules, in order, are those of
    Kafka's ``LeaderEpochFileCache.endOffsetFor`` (since KIP-279):

    1. ``epoch`` is ``UNDEFINED_EPOCH`` (-1), or the cache is empty:
       ``(UNDEFINED_EPOCH, UNDEFINED_OFFSET)``.
    2. ``epoch`` is the latest epoch: ``(epoch, log_end_offset)`` -- it is still open.
    3. ``epoch`` is above the latest epoch (no higher entry):
       ``(UNDEFINED_EPOCH, UNDEFINED_OFFSET)``.
    4. ``epoch`` is below the first entry's epoch (its history was removed by retention):
       ``(epoch, start offset of the first entry)``. The answer may be inaccurate, but the
       data before that offset is gone from this log anyway, so the follower must
       replicate from there. (KIP-101 as first shipped in 0.11 answered
       ``UNDEFINED_OFFSET`` here; KIP-279 changed it.)
    5. Otherwise let ``floor`` be the largest known epoch ``<= epoch`` and ``higher`` the
       first entry above it: ``(floor, higher's start offset)``. For a gap (the cache has
       1 and 3, the follower asks for 2) this is ``(1, start of 3)``: the follower learns
       that its epoch 2 never reached this leader, and that it diverged from epoch 1's end.

    Args:
        entries: A cache's ``(epoch, start_offset)`` entries, strictly increasing in both.
        epoch: The follower's latest epoch.
        log_end_offset: This log's end offset (next offset to write); rule 2's answer.

    Raises:
        InvalidArgument: ``epoch < -1`` or ``log_end_offset < 0``.
    """
    if epoch < UNDEFINED_EPOCH or log_end_offset < 0:
        raise InvalidArgument(f"epoch {epoch} / log end offset {log_end_offset} out of range")
    if epoch == UNDEFINED_EPOCH or not entries:
        return UNDEFINED_EPOCH, UNDEFINED_OFFSET
    if epoch == entries[-1][0]:
        return epoch, log_end_offset
    higher = bisect.bisect_right(entries, epoch, key=lambda e: e[0])
    if higher == len(entries):
        return UNDEFINED_EPOCH, UNDEFINED_OFFSET
    if higher == 0:
        return epoch, entries[0][1]
    return entries[higher - 1][0], entries[higher][1]


def assign_entry(entries: Sequence[EpochEntry], epoch: int, start_offset: int) -> list[EpochEntry]:
    """``entries`` after recording that ``epoch`` starts at ``start_offset`` (the rules of
    :meth:`LeaderEpochCache.assign`); ``entries`` itself is not changed.

    Raises:
        InvalidArgument: ``epoch`` outside ``[0, MAX_EPOCH]`` or a negative offset.
        EpochRegression: The assignment would make the entries non-monotonic.
    """
    if not 0 <= epoch <= MAX_EPOCH or start_offset < 0:
        raise InvalidArgument(f"epoch {epoch} at offset {start_offset} out of range")
    if not entries:
        return [(epoch, start_offset)]
    latest_epoch, latest_start = entries[-1]
    if epoch < latest_epoch or start_offset < latest_start:
        raise EpochRegression(epoch, start_offset, latest_epoch, latest_start)
    if epoch == latest_epoch:
        return list(entries)
    keep = entries[:-1] if start_offset == latest_start else entries
    return [*keep, (epoch, start_offset)]


def entries_truncated_from_end(entries: Sequence[EpochEntry], end_offset: int) -> list[EpochEntry]:
    """``entries`` after the log was cut back to ``end_offset`` (see
    :meth:`LeaderEpochCache.truncate_from_end`).

    Raises:
        InvalidArgument: ``end_offset < 0``.
    """
    if end_offset < 0:
        raise InvalidArgument(f"end offset {end_offset} is negative")
    return [e for e in entries if e[1] < end_offset]


def entries_truncated_from_start(entries: Sequence[EpochEntry], start_offset: int) -> list[EpochEntry]:
    """``entries`` after the log start moved up to ``start_offset`` (see
    :meth:`LeaderEpochCache.truncate_from_start`).

    Raises:
        InvalidArgument: ``start_offset < 0``.
    """
    if start_offset < 0:
        raise InvalidArgument(f"start offset {start_offset} is negative")
    i = bisect.bisect_right(entries, start_offset, key=lambda e: e[1])
    if i == 0:
        return list(entries)
    return [(entries[i - 1][0], start_offset), *entries[i:]]


class LeaderEpochCache:
    """Epoch -> start offset of one shard, persisted in ``<directory>/leader-epoch-checkpoint``.

    Invariant: entries are strictly increasing in both epoch and start offset. Every mutating
    call writes the whole file (temp file, fsync, rename, fsync directory) before it returns
    and changes the in-memory state only after the write succeeded.

    Args:
        directory: The shard directory; it must exist.

    Raises:
        CorruptCheckpoint: The file exists but fails its format, order or CRC check.
        StorageError: The file could not be read.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self._path = Path(directory) / LEADER_EPOCH_FILE
        self._entries: list[EpochEntry] = self._load()

    @property
    def path(self) -> Path:
        """The checkpoint file."""
        return self._path

    def _load(self) -> list[EpochEntry]:
        try:
            raw = self._path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as e:
            raise StorageError(f"cannot read {self._path}: {e}") from e
        return _decode(raw, self._path)

    def _store(self, entries: list[EpochEntry]) -> None:
        if entries == self._entries:
            return
        try:
            atomic_write(self._path, _encode(entries))
        except OSError as e:
            raise StorageError(f"cannot write {self._path}: {e}") from e
        self._entries = entries

    # --- queries ---------------------------------------------------------------------

    def entries(self) -> list[EpochEntry]:
        """A copy of the ``(epoch, start_offset)`` entries, oldest first."""
        return list(self._entries)

    def latest_epoch(self) -> int | None:
        """The highest epoch in the cache; ``None`` when it is empty."""
        return self._entries[-1][0] if self._entries else None

    def epoch_for_offset(self, offset: int) -> int | None:
        """The epoch that wrote ``offset`` (see :func:`epoch_for_offset`)."""
        return epoch_for_offset(self._entries, offset)

    def end_offset_for_epoch(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """Kafka's OffsetsForLeaderEpoch answer for this cache (see :func:`end_offset_for_epoch`).

        Raises:
            InvalidArgument: ``epoch < -1`` or ``log_end_offset < 0``.
        """
        return end_offset_for_epoch(self._entries, epoch, log_end_offset)

    # --- mutations -------------------------------------------------------------------

    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that ``epoch`` starts at ``start_offset`` (a leader's first frame of the epoch).

        * ``epoch`` equal to the latest epoch, at or after its start: no-op (every frame of
          the epoch may call this).
        * ``epoch`` above the latest, ``start_offset`` above the latest start: appended.
        * ``epoch`` above the latest at the *same* start offset: the latest entry is replaced,
          as Kafka does; the superseded epoch wrote nothing (a leader that lost leadership
          before its first write, e.g. back-to-back failovers, KIP-279).
        * Anything else -- a lower epoch, or a start offset below the latest entry's start --
          raises :class:`~seglog.errors.EpochRegression`. Kafka logs a warning and drops the
          entries in the way; here the caller must truncate first (``truncate_from_end``).

        Raises:
            InvalidArgument: ``epoch`` outside ``[0, MAX_EPOCH]`` or a negative offset.
            EpochRegression: The assignment would make the cache non-monotonic.
            StorageError: The file could not be written; the cache is unchanged.
        """
        self._store(assign_entry(self._entries, epoch, start_offset))

    def truncate_from_end(self, end_offset: int) -> None:
        """The log was cut back to ``end_offset`` (offsets ``>= end_offset`` removed).

        Drops every entry whose start offset is ``>= end_offset``.

        Raises:
            InvalidArgument: ``end_offset < 0``.
            StorageError: The file could not be written; the cache is unchanged.
        """
        self._store(entries_truncated_from_end(self._entries, end_offset))

    def truncate_from_start(self, start_offset: int) -> None:
        """The log start moved forward to ``start_offset`` (retention removed older offsets).

        As Kafka does: every entry starting at or before ``start_offset`` is removed, and the
        last of them (the epoch that covers ``start_offset``) is put back starting at
        ``start_offset``. Entries after it are unchanged. Nothing changes when
        ``start_offset`` is before the first entry.

        Raises:
            InvalidArgument: ``start_offset < 0``.
            StorageError: The file could not be written; the cache is unchanged.
        """
        self._store(entries_truncated_from_start(self._entries, start_offset))

    def clear(self) -> None:
        """Remove every entry (the file is rewritten empty, not deleted).

        Raises:
            StorageError: The file could not be written; the cache is unchanged.
        """
        if not self._entries and self._path.exists():
            return
        try:
            atomic_write(self._path, _encode([]))
        except OSError as e:
            raise StorageError(f"cannot write {self._path}: {e}") from e
        self._entries = []

    def __repr__(self) -> str:
        return f"LeaderEpochCache({str(self._path.parent)!r}, {self._entries!r})"
