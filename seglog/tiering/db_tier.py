"""One database's tier state: its target, its manifest and the blocking read-through helpers.

The :class:`~seglog.db.Database` of a ``segment``-engine database in a store opened with
``tier=...`` owns one :class:`DbTier`. Every method here blocks (run it with
``asyncio.to_thread``). The local manifest copy lives at ``<db dir>/tier-manifest.json``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from seglog.errors import TierError
from seglog.tiering.manifest import Manifest, ManifestEntry
from seglog.tiering.ops import read_tiered, recover_manifest, upload_segment
from seglog.tiering.targets import TierTarget

__all__ = ["LOCAL_MANIFEST_FILE", "DbTier"]

log = logging.getLogger("seglog.tiering")

LOCAL_MANIFEST_FILE: Final = "tier-manifest.json"


class DbTier:
    """Target + manifest of one database (see the module docstring)."""

    def __init__(self, target: TierTarget, db: str, directory: Path) -> None:
        self.target = target
        self.db = db
        self.local_manifest = directory / LOCAL_MANIFEST_FILE
        self.manifest = Manifest(db)
        self.recovered = False

    # --- recovery ------------------------------------------------------------------------

    def recover(self) -> list[str]:
        """Loads the manifest and resolves half-done uploads/deletes (``recover_manifest``).

        Raises:
            TierError: The tier is unreachable; :meth:`open_blocking` then falls back to the
                local copy and :meth:`upload` retries recovery first.
        """
        manifest, actions = recover_manifest(self.target, self.db, local_manifest=self.local_manifest)
        self.manifest = manifest
        self.recovered = True
        for action in actions:
            log.info("tier recovery of %r: %s", self.db, action)
        return actions

    @classmethod
    def open_blocking(cls, target: TierTarget, db: str, directory: Path) -> DbTier:
        """Opens and recovers; if the tier is down, serves reads from the local manifest copy."""
        tier = cls(target, db, directory)
        try:
            tier.recover()
        except TierError as exc:
            log.warning("tier of %r unreachable at open (%s); using the local manifest copy", db, exc)
            try:
                tier.manifest = Manifest.from_json(tier.local_manifest.read_bytes(), db=db)
            except FileNotFoundError:
                pass
            except (OSError, TierError) as exc2:
                log.warning("unreadable local manifest %s: %s", tier.local_manifest, exc2)
        return tier

    # --- upload --------------------------------------------------------------------------

    def upload(self, shard: int, table: pa.Table) -> ManifestEntry:
        """Tiers one sealed segment's records (after recovering if that failed at open)."""
        if not self.recovered:
            self.recover()
        return upload_segment(self.target, self.manifest, shard, table, local_manifest=self.local_manifest)

    # --- queries -------------------------------------------------------------------------

    def logical_start(self, shard: int, local_start: int) -> int:
        """First offset of the committed objects that run contiguously up to ``local_start``."""
        start = local_start
        for e in reversed(self.manifest.committed(shard, end_offset=max(local_start - 1, 0))):
            if e.base_offset < start <= e.end_offset + 1:
                start = e.base_offset
            elif e.end_offset + 1 < start:
                break
        return start

    def covered_end(self, shard: int, base: int) -> int:
        """Offset after the committed objects that run contiguously from ``base``."""
        end = base
        for e in self.manifest.committed(shard, start_offset=base):
            if e.base_offset <= end <= e.end_offset:
                end = e.end_offset + 1
            elif e.base_offset > end:
                break
        return end

    def cold_bytes(self, shard: int) -> int:
        """Bytes of the committed objects of ``shard``."""
        return sum(e.bytes for e in self.manifest.committed(shard))

    def read(self, shard: int, start: int, end: int, max_records: int) -> pa.Table | None:
        """Records ``[start, end)`` (at most ``max_records``) from the tier, or ``None`` if none."""
        stop = min(end, start + max_records) - 1
        if stop < start:
            return None
        tables = list(read_tiered(self.target, self.manifest, shard, start, end_offset=stop))
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
            for table in read_tiered(self.target, self.manifest, shard, lo, end_offset=hi):
                idx = int(pc.index(pc.greater_equal(table.column("ts"), ts), True).as_py())
                if idx >= 0:
                    return int(table.column("offset")[idx].as_py())
        return None

    def read_key(self, shard: int, key: bytes, start: int, end: int) -> pa.Table | None:
        """Records in ``[start, end)`` whose key is ``key``, or ``None`` if none."""
        if end <= start:
            return None
        out = []
        for table in read_tiered(self.target, self.manifest, shard, start, end_offset=end - 1):
            keys = table.column("key")
            picked = table.filter(pc.fill_null(pc.equal(keys, pa.scalar(key, pa.binary())), False))
            if picked.num_rows:
                out.append(picked)
        return pa.concat_tables(out) if out else None
