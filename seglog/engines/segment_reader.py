"""Reading a ``segment``-engine database from outside the process that owns it.

The :class:`~seglog.engines.base.EngineReader` and
:data:`~seglog.engines.registry.ReadShardFiles` of the segment engine: followers and
``seglog stats`` read the shard directories through these, so the engine's file layout
(shard directory names, segment files, checkpoint, durable-end marker) stays here. Nothing
here takes a lock, creates or writes a file; the frame reading itself is
:class:`~seglog.segment.shard_reader.ShardReader` (why ``pread`` and what it trusts are
explained there).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from seglog.engines.base import ShardFiles
from seglog.engines.segment import shard_dir_name
from seglog.errors import InvalidArgument, StorageError
from seglog.record import FRAME_HEADER_BYTES, parse_header
from seglog.segment.durable_end import read_durable_end
from seglog.segment.log_segment import segment_name
from seglog.segment.shard_reader import ShardReader, list_segment_bases

__all__ = ["SegmentEngineReader", "SegmentShardCursor", "open_segment_reader", "segment_shard_files"]


class SegmentShardCursor(ShardReader):
    """A :class:`~seglog.engines.base.ShardCursor` on one shard directory: a ShardReader
    that also answers :meth:`durable_end` under the protocol's name."""

    def durable_end(self) -> int | None:
        """The owner's acknowledged end offset (``None``: a store written before the marker)."""
        return self.acknowledged_end()


class SegmentEngineReader:
    """Cross-process read-only access to a ``segment``-engine database directory.

    Holds nothing itself: each cursor opens (and closes) its own segment files.
    """

    def __init__(self, directory: Path, shards: int) -> None:
        self.directory = directory
        self.shards = shards

    def open_shard(self, shard: int) -> SegmentShardCursor:
        """A cursor on ``shard`` (see :class:`~seglog.engines.base.EngineReader`).

        Raises:
            InvalidArgument: The database has no such shard.
        """
        if not 0 <= shard < self.shards:
            raise InvalidArgument(f"shard {shard} out of range 0..{self.shards - 1}")
        return SegmentShardCursor(self.directory / shard_dir_name(shard))

    def close(self) -> None:
        """Nothing to release (cursors own their files); kept for the protocol."""


def open_segment_reader(directory: Path, shards: int) -> SegmentEngineReader:
    """The segment engine's :data:`~seglog.engines.registry.OpenReader`."""
    return SegmentEngineReader(directory, shards)


def _segment_end(directory: Path, base: int) -> int:
    """The end offset of a segment from its frame headers (no marker: an older store)."""
    path = directory / segment_name(base)
    end = base
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return end
    try:
        size = os.fstat(fd).st_size
        pos = 0
        while pos + FRAME_HEADER_BYTES <= size:
            try:
                header = parse_header(os.pread(fd, FRAME_HEADER_BYTES, pos), 0)
            except StorageError:
                break  # a torn tail: the owner's recovery cuts it
            if header.base_offset != end or pos + header.size > size:
                break
            pos += header.size
            end = header.next_offset
    finally:
        os.close(fd)
    return end


def _shard_files(directory: Path) -> ShardFiles:
    """Offsets and segment sizes of one shard directory."""
    if not directory.is_dir():
        return ShardFiles(0, 0)
    bases = list_segment_bases(directory)
    sizes = []
    for base in bases:
        with contextlib.suppress(FileNotFoundError):  # retention removed it meanwhile
            sizes.append((directory / segment_name(base)).stat().st_size)
    start = ShardReader(directory).start_offset()
    marker = read_durable_end(directory)
    end = marker.next_offset if marker is not None else start
    if marker is None and bases:  # a store written before the marker existed
        end = _segment_end(directory, bases[-1])
    return ShardFiles(start, max(start, end), tuple(sizes))


def segment_shard_files(directory: Path, shards: int) -> list[ShardFiles]:
    """The segment engine's :data:`~seglog.engines.registry.ReadShardFiles`."""
    return [_shard_files(directory / shard_dir_name(n)) for n in range(shards)]
