"""The tier of one database: a :class:`DbTier` driven together with the database's engine.

:class:`TierOrchestrator` is the :class:`~seglog.tiering.seam.TieredStorage` of a database
(Kafka's ``RemoteLogManager`` for one log): it decides what to upload and when a local
segment may go, and serves offsets below the local start from the tier. It reaches the
engine only through :class:`~seglog.engines.base.SegmentedEngine` (segment ranges, seal,
reads), and the tier only through :class:`~seglog.tiering.db_tier.DbTier`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Mapping

import pyarrow as pa
import pyarrow.compute as pc

from seglog.db_config import DbConfig
from seglog.engines.base import (
    READ_SCHEMA,
    GenerationEngine,
    SegmentedEngine,
    StreamBatch,
    StreamEngine,
    StreamRead,
    retention_start,
)
from seglog.errors import InvalidArgument, OffsetOutOfRange, TierFenced
from seglog.tiering.db_tier import DbTier
from seglog.tiering.manifest import Manifest, ManifestEntry
from seglog.tiering.parquet import StreamStructures
from seglog.tiering.seam import ColdStats, Release

__all__ = ["TierOrchestrator"]

log = logging.getLogger("seglog.tiering")

# Reads that keep finding the local start moved under them fall back to the engine (whose
# error then names the current range) rather than loop while retention runs.
_READ_ATTEMPTS = 3


class TierOrchestrator:
    """Tiering of one database over its engine (see the module docstring).

    Args:
        tier: The database's target and manifest (recovered, or serving the local copy).
        engine: The database's engine.
        clock_us: The store clock, for time-based retention.
    """

    def __init__(self, tier: DbTier, engine: SegmentedEngine, clock_us: Callable[[], int]) -> None:
        self._tier = tier
        self._engine = engine
        self._clock_us = clock_us
        # One upload, truncation or retention pass at a time: each reads the manifest and the
        # segment list, then changes both, and two interleaved would tier or delete twice.
        self._lock = asyncio.Lock()
        # Shared tiers: the shards this node leads, {shard: leader epoch}, asked at each pass.
        self._leads: Callable[[], Mapping[int, int]] | None = None

    def follow_leads(self, leads: Callable[[], Mapping[int, int]] | None) -> None:
        """Shared tiers (a replicated database): ``leads()`` names the shards this node leads
        and their leader epochs; only those are uploaded, each up to its high watermark."""
        self._leads = leads

    @property
    def manifest(self) -> Manifest:
        """The database's manifest (what the tier holds)."""
        return self._tier.manifest

    # --- queries -------------------------------------------------------------------------

    def logical_start(self, shard: int, local_start: int) -> int:
        """First readable offset of ``shard`` (see :meth:`DbTier.logical_start`)."""
        return self._tier.logical_start(shard, local_start)

    def tiered_end(self, shard: int) -> int:
        """Offset after the last record of ``shard`` committed in the tier (0: none)."""
        return self._tier.tiered_end(shard)

    async def committed_end(self, shard: int) -> int:
        """:meth:`tiered_end` as the tier holds it now (a shared manifest is read again first).

        Raises:
            TierError: The tier could not be read.
        """
        tier = self._tier
        async with self._lock:  # the manifest is not re-read under a pass that changes it
            if tier.shared or not tier.recovered:
                await asyncio.to_thread(tier.recover)
            return tier.tiered_end(shard)

    def cold_stats(self, shard: int) -> ColdStats:
        """Committed objects of ``shard`` and their bytes."""
        return ColdStats(self._tier.cold_bytes(shard), len(self._tier.manifest.committed(shard)))

    # --- upload --------------------------------------------------------------------------

    async def tier_now(self, config: DbConfig, release: Release) -> list[ManifestEntry]:
        """Upload every sealed, not yet committed local segment, then apply local retention.

        Segments are read as Arrow tables and uploaded in a worker thread; appends go on
        meanwhile. A local segment is only deleted once its records are committed in the
        tier, and only as ``local_retention_bytes``/``local_retention_ms`` allow.

        Returns:
            The manifest entries committed by this call.

        Raises:
            TierError: The tier failed (nothing local is lost; call again later).
        """
        engine, tier = self._engine, self._tier
        async with self._lock:
            if tier.shared:
                leads = dict(self._leads()) if self._leads is not None else {}
                await asyncio.to_thread(tier.sync_leads, leads)
            elif not tier.recovered:
                await asyncio.to_thread(tier.recover)
            done: list[ManifestEntry] = []
            for shard in range(config.shards):
                if not tier.writes(shard):
                    continue
                # Shared: only records every in-sync replica has, which no leader change can
                # take back, so whichever replica leads next holds the same ones.
                bound = engine.high_watermark(shard) if tier.shared else None
                try:
                    done += await self._upload_shard(shard, bound)
                except TierFenced as exc:
                    log.info("tier of %r: shard %d: %s", tier.db, shard, exc)
            freed = 0
            for shard in range(config.shards):
                freed += await self._local_retention(config, shard)
            if freed:
                release(freed)
            return done

    async def _upload_shard(self, shard: int, bound: int | None) -> list[ManifestEntry]:
        """Upload the sealed segments of ``shard`` not yet committed, up to ``bound`` (hold the lock)."""
        engine, tier = self._engine, self._tier
        done = []
        for seg in engine.segment_ranges(shard):
            if not seg.sealed or seg.end <= seg.start:
                continue
            if bound is not None and seg.end > bound:
                break
            lo = tier.covered_end(shard, seg.start)
            if lo >= seg.end:
                continue
            try:
                table = await engine.read_arrow(shard, lo, seg.end - lo)
            except OffsetOutOfRange:
                continue  # retention removed it meanwhile
            if table.num_rows:
                streams = self._stream_structures(shard, table)
                done.append(await asyncio.to_thread(tier.upload, shard, table, streams))
        return done

    def _stream_structures(self, shard: int, table: pa.Table) -> StreamStructures | None:
        """The learned structure of each stream in ``table`` (None: the database has no streams)."""
        engine = self._engine
        if not isinstance(engine, StreamEngine) or not engine.streams_enabled:
            return None
        lookup = engine.stream_structure
        if isinstance(engine, GenerationEngine) and engine.generations_enabled:
            # Stream ids are per generation: name the structures of the generation the rows
            # belong to; rows of several generations (or a dropped one) get no structures
            # (readers then keep every row).
            gens = engine.list_generations()
            offsets = table.column("offset")
            first, last = int(offsets[0].as_py()), int(offsets[-1].as_py())
            i = max(k for k, g in enumerate(gens) if g.starts[shard] <= first or k == 0)
            if gens[i].dropped or (i + 1 < len(gens) and last >= gens[i + 1].starts[shard]):
                return None
            generation = gens[i].id
            lookup = functools.partial(engine.generation_stream_structure, generation)
        out: dict[int, tuple[tuple[str, ...], bool]] = {}
        for sid in pc.unique(table.column("stream")).to_pylist():
            found = lookup(shard, sid)
            if found is not None:  # unknown ids stay out: readers then keep their rows
                out[sid] = found
        return out

    async def _local_retention(self, config: DbConfig, shard: int) -> int:
        """Delete committed local segments past local retention (oldest first); bytes freed."""
        if config.local_retention_bytes is None and config.local_retention_ms is None:
            return 0
        engine, tier = self._engine, self._tier
        with_ts = config.local_retention_ms is not None
        segs = await asyncio.to_thread(engine.segment_ranges, shard, with_ts=with_ts)
        total = sum(seg.size for seg in segs)
        now = self._clock_us()
        new_start: int | None = None
        for seg in segs[:-1]:
            if seg.end > seg.start and tier.covered_end(shard, seg.start) < seg.end:
                break  # not committed: never deleted locally
            by_bytes = (
                config.local_retention_bytes is not None and total - seg.size >= config.local_retention_bytes
            )
            by_time = config.local_retention_ms is not None and (
                seg.max_ts is None or now - seg.max_ts > config.local_retention_ms * 1000
            )
            if not (by_bytes or by_time):
                break
            total -= seg.size
            new_start = seg.end
        if new_start is None:
            return 0
        freed: int = await engine.truncate_before(shard, new_start)
        return freed

    # --- read-through --------------------------------------------------------------------

    async def read_arrow(self, shard: int, offset: int, max_records: int) -> pa.Table:
        """Records from ``offset``: from the tier below the local start, else from the engine.

        Raises:
            OffsetOutOfRange: ``offset`` is below the logical start or past the end.
        """
        engine, tier = self._engine, self._tier
        for _ in range(_READ_ATTEMPTS):
            local_start = engine.start_offset(shard)
            if offset < local_start:
                start = tier.logical_start(shard, local_start)
                if offset < start:
                    raise OffsetOutOfRange(offset, start, engine.end_offset(shard), shard=shard)
                table = await asyncio.to_thread(tier.read, shard, offset, local_start, max_records)
                if table is not None:
                    return table.cast(READ_SCHEMA)
            try:
                return await engine.read_arrow(shard, offset, max_records)
            except OffsetOutOfRange:
                # Local retention moved the local start meanwhile: read through the tier.
                if offset >= engine.start_offset(shard):
                    raise
        return await engine.read_arrow(shard, offset, max_records)

    async def read_stream(
        self, shard: int, offset: int, want: StreamRead, max_records: int, max_frames: int
    ) -> StreamBatch:
        """Records of one stream from ``offset``: the tier's below the local start, then the
        engine's (a call reads from one of them; the batch says where the next goes on)."""
        engine, tier = self._engine, self._tier
        if not isinstance(engine, StreamEngine):
            raise InvalidArgument("this database has no streams")
        local_start = engine.start_offset(shard)
        if offset < local_start:
            start = max(offset, tier.logical_start(shard, local_start))
            batch = await asyncio.to_thread(tier.read_stream, shard, start, local_start, want, max_records)
            if batch.table.num_rows or batch.next_offset < local_start:
                return batch
            offset = batch.next_offset  # nothing of it in the tier: go on locally in this call
        return await engine.read_stream(shard, offset, want, max_records, max_frames)

    async def offset_for_time(self, shard: int, ts: int) -> int:
        """First offset whose record has ``ts >=`` the given one, tier first; the end offset if none."""
        engine, tier = self._engine, self._tier
        while True:
            local_start = engine.start_offset(shard)
            start = tier.logical_start(shard, local_start)
            found = await asyncio.to_thread(tier.offset_for_time, shard, ts, start, local_start)
            if found is not None:
                return found
            offset = await engine.offset_for_time(shard, ts)
            # Unchanged local start: the engine answered over exactly what the tier did not.
            if engine.start_offset(shard) == local_start:
                return offset

    async def read_key(self, shard: int, key: bytes) -> pa.Table:
        """Every record of ``shard`` with ``key``, tiered ones first, in offset order."""
        engine, tier = self._engine, self._tier
        while True:
            local_start = engine.start_offset(shard)
            start = tier.logical_start(shard, local_start)
            cold = await asyncio.to_thread(tier.read_key, shard, key, start, local_start)
            hot = await engine.read_key(shard, key)
            # A moved local start would leave a gap (or an overlap) between the two parts.
            if engine.start_offset(shard) == local_start:
                return hot if cold is None else pa.concat_tables([cold.cast(READ_SCHEMA), hot])

    # --- truncation and retention --------------------------------------------------------

    async def truncate_before(self, shard: int, offset: int, release: Release) -> int:
        """Make ``offset`` the first readable offset: local segments and tier objects below it go.

        Returns:
            Bytes of local segment files removed (also passed to ``release``).

        Raises:
            OffsetOutOfRange: ``offset`` is past the end offset.
        """
        async with self._lock:
            return await self._truncate_locked(shard, offset, release)

    async def _truncate_locked(self, shard: int, offset: int, release: Release) -> int:
        """Truncate local segments and tier objects below ``offset`` (hold the lock)."""
        engine = self._engine
        end = engine.end_offset(shard)
        if offset > end:
            start = self._tier.logical_start(shard, engine.start_offset(shard))
            raise OffsetOutOfRange(offset, start, end, shard=shard)
        freed = 0
        if offset > engine.start_offset(shard):
            freed = await engine.truncate_before(shard, offset)
            if freed:
                release(freed)
        # The floor also covers what tier_now uploaded since; the deletions are retried here.
        await asyncio.to_thread(self._tier.truncate_before, shard, offset)
        return freed

    async def truncate_to(self, shard: int, offset: int, *, force: bool) -> int:
        """The engine's ``truncate_to``, refused below :meth:`tiered_end` (tiered records stay).

        Raises:
            InvalidArgument: ``offset`` is below what was tiered (or the engine's reasons).
        """
        async with self._lock:
            # Shared: the tier holds the leaders' committed records. A replica cutting records
            # that diverged from them (a deposed leader's unreplicated tail, found below what
            # the new leader tiered since) cuts only its own copy; a committed record is never
            # cut, as replication guarantees.
            tiered = 0 if self._tier.shared else self._tier.tiered_end(shard)
            if offset < tiered:
                raise InvalidArgument(
                    f"shard {shard}: offsets below {tiered} are tiered; truncate_to({offset}) would cut them"
                )
            return await self._engine.truncate_to(shard, offset, force=force)

    async def enforce_retention(self, config: DbConfig, floors: list[int | None], release: Release) -> int:
        """``retention_bytes``/``retention_ms`` over each shard's whole log (tier objects, then
        local sealed segments), never past ``floors[shard]``.

        Returns:
            Bytes of local segment files removed (each shard's also passed to ``release``).
        """
        freed = 0
        async with self._lock:
            for shard in range(config.shards):
                start = await asyncio.to_thread(self._whole_log_retention_start, config, shard, floors[shard])
                if start is not None:
                    freed += await self._truncate_locked(shard, start, release)
        return freed

    def _whole_log_retention_start(self, config: DbConfig, shard: int, floor: int | None) -> int | None:
        """Retention over a tiered shard's whole log: cold objects, then local sealed segments.

        Same rules as the local case (oldest first, whole units, never the active segment, not
        past a group's committed offset). Cold objects count with their Parquet size.
        """
        tier = self._tier
        local = self._engine.segment_ranges(shard, with_ts=config.retention_ms is not None)
        cold = tier.cold_run(shard, local[0].start)
        units: list[tuple[int, int, int | None]] = [(e.end_offset + 1, e.bytes, e.max_ts) for e in cold]
        units += [(seg.end, seg.size, seg.max_ts) for seg in local[:-1]]
        total = sum(size for _, size, _ in units) + local[-1].size
        new_start = retention_start(
            units, total, config.retention_bytes, config.retention_ms, self._clock_us(), floor
        )
        if new_start is None or new_start <= tier.logical_start(shard, local[0].start):
            return None
        return new_start

    async def close(self) -> None:
        """Wait out a running upload, truncation or retention (the engine is closed apart)."""
        async with self._lock:
            pass
