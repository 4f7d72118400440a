"""The high-watermark checkpoint of a shard, persisted lazily like Kafka's.

The high watermark (HW) is the offset below which every record is on every in-sync replica;
readers are served only below it. Kafka keeps it in memory and writes it to
``replication-offset-checkpoint`` every ``replica.high.watermark.checkpoint.interval.ms``
(5 s), not on every change: a checkpoint that is behind after a crash is safe, because the
HW only bounds what readers may see and a restarted replica relearns it from the leader. It
must not be used to truncate the log -- that is the leader-epoch cache's job (KIP-101,
:mod:`seglog.segment.epoch_cache`).

This class holds one shard's HW. :meth:`HighWatermarkCheckpoint.update` changes memory only
and marks it dirty; the caller decides when to write, either with :meth:`flush` or with
:meth:`maybe_flush` and an injectable clock (no threads, no timers here). The file,
``<shard>/high-watermark-checkpoint``, is replaced whole by :func:`seglog._fs.atomic_write`::

    seglog-high-watermark 1       magic and version
    1234                          the high watermark
    crc32 1a2b3c4d                zlib crc32 of every byte above this line

A missing file is a HW of 0 (a new shard). A file that fails its checks raises
:class:`~seglog.errors.CorruptCheckpoint`, as Kafka fails on a corrupt checkpoint file: a
silent 0 would hide damage to the shard directory. The caller may delete the file and
reopen to start from 0 deliberately. On open the caller should also cap the HW at the log
end offset, as Kafka does, since the log may have been cut back after the last flush.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final

from seglog._fs import atomic_write
from seglog.errors import CorruptCheckpoint, InvalidArgument, StorageError
from seglog.segment._on_demand import OnDemandThread

__all__ = [
    "DEFAULT_FLUSH_INTERVAL_S",
    "HIGH_WATERMARK_FILE",
    "HighWatermarkCheckpoint",
    "HighWatermarkWriter",
]

log = logging.getLogger("seglog.segment.high_watermark")

HIGH_WATERMARK_FILE: Final = "high-watermark-checkpoint"
# Kafka's replica.high.watermark.checkpoint.interval.ms default.
DEFAULT_FLUSH_INTERVAL_S: Final = 5.0
_MAGIC: Final = "seglog-high-watermark"
_VERSION: Final = 1
_CRC_PREFIX: Final = "crc32 "


def _encode(hw: int) -> bytes:
    body = f"{_MAGIC} {_VERSION}\n{hw}\n".encode("ascii")
    return body + f"{_CRC_PREFIX}{zlib.crc32(body):08x}\n".encode("ascii")


def _decode(raw: bytes, path: Path) -> int:
    lines = raw.split(b"\n")
    # Three lines and the empty string after the final newline.
    if len(lines) != 4 or lines[3] != b"":
        raise CorruptCheckpoint(f"{path}: expected 3 lines, found {len(lines) - 1} newlines")
    body = lines[0] + b"\n" + lines[1] + b"\n"
    crc_line = lines[2]
    if not crc_line.startswith(_CRC_PREFIX.encode()) or len(crc_line) != len(_CRC_PREFIX) + 8:
        raise CorruptCheckpoint(f"{path}: no crc line")
    try:
        crc = int(crc_line[len(_CRC_PREFIX) :], 16)
    except ValueError:
        raise CorruptCheckpoint(f"{path}: bad crc value") from None
    if crc != zlib.crc32(body):
        raise CorruptCheckpoint(f"{path}: crc mismatch (stored {crc:08x}, computed {zlib.crc32(body):08x})")
    if lines[0] != f"{_MAGIC} {_VERSION}".encode():
        raise CorruptCheckpoint(f"{path}: unknown header {lines[0]!r}")
    try:
        hw = int(lines[1].decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise CorruptCheckpoint(f"{path}: bad high watermark {lines[1]!r}") from None
    if hw < 0:
        raise CorruptCheckpoint(f"{path}: negative high watermark {hw}")
    return hw


class HighWatermarkCheckpoint:
    """One shard's high watermark: in memory, written to disk when the caller says so.

    :meth:`update` may run on one thread (the event loop) while :meth:`flush` runs on
    another (a :class:`HighWatermarkWriter`): a flush clears the dirty mark only if no update
    came in while it wrote, so a concurrent update is never lost. Writes of the file
    (:meth:`flush`, :meth:`reset`) take turns, and a flush writes the value current when its
    turn comes, so a flush that raced a truncation's :meth:`reset` never leaves the older,
    higher value in the file.

    Args:
        directory: The shard directory; it must exist. The checkpoint is loaded at once.
        clock: Seconds from an arbitrary origin, for :meth:`maybe_flush`; ``time.monotonic``
            by default. Tests pass a fake clock.
        flush_interval_s: :meth:`maybe_flush` writes a dirty value once this long has
            passed since the last write (or the open).

    Raises:
        CorruptCheckpoint: The file exists but fails its format or CRC check.
        StorageError: The file could not be read.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        clock: Callable[[], float] = time.monotonic,
        flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S,
    ) -> None:
        if flush_interval_s < 0:
            raise InvalidArgument(f"flush_interval_s {flush_interval_s} is negative")
        self._path = Path(directory) / HIGH_WATERMARK_FILE
        self._clock = clock
        self._flush_interval_s = flush_interval_s
        self._lock = threading.Lock()  # the value and its dirty mark
        self._write_lock = threading.Lock()  # one write of the file at a time
        self._value = 0
        self._dirty = False
        self._last_flush_s = clock()
        self.load()

    @property
    def path(self) -> Path:
        """The checkpoint file."""
        return self._path

    @property
    def value(self) -> int:
        """The high watermark in memory (possibly ahead of the file)."""
        return self._value

    @property
    def dirty(self) -> bool:
        """Whether :attr:`value` differs from what was last written or loaded."""
        return self._dirty

    def load(self) -> int:
        """Read the file into :attr:`value` (0 when it is missing), dropping unflushed updates.

        Raises:
            CorruptCheckpoint: The file fails its format or CRC check; nothing changes.
            StorageError: The file could not be read; nothing changes.
        """
        try:
            raw = self._path.read_bytes()
        except FileNotFoundError:
            value = 0
        except OSError as e:
            raise StorageError(f"cannot read {self._path}: {e}") from e
        else:
            value = _decode(raw, self._path)
        self._value = value
        self._dirty = False
        return value

    def update(self, hw: int) -> bool:
        """Move the high watermark up to ``hw`` in memory; return whether it moved.

        A value at or below the current one is ignored (``False``). On a replica the HW only
        grows: a lower value comes from a stale or reordered fetch response (a follower's HW
        trails the leader's by one fetch), and applying it would briefly hide records readers
        have already been served. The one legitimate way down is a log truncation, which
        goes through :meth:`reset`.

        Raises:
            InvalidArgument: ``hw`` is negative.
        """
        if hw < 0:
            raise InvalidArgument(f"high watermark {hw} is negative")
        with self._lock:
            if hw <= self._value:
                return False
            self._value = hw
            self._dirty = True
        return True

    def reset(self, hw: int) -> None:
        """Set the high watermark to ``hw``, lower or not, and write it before returning.

        For a log truncated below the HW (a follower cutting back to the leader's epoch end):
        written at once, because a lazily kept lower value could be overtaken by a crash and
        leave a checkpoint above the log end.

        Raises:
            InvalidArgument: ``hw`` is negative.
            StorageError: The file could not be written; :attr:`value` is unchanged.
        """
        if hw < 0:
            raise InvalidArgument(f"high watermark {hw} is negative")
        with self._write_lock:
            self._write(hw, force=True)

    def flush(self) -> bool:
        """Write :attr:`value` if it is dirty; return whether the file was written.

        Raises:
            StorageError: The file could not be written; the value stays dirty.
        """
        with self._write_lock:
            if not self._dirty:
                return False
            self._write(self._value)
        return True

    def maybe_flush(self) -> bool:
        """:meth:`flush` if the value is dirty and ``flush_interval_s`` has passed since the last write.

        Raises:
            StorageError: The file could not be written; the value stays dirty.
        """
        if not self._dirty or self._clock() - self._last_flush_s < self._flush_interval_s:
            return False
        return self.flush()

    def _write(self, hw: int, *, force: bool = False) -> None:
        try:
            atomic_write(self._path, _encode(hw))
        except OSError as e:
            raise StorageError(f"cannot write {self._path}: {e}") from e
        with self._lock:
            if force or self._value == hw:
                self._value = hw
                self._dirty = False
        self._last_flush_s = self._clock()

    def __repr__(self) -> str:
        state = " dirty" if self._dirty else ""
        return f"HighWatermarkCheckpoint({str(self._path.parent)!r}, {self._value}{state})"


