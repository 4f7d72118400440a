"""The ``memory`` engine: encoded frames in RAM, nothing on disk."""

from __future__ import annotations

import bisect
import functools
from collections.abc import Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, Final

import numpy as np
import pyarrow as pa

from seglog.engines.base import EngineConfig, Quota
from seglog.engines.frames import (
    FrameTable,
    FrameTableEngine,
    check_leader_epoch,
    encode_batch,
    epochs_after_start,
    epochs_with_frames,
    frame_bytes,
    frame_keys,
    frame_producer,
    parse_frames,
)
from seglog.engines.streams import learn_frames, stamp_batch
from seglog.errors import OffsetOutOfRange
from seglog.io_pool import IoPool
from seglog.record import EncodedFrame, FrameHeader
from seglog.segment.epoch_cache import entries_truncated_from_end
from seglog.segment.producer_state import ProducerStamp

__all__ = ["MemoryEngine"]


class _MemFrame:
    """What the memory engine keeps per frame: its bytes, its keyed records, its streams."""

    __slots__ = ("data", "keys", "streams")

    def __init__(self, data: bytes, keys: list[tuple[bytes, int]], streams: frozenset[int]) -> None:
        self.data = data
        self.keys = keys
        self.streams = streams


def _frame_streams(batch: pa.RecordBatch) -> frozenset[int]:
    return frozenset(np.unique(batch.column("stream").to_numpy()).tolist())


