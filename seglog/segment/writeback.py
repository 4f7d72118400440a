"""Segment writeback ahead of the journal's checkpoint, on a thread of its own.

A shard's segment is written to the page cache by every drain and synced only at a
checkpoint (see :mod:`seglog.segment.journal`): when the journal is full, the drain that
finds it full syncs every dirty segment, so it writes back everything the journal held
(64 MiB by default) while its requests, and every request queued behind them, wait. At
16 shards and 50,000 records/s that was one drain of 70-140 ms every ~10 s.

:class:`SegmentWriteback` takes most of that off the drain: as the journal fills, the worker
hands it the paths of its dirty segments, and its thread fdatasyncs them in the background, so
the checkpoint's own syncs find little left to write. It changes no promise: the checkpoint
still syncs every dirty segment itself before the journal is recycled, and a crash before
that replays the journal as before. The extra syncs only make data durable earlier.

Each sync opens the file by path on a descriptor of its own (not a dup of the worker's): a
writeback error is reported once per open file description, and the worker's checkpoint must
still see the errors of its own pages. A file gone meanwhile (truncated away, deleted by
retention) is skipped.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from seglog.segment._on_demand import OnDemandThread

__all__ = ["SegmentWriteback"]

log = logging.getLogger("seglog.segment.writeback")


class SegmentWriteback(OnDemandThread[Path]):
    """Syncs segment files handed to it, one at a time, on a thread that runs only while
    some are queued (idle stores cost no thread).

    Args:
        name: The thread's name.

    Attributes:
        synced: Files synced so far (for tests and stats).
        failed: Syncs that raised (the worker's checkpoint reports the error itself).
    """

    def __init__(self, name: str = "seglog-segment-writeback") -> None:
        super().__init__(name)
        self.synced = 0
        self.failed = 0

    def request(self, paths: Iterable[Path]) -> None:
        """Sync ``paths`` in the background (a path already queued is not queued twice)."""
        self._enqueue(paths)

    def _serve(self, path: Path) -> bool:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        except OSError as exc:
            self._note_failure(path, exc)
            return False
        try:
            # os's, not seglog._fs's: these are not the write path's syncs, whose latency
            # the node's fsync observers measure.
            os.fdatasync(fd)
        except OSError as exc:
            self._note_failure(path, exc)
        else:
            with self._cond:
                self.synced += 1
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)
        return False

    def _note_failure(self, path: Path, exc: OSError) -> None:
        with self._cond:
            self.failed += 1
        log.warning("%s: background writeback failed (%s); the next checkpoint syncs it", path, exc)