class HighWatermarkWriter(OnDemandThread[HighWatermarkCheckpoint]):
    """Writes high-watermark checkpoints handed to it on a thread that runs only while some are
    queued, so their two fsyncs per shard (file and directory) never hold up an I/O worker's
    drain: 16 shards' checkpoints took a drain 8-15 ms every 5 s.

    A write that fails leaves its checkpoint dirty; it is written again with the next
    :meth:`request` (a stale checkpoint only hides records from readers after a restart,
    until the replica relearns its high watermark), and :meth:`take_failed` hands the
    failed ones to a closing worker.

    Args:
        name: The thread's name.

    Attributes:
        written: Checkpoint files written so far (for tests and stats).
        failures: Writes that raised.
    """

    def __init__(self, name: str = "seglog-high-watermark") -> None:
        super().__init__(name)
        self.written = 0
        self.failures = 0
        self._failed: dict[HighWatermarkCheckpoint, None] = {}

    def request(self, checkpoints: Iterable[HighWatermarkCheckpoint]) -> None:
        """Write ``checkpoints`` in the background, with every earlier failed one."""
        self._enqueue([*self.take_failed(), *checkpoints])

    def take_failed(self) -> list[HighWatermarkCheckpoint]:
        """The checkpoints whose last background write failed (forgotten here)."""
        with self._cond:
            failed = list(self._failed)
            self._failed.clear()
        return failed

    def _serve(self, checkpoint: HighWatermarkCheckpoint) -> bool:
        try:
            wrote = checkpoint.flush()
        except StorageError as exc:
            with self._cond:
                self.failures += 1
                self._failed[checkpoint] = None
            log.warning("%s: writing the high watermark failed (%s); retried later", checkpoint.path, exc)
            return False
        if wrote:
            with self._cond:
                self.written += 1
        return False