class MemoryEngine(FrameTableEngine):
    """Frames in RAM per shard: the same encoded frames (and CRCs) as the segment engine.

    Per shard it keeps the frames in offset order with a bisectable list of base offsets,
    a running max timestamp (time lookups) and a dict key -> offsets (key lookups), and the
    replica-log state: leader-epoch entries and the high watermark (lost at close with the rest).

    What it cannot do:

    * **Nothing is durable.** Every frame lives in process memory; closing the database (or
      the store, or the process dying) loses all records. Reopening a ``memory`` database
      yields an empty database whose offsets start again at 0 (its config is kept on disk
      like any database's; consumer-group commits are kept too and may point past the end).
    * The store's fsync policy does not apply; an append completes as soon as it is encoded.
    * ``stats().segments`` is 0 and :meth:`disk_bytes` is 0 (no files). The bytes appended
      do count against the store quota until retention, ``truncate_before`` or
      ``drop_db`` frees them (a reopen of the store re-measures and forgets them).
    * Retention and ``truncate_before`` free whole frames (there are no segments; every
      frame, even the newest, is eligible for retention); ``segment_bytes``/``segment_ms``
      are accepted and ignored.
    """

    name: Final = "memory"

    def __init__(self, config: EngineConfig, executor: Executor | None = None) -> None:
        super().__init__(config, [FrameTable() for _ in range(config.shards)], executor)
        self._keys: list[dict[bytes, list[int]]] = [{} for _ in range(config.shards)]

    @classmethod
    def open_blocking(cls, config: EngineConfig, io_pool: IoPool, executor: Executor) -> MemoryEngine:
        """A new, empty engine (the signature every engine factory shares).

        ``io_pool`` is not used: appends complete on the event loop, nothing is written.
        """
        del io_pool
        return cls(config, executor)

    # --- append ------------------------------------------------------------------------

    async def append(self, shard: int, batch: pa.RecordBatch) -> int:
        return (await self.append_many([(shard, batch)]))[0]

    def _encode(
        self, base: int, batch: pa.RecordBatch, leader_epoch: int, producer: tuple[ProducerStamp, int] | None
    ) -> list[tuple[EncodedFrame, list[tuple[bytes, int]], frozenset[int]]]:
        out = []
        stamp = None if producer is None else frame_producer(*producer, 0)
        for frame, part in encode_batch(
            batch, base, compression=self.config.compression, leader_epoch=leader_epoch, producer=stamp
        ):
            out.append((frame, frame_keys(part, frame.header.base_offset), _frame_streams(part)))
        return out

    def _store(
        self, shard: int, frames: Sequence[tuple[EncodedFrame, list[tuple[bytes, int]], frozenset[int]]]
    ) -> None:
        """Add encoded frames to ``shard`` and record the epochs they start."""
        t = self._tables[shard]
        keys = self._keys[shard]
        with t.lock:
            for frame, fkeys, streams in frames:
                t.add(frame.header, _MemFrame(frame_bytes(frame), fkeys, streams))
                for k, o in fkeys:
                    keys.setdefault(k, []).append(o)
            t.epochs = epochs_with_frames(t.epochs, [f.header for f, _, _ in frames], t.start)

    async def append_many(
        self,
        parts: Sequence[tuple[int, pa.RecordBatch]],
        quota: Quota | None = None,
        *,
        leader_epoch: int = 0,
        producer: ProducerStamp | None = None,
    ) -> list[int]:
        """Append batches to distinct shards, frames stamped with ``leader_epoch`` (and
        ``producer``); ``quota`` may veto before anything changes; a new epoch's first frame is
        recorded in the shard's epochs."""
        tables = [self._table(n) for n, _ in parts]
        check_leader_epoch(leader_epoch)
        self._check_not_truncating([n for n, _ in parts])
        # No await between encoding and storing: offsets cannot interleave.
        stamper = self._streams
        try:
            if stamper is not None:
                parts = [
                    (n, stamp_batch(batch, stamper.stamp(batch.column("topic"), n, t.end)))
                    for t, (n, batch) in zip(tables, parts, strict=True)
                ]
            encoded = [
                self._encode(t.end, batch, leader_epoch, None if producer is None else (producer, n))
                for t, (n, batch) in zip(tables, parts, strict=True)
            ]
            if quota is not None:
                quota.admit(sum(f.size for frames in encoded for f, _, _ in frames))
        except BaseException:
            if stamper is not None:
                for t, (n, _) in zip(tables, parts, strict=True):
                    stamper.cut(n, t.end)
            raise
        bases: list[int] = []
        for (n, _), t, frames in zip(parts, tables, encoded, strict=True):
            bases.append(t.end)
            self._store(n, frames)
        listener = self.listener
        if listener is not None:
            for (n, _), frames in zip(parts, encoded, strict=True):
                if frames:
                    listener(n)
        return bases

    async def append_frames(self, shard: int, frames: Any, *, expected_base: int) -> int:
        """Store frames another node encoded, byte for byte (copied), at the end of ``shard``.

        Checked off the loop (magic, lengths, CRC, offset continuity from ``expected_base``);
        each frame keeps its leader epoch.

        Returns:
            The new end offset.

        Raises:
            OffsetMismatch: ``expected_base`` is not the end, or the frames have a gap or an
                overlap; nothing was stored.
            CorruptFrame: A frame fails its checks; nothing was stored.
            BusyResourceError: The shard is being truncated.
        """
        self._table(shard)
        encoded, batches = await self._run(
            functools.partial(parse_frames, frames, expected_base, shard=shard)
        )
        self._check_append_frames(shard, expected_base)  # after the await: the end may have moved
        if self._streams is not None:
            learn_frames(self._streams, shard, encoded, batches)
        self._store(
            shard,
            [
                (f, frame_keys(b, f.header.base_offset), _frame_streams(b))
                for f, b in zip(encoded, batches, strict=True)
            ],
        )
        if self.listener is not None:
            self.listener(shard)
        return self._tables[shard].end

    # --- reads -------------------------------------------------------------------------

    def _fetch(self, shard: int, frames: Sequence[tuple[FrameHeader, Any]]) -> list[bytes]:
        return [extra.data for _, extra in frames]

    def _frame_may_hold(self, extra: Any, stream: int) -> bool:
        return stream in extra.streams

    def _key_offsets(self, shard: int, key: bytes) -> list[int]:
        t = self._table(shard)
        with t.lock:
            return list(self._keys[shard].get(key, ()))

    # --- maintenance -------------------------------------------------------------------

    def _drop_before(self, shard: int, start: int) -> int:
        t = self._tables[shard]
        keys = self._keys[shard]
        with t.lock:
            doomed = t.doomed_before(max(t.start, start))
            freed = t.drop_before(start)
            t.epochs = epochs_after_start(t.epochs, t.start)
            for _, extra in doomed:
                for k, _o in extra.keys:
                    offs = keys.get(k)
                    if offs is None:
                        continue
                    cut = bisect.bisect_left(offs, t.start)
                    if cut >= len(offs):
                        del keys[k]
                    elif cut:
                        del offs[:cut]
        return freed

    def _cut_blocking(self, shard: int, offset: int) -> int:
        t = self._tables[shard]
        keys = self._keys[shard]
        with t.lock:
            new_end = t.cut_point(offset)
            for _, extra in t.doomed_from(new_end):
                for k, _o in extra.keys:
                    offs = keys.get(k)
                    if offs is None:
                        continue
                    del offs[bisect.bisect_left(offs, new_end) :]
                    if not offs:
                        del keys[k]
            t.cut_end(new_end)
            t.epochs = entries_truncated_from_end(t.epochs, new_end)
            t.hw = min(t.hw, new_end)
        if self._streams is not None:
            self._streams.cut(shard, new_end)
        return new_end

    async def _cut(self, shard: int, offset: int) -> int:
        # Off the loop, like the other engines' cuts: appends arriving meanwhile see the shard
        # busy (BusyResourceError), the same contract on every engine.
        new_end: int = await self._run(self._cut_blocking, shard, offset)
        return new_end

    async def truncate_before(self, shard: int, offset: int) -> int:
        """Make ``offset`` the first readable offset (never lowers it); return the frame bytes freed."""
        t = self._table(shard)
        if offset > t.end:
            raise OffsetOutOfRange(offset, t.start, t.end, shard=shard)
        return self._drop_before(shard, offset)

    async def enforce_retention(
        self,
        retention_bytes: int | None,
        retention_ms: int | None,
        now_us: int,
        floors: Sequence[int | None],
    ) -> int:
        """Drop whole frames past retention, oldest first, never at/above ``floors[shard]``."""
        if retention_bytes is None and retention_ms is None:
            return 0
        freed = 0
        for n, t in enumerate(self._tables):
            with t.lock:
                start = t.retention_start(retention_bytes, retention_ms, now_us, floors[n])
            if start is not None:
                freed += self._drop_before(n, start)
        return freed

    async def drain(self) -> None:
        """Appends complete synchronously: nothing to wait for."""

    def disk_bytes(self) -> int:
        """0: nothing is on disk."""
        return 0

    @staticmethod
    def measure_bytes(directory: Path) -> int:
        """0: a memory database keeps no data files (the store's quota measure)."""
        del directory
        return 0

    async def close(self) -> None:
        """Forget every frame (see the class docstring); idempotent."""
        if self._closed:
            return
        self._closed = True
        for t, keys in zip(self._tables, self._keys, strict=True):
            with t.lock:
                t.drop_before(t.end)
            keys.clear()
