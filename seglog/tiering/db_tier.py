"""One database's tier state: its target, its manifest and the blocking read-through helpers.

The :class:`~seglog.db.Database` of a ``segment``-engine database in a store opened with
``tier=...`` owns one :class:`DbTier`. Every method here blocks (run it with
``asyncio.to_thread``). The local manifest copy lives at ``<db dir>/tier-manifest.json``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from seglog.engines.base import READ_SCHEMA, StreamBatch, StreamRead, empty_read_table
from seglog.engines.streams import stream_rows
from seglog.errors import TierError, TierFenced
from seglog.tiering.manifest import CHECKPOINT_DIR, EntryState, Manifest, ManifestEntry, manifest_key
from seglog.tiering.ops import delete_tiered, recover_manifest, upload_segment
from seglog.tiering.parquet import StreamStructures
from seglog.tiering.read_cache import TierReadCache
from seglog.tiering.targets import TierTarget

__all__ = ["LOCAL_MANIFEST_FILE", "DbTier", "cold_run", "logical_start"]

log = logging.getLogger("seglog.tiering")

LOCAL_MANIFEST_FILE: Final = "tier-manifest.json"


def cold_run(manifest: Manifest, shard: int, local_start: int) -> list[ManifestEntry]:
    """The committed objects of ``manifest`` that run contiguously up to ``local_start``, oldest first."""
    start = manifest.run_start(shard, local_start)
    if start is None:
        return []
    return manifest.committed(shard, start_offset=start, end_offset=local_start - 1)


def logical_start(manifest: Manifest, shard: int, local_start: int) -> int:
    """First readable offset of ``shard``: the start of the contiguous cold run before
    ``local_start``, but never below the retention floor (:meth:`Manifest.log_start`)."""
    start = manifest.run_start(shard, local_start)
    if start is None:
        start = local_start
    return max(start, min(manifest.log_start(shard), local_start))


class DbTier:
    """Target + manifest of one database (see the module docstring).

    Args:
        target: Where the database's objects are.
        db: The database's name.
        directory: The database's directory (for the local manifest copy).
        cache: Where reads keep verified objects and decoded row groups (the store's;
            ``None``: a cache of its own, of the default capacity).
    """

    def __init__(
        self,
        target: TierTarget,
        db: str,
        directory: Path,
        cache: TierReadCache | None = None,
        *,
        shared: bool = False,
    ) -> None:
        self.target = target
        self.db = db
        self.local_manifest = directory / LOCAL_MANIFEST_FILE
        # Shared: a replicated database, whose shards are tiered by their leaders
        # (Manifest.load_shared); this node writes only the shards it claimed.
        self.shared = shared
        self.manifest = Manifest(db)
        self.recovered = False
        self.cache = cache if cache is not None else TierReadCache()

    # --- recovery ------------------------------------------------------------------------

    def recover(self) -> list[str]:
        """Loads the manifest and resolves half-done uploads/deletes (``recover_manifest``).

        Raises:
            TierError: The tier is unreachable; :meth:`open_blocking` then falls back to the
                local copy and :meth:`upload` retries recovery first.
        """
        if self.shared:
            # Nothing to resolve for the whole database: a shard's half-done steps are its
            # next writer's to finish, when it claims the shard (Manifest.claim).
            if self.manifest.shared:
                self.manifest.refresh(self.target)
            else:
                self.manifest = Manifest.load_shared(self.target, self.db)
            self.recovered = True
            return []
        manifest, actions = recover_manifest(self.target, self.db, local_manifest=self.local_manifest)
        self.manifest = manifest
        self.recovered = True
        for action in actions:
            log.info("tier recovery of %r: %s", self.db, action)
        return actions

    @classmethod
    def open_blocking(
        cls,
        target: TierTarget,
        db: str,
        directory: Path,
        cache: TierReadCache | None = None,
        *,
        shared: bool = False,
    ) -> DbTier:
        """Opens and recovers; if the tier is down, serves reads from the local manifest copy."""
        tier = cls(target, db, directory, cache, shared=shared)
        try:
            tier.recover()
        except TierError as exc:
            log.warning("tier of %r unreachable at open (%s); using the local manifest copy", db, exc)
            try:
                tier.manifest = Manifest.load_local(tier.local_manifest, db, shared=shared)
            except FileNotFoundError:
                pass
            except (OSError, TierError) as exc2:
                log.warning("unreadable local manifest %s: %s", tier.local_manifest, exc2)
        return tier

    # --- leaders (shared) ------------------------------------------------------------------

    def sync_leads(self, leads: Mapping[int, int]) -> None:
        """Shared: take in other leaders' saves, then write exactly the shards this node leads
        now (``{shard: leader epoch}``): release the others, claim the new ones.

        A claim the tier refuses (a newer leader claimed it) or cannot take now is logged and
        left for the next call.

        Raises:
            TierError: The tier could not be read (nothing changed; call again).
        """
        self.recover()  # refresh: the newest copy, and the shards lost to newer leaders
        owned = self.manifest.owned()
        for shard, epoch in owned.items():
            if leads.get(shard) != epoch:
                self.manifest.release(shard)
        for shard, epoch in sorted(leads.items()):
            if owned.get(shard) == epoch:
                continue
            try:
                for action in self.manifest.claim(self.target, shard, epoch):
                    log.info("tier of %r, shard %d claimed at epoch %d: %s", self.db, shard, epoch, action)
            except TierFenced as exc:
                log.info("tier of %r: not claiming shard %d: %s", self.db, shard, exc)
            except TierError as exc:
                log.warning("tier of %r: claiming shard %d failed (%s); retrying later", self.db, shard, exc)

    def writes(self, shard: int) -> bool:
        """Whether this node uploads and deletes ``shard``'s objects (always, unless shared)."""
        return not self.shared or shard in self.manifest.owned()

    # --- upload --------------------------------------------------------------------------

    def upload(self, shard: int, table: pa.Table, streams: StreamStructures | None = None) -> ManifestEntry:
        """Tiers one sealed segment's records (after recovering if that failed at open);
        ``streams``: the structures of its streams (see :func:`upload_segment`)."""
        if not self.recovered:
            self.recover()
        return upload_segment(
            self.target, self.manifest, shard, table, local_manifest=self.local_manifest, streams=streams
        )

    # --- queries -------------------------------------------------------------------------

    def cold_run(self, shard: int, local_start: int) -> list[ManifestEntry]:
        """The committed objects that run contiguously up to ``local_start``, oldest first."""
        return cold_run(self.manifest, shard, local_start)

    def logical_start(self, shard: int, local_start: int) -> int:
        """First readable offset: the start of the contiguous cold run before ``local_start``,
        but never below the retention floor (:meth:`Manifest.log_start`)."""
        return logical_start(self.manifest, shard, local_start)

    def truncate_before(self, shard: int, offset: int) -> int:
        """Raise the shard's retention floor to ``offset`` and delete the objects wholly below it.

        The floor is saved (local copy first) before any object goes, so reads stop at it at
        once. A tier failure is logged, not raised: the next call deletes what is left.

        Returns:
            Bytes of the objects deleted.
        """
        if not self.writes(shard):
            return 0  # the shard's leader moves the floor and deletes its objects
        moved = self.manifest.raise_log_start(shard, offset)
        floor = self.manifest.log_start(shard)
        freed = 0
        try:
            if moved:
                self.manifest.save(self.target, local_path=self.local_manifest)
            for e in self.manifest.committed(shard, end_offset=floor - 1):
                if e.end_offset < floor:
                    delete_tiered(self.target, self.manifest, e.key, local_manifest=self.local_manifest)
                    freed += e.bytes
        except TierError as exc:
            log.warning(
                "tier of %r: deleting objects of shard %d below %d failed (%s); retrying later",
                self.db,
                shard,
                floor,
                exc,
            )
        return freed

    def drop_all(self) -> int:
        """Delete every object of the database and its manifest from the tier; objects deleted.

        Committed entries are marked ``deleting`` and saved first, so a crash part-way leaves a
        manifest whose recovery finishes the job rather than one pointing at missing objects.

        Raises:
            TierError: The tier failed; call again (it is idempotent).
        """
        if not self.shared:
            # Shared: every replica's drop deletes everything; there is nothing to claim.
            for e in self.manifest.entries(EntryState.COMMITTED):
                self.manifest.mark_deleting(e.key)
            self.manifest.save(self.target, local_path=self.local_manifest)
        manifest = manifest_key(self.db)
        checkpoints = f"{self.db}/{CHECKPOINT_DIR}/"
        keys = [k for k in self.target.list(f"{self.db}/") if k != manifest and not k.startswith(checkpoints)]
        for key in keys:
            self.target.delete(key)
        # The head before the checkpoint it names: a crash in between leaves garbage, never a
        # head naming a missing checkpoint (which no open, and so no drop, could read).
        self.target.delete(manifest)
        for key in self.target.list(checkpoints):
            self.target.delete(key)
        Manifest.remove_local(self.local_manifest)
        return len(keys)

    def covered_end(self, shard: int, base: int) -> int:
        """Offset after the committed objects that run contiguously from ``base``."""
        end = base
        for e in self.manifest.committed(shard, start_offset=base):
            if e.base_offset <= end <= e.end_offset:
                end = e.end_offset + 1
            elif e.base_offset > end:
                break
        return end

    def tiered_end(self, shard: int) -> int:
        """Offset after the last record of ``shard`` in a committed object (0: none)."""
        end = self.manifest.tiered_end(shard)
        return 0 if end is None else end + 1

    def cold_bytes(self, shard: int) -> int:
        """Bytes of the committed objects of ``shard``."""
        return self.manifest.committed_bytes(shard)

    def _rows(
        self, shard: int, first: int, last: int, *, stream: int | None = None, fill: bool = True
    ) -> Iterator[pa.Table]:
        """Tiered rows of ``shard`` with offsets in ``[first, last]``, in offset order, through
        the read cache (one download per object while it stays cached; ``fill=False`` keeps
        nothing new)."""
        for entry in self.manifest.committed(shard, start_offset=first, end_offset=last):
            yield from self.cache.rows(self.target, entry, first, last, stream=stream, fill=fill)

    def read(self, shard: int, start: int, end: int, max_records: int) -> pa.Table | None:
        """Records ``[start, end)`` (at most ``max_records``) from the tier, or ``None`` if none."""
        stop = min(end, start + max_records) - 1
        if stop < start:
            return None
        tables = list(self._rows(shard, start, stop))
        if not tables:
            return None
        return pa.concat_tables(tables)

    def offset_for_time(self, shard: int, ts: int, start: int, end: int) -> int | None:
        """First offset in ``[start, end)`` whose record has ``ts >=`` the given one, or ``None``."""
        if end <= start:
            return None
        for e in self.manifest.committed(shard, start_offset=start, end_offset=end - 1, start_ts=ts):
            lo = max(start, e.base_offset)
            hi = min(end - 1, e.end_offset)
            for table in self.cache.rows(self.target, e, lo, hi):
                idx = int(pc.index(pc.greater_equal(table.column("ts"), ts), True).as_py())
                if idx >= 0:
                    return int(table.column("offset")[idx].as_py())
        return None

    def read_stream(
        self, shard: int, start: int, end: int, want: StreamRead, max_records: int
    ) -> StreamBatch:
        """Up to ``max_records`` records of stream ``want`` in ``[start, end)`` from the tier.

        Row groups whose statistics rule the stream out are not decoded. The batch goes on at
        the offset after the last record taken when full, else at ``end`` (everything in
        between was looked at). ``frames_read`` counts the row groups looked at.
        """
        got: list[pa.Table] = []
        room = max_records
        groups = 0
        if end > start:
            for table in self._rows(shard, start, end - 1, stream=want.stream):
                groups += 1
                rows = stream_rows(table, 0, table.num_rows, want)
                if not len(rows):
                    continue
                rows = rows[:room]
                got.append(table.take(pa.array(rows)))
                room -= len(rows)
                if not room:
                    next_offset = int(table.column("offset")[int(rows[-1])].as_py()) + 1
                    return StreamBatch(_read_table(got), next_offset, groups)
        return StreamBatch(_read_table(got), max(start, end), groups)

    def read_key(self, shard: int, key: bytes, start: int, end: int) -> pa.Table | None:
        """Records in ``[start, end)`` whose key is ``key``, or ``None`` if none."""
        if end <= start:
            return None
        out = []
        # The whole history: what readers have cached is used, nothing new is kept (a key
        # read of a history bigger than the cache would otherwise evict all of it).
        for table in self._rows(shard, start, end - 1, fill=False):
            keys = table.column("key")
            picked = table.filter(pc.fill_null(pc.equal(keys, pa.scalar(key, pa.binary())), False))
            if picked.num_rows:
                out.append(picked)
        return pa.concat_tables(out) if out else None


def _read_table(tables: list[pa.Table]) -> pa.Table:
    if not tables:
        return empty_read_table()
    return pa.concat_tables(tables).cast(READ_SCHEMA).combine_chunks()
