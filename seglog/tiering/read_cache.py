"""Reads of tiered objects: ranged fetches of the row groups a read needs, each fetched once.

A tiered object is a whole segment in Parquet (tens to hundreds of MB); a consumer reads it
1000 records per call. Objects tiered with their parts in the manifest
(:class:`~seglog.tiering.manifest.ObjectPart`: each row group's byte span, the page
indexes', the footer's, each with a CRC32C) are read by ranged GETs: the footer, then only the
row groups that hold the offsets asked for, each checked against its CRC32C before Parquet
decodes a byte of it. Older objects (no parts) are downloaded whole and checked against
their sha256. :class:`TierReadCache` (one per store, shared by its databases'
:class:`~seglog.tiering.db_tier.DbTier`) keeps, least recently used out first and within
``capacity_bytes`` in all:

* the verified bytes fetched (parts, or whole objects), so the next read of the same row
  group or footer costs no request;
* decoded row groups (:data:`~seglog.tiering.parquet.SEGMENT_SCHEMA` tables), so the next
  slice of the same row group costs neither decoding nor a copy;
* each object's layout (the offset range and stream-id range of every row group, from the
  Parquet footer): a few dozen bytes per row group, kept with the rest.

Entries are keyed by object key *and* checksum: objects are immutable once committed, and an
object re-uploaded under the same key with other bytes is another entry. An item larger than
the whole capacity is read but not kept (capacity 0 turns the cache off: every read fetches
again). Readers run in worker threads: the maps are guarded by one lock, held only to look
up, insert and evict (never across a download or a decode), so two threads that miss the
same part both fetch it.
"""

from __future__ import annotations

import bisect
import io
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import crc32c
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from seglog.errors import InvalidArgument, TierError
from seglog.tiering.manifest import ManifestEntry
from seglog.tiering.parquet import TIER_SCHEMA, footer_metadata, to_segment_table
from seglog.tiering.seam import DEFAULT_TIER_CACHE_BYTES, TierCacheStats
from seglog.tiering.targets import ObjectMismatch, TierTarget, verify_bytes

__all__ = ["DEFAULT_TIER_CACHE_BYTES", "ObjectLayout", "RowGroupRange", "TierReadCache"]

# Bookkeeping charged per cached item on top of its data (dict entries, the objects).
_ENTRY_OVERHEAD_BYTES: Final = 256
_LAYOUT_ROW_GROUP_BYTES: Final = 64


@dataclass(frozen=True)
class RowGroupRange:
    """One row group of a tiered object: its offsets and stream ids (from the footer)."""

    index: int
    first_offset: int
    last_offset: int
    min_stream: int | None  # None: the footer has no statistics for ``stream``
    max_stream: int | None

    def may_hold_stream(self, stream: int) -> bool:
        """Whether the row group can hold rows of ``stream`` (by its statistics)."""
        if self.min_stream is None or self.max_stream is None:
            return True
        return self.min_stream <= stream <= self.max_stream


@dataclass(frozen=True)
class ObjectLayout:
    """The row groups of one tiered object, in offset order."""

    row_groups: tuple[RowGroupRange, ...]

    def overlapping(self, first: int, last: int) -> list[RowGroupRange]:
        """Row groups holding offsets in ``[first, last]``."""
        return [g for g in self.row_groups if g.last_offset >= first and g.first_offset <= last]


def _layout(parquet: pq.ParquetFile, key: str) -> ObjectLayout:
    meta = parquet.metadata
    names = parquet.schema_arrow.names
    try:
        offset_col, stream_col = names.index("offset"), names.index("stream")
    except ValueError:
        raise TierError(f"tier object {key!r} has no offset or stream column") from None
    groups = []
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        offsets = rg.column(offset_col).statistics
        if offsets is None or not offsets.has_min_max:
            raise TierError(f"tier object {key!r}: row group {i} has no offset statistics")
        streams = rg.column(stream_col).statistics
        has_streams = streams is not None and streams.has_min_max
        groups.append(
            RowGroupRange(
                i,
                int(offsets.min),
                int(offsets.max),
                int(streams.min) if has_streams else None,
                int(streams.max) if has_streams else None,
            )
        )
    return ObjectLayout(tuple(groups))


class _RangedObject(io.RawIOBase):
    """A tiered object as a read-only file whose bytes come part by part, on demand.

    Parquet reads the column chunks of one row group at a time: each read is served from the
    part(s) it lies in, fetched (and verified) by ``fetch`` the first time one is touched.
    """

    def __init__(self, entry: ManifestEntry, fetch: Callable[[int], memoryview]) -> None:
        super().__init__()
        self._entry = entry
        self._starts = [p.start for p in entry.parts]
        self._fetch = fetch
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._entry.bytes}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        end = self._entry.bytes if size is None or size < 0 else min(self._entry.bytes, self._pos + size)
        out = []
        while self._pos < end:
            i = bisect.bisect_right(self._starts, self._pos) - 1
            part = self._entry.parts[i]
            data = self._fetch(i)
            stop = min(end, part.end)
            out.append(data[self._pos - part.start : stop - part.start])
            self._pos = stop
        return b"".join(out)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(memoryview(buffer)))
        memoryview(buffer).cast("B")[: len(data)] = data
        return len(data)


class TierReadCache:
    """Verified objects, their layouts and decoded row groups (see the module docstring).

    Args:
        capacity_bytes: Bytes kept at most (object bytes + decoded tables + bookkeeping).

    Raises:
        InvalidArgument: ``capacity_bytes`` is not an int >= 0.

    Attributes:
        downloads: Requests that fetched object bytes so far (whole objects or parts).
        downloaded_bytes: Bytes those requests fetched.
        decodes: Row groups decoded so far.
    """

    def __init__(self, capacity_bytes: int = DEFAULT_TIER_CACHE_BYTES) -> None:
        if type(capacity_bytes) is not int or capacity_bytes < 0:
            raise InvalidArgument(f"tier_cache_bytes must be an int >= 0, not {capacity_bytes!r}")
        self.capacity_bytes = capacity_bytes
        self._lock = threading.Lock()
        self._items: OrderedDict[tuple[Any, ...], tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self.downloads = 0
        self.downloaded_bytes = 0
        self.decodes = 0

    @property
    def cached_bytes(self) -> int:
        """Bytes held now (never more than ``capacity_bytes``)."""
        return self._bytes

    def stats(self) -> TierCacheStats:
        """Downloads and decodes so far, bytes held and the capacity."""
        with self._lock:
            return TierCacheStats(
                self.downloads, self.decodes, self._bytes, self.capacity_bytes, self.downloaded_bytes
            )

    # --- the LRU -------------------------------------------------------------------------

    def _get(self, key: tuple[Any, ...]) -> Any:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[0]

    def _put(self, key: tuple[Any, ...], value: Any, size: int) -> None:
        size += _ENTRY_OVERHEAD_BYTES
        if size > self.capacity_bytes:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            while self._items and self._bytes + size > self.capacity_bytes:
                _, (_, freed) = self._items.popitem(last=False)
                self._bytes -= freed
            self._items[key] = (value, size)
            self._bytes += size

    # --- objects -------------------------------------------------------------------------

    def _object(self, target: TierTarget, entry: ManifestEntry, fill: bool) -> pa.Buffer:
        """The object's verified bytes (downloaded on a miss, kept if ``fill``)."""
        key = ("object", entry.key, entry.checksum)
        data: pa.Buffer | None = self._get(key)
        if data is not None:
            return data
        raw = target.get(entry.key)
        verify_bytes(entry.key, raw, entry.object_info)
        with self._lock:
            self.downloads += 1
            self.downloaded_bytes += len(raw)
        data = pa.py_buffer(raw)
        if fill:
            self._put(key, data, data.size)
        return data

    def _part(self, target: TierTarget, entry: ManifestEntry, index: int, fill: bool) -> memoryview:
        """Part ``index`` of ``entry``'s object, verified (one ranged GET on a miss)."""
        key = ("part", entry.key, entry.checksum, index)
        data: bytes | None = self._get(key)
        if data is None:
            part = entry.parts[index]
            data = target.get_range(entry.key, part.start, part.end)
            if crc32c.crc32c(data) != part.crc32c:
                raise ObjectMismatch(
                    f"tier object {entry.key!r}: bytes {part.start}-{part.end} fail their CRC32C "
                    "(the object changed or rotted since it was tiered)"
                )
            with self._lock:
                self.downloads += 1
                self.downloaded_bytes += len(data)
            if fill:
                self._put(key, data, len(data))
        return memoryview(data)

    def _open(self, target: TierTarget, entry: ManifestEntry, fill: bool) -> pq.ParquetFile:
        """A Parquet reader of ``entry``'s object: ranged when it has parts, else whole."""
        try:
            if not entry.parts:
                return pq.ParquetFile(pa.BufferReader(self._object(target, entry, fill)))
            fetched: dict[int, memoryview] = {}  # this reader's own parts, whatever the cache keeps

            def fetch(i: int) -> memoryview:
                if i not in fetched:
                    fetched[i] = self._part(target, entry, i, fill)
                return fetched[i]

            footer = fetch(len(entry.parts) - 1)
            return pq.ParquetFile(_RangedObject(entry, fetch), metadata=footer_metadata(footer))
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise TierError(f"cannot decode tier Parquet object {entry.key!r}: {exc}") from exc

    def _layout(
        self, entry: ManifestEntry, parquet: Callable[[], pq.ParquetFile], fill: bool
    ) -> ObjectLayout:
        """The row groups of ``entry``'s object (its footer, read once while kept)."""
        key = ("layout", entry.key, entry.checksum)
        layout: ObjectLayout | None = self._get(key)
        if layout is None:
            layout = _layout(parquet(), entry.key)
            if fill:
                self._put(key, layout, _LAYOUT_ROW_GROUP_BYTES * len(layout.row_groups))
        return layout

    def _row_group(
        self, entry: ManifestEntry, index: int, parquet: Callable[[], pq.ParquetFile], fill: bool
    ) -> pa.Table:
        """Row group ``index`` of ``entry``'s object, decoded (``SEGMENT_SCHEMA``)."""
        key = ("rows", entry.key, entry.checksum, index)
        table: pa.Table | None = self._get(key)
        if table is not None:
            return table
        try:
            raw = parquet().read_row_group(index)
            table = to_segment_table(raw.cast(TIER_SCHEMA))
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise TierError(f"cannot decode row group {index} of tier object {entry.key!r}: {exc}") from exc
        with self._lock:
            self.decodes += 1
        if fill:
            self._put(key, table, table.nbytes)
        return table

    def rows(
        self,
        target: TierTarget,
        entry: ManifestEntry,
        first: int,
        last: int,
        *,
        stream: int | None = None,
        fill: bool = True,
    ) -> Iterator[pa.Table]:
        """The rows of ``entry`` with offsets in ``[first, last]``, one table per row group,
        in offset order (row groups whose statistics rule ``stream`` out are skipped).

        Only the parts the call needs (the footer, the row groups) are fetched, each at most
        once per call and only when not cached (an object without parts: the whole object). ``fill=False`` (a scan of a whole history, such as a key read)
        uses what is cached but keeps nothing new, so it evicts nothing readers are using.
        """
        opened: list[pq.ParquetFile] = []

        def parquet() -> pq.ParquetFile:
            # A reader of this call's own over the (shared, immutable) bytes: Parquet file
            # readers are not for concurrent use, and reads run in several threads.
            if not opened:
                opened.append(self._open(target, entry, fill))
            return opened[0]

        for group in self._layout(entry, parquet, fill).overlapping(first, last):
            if stream is not None and not group.may_hold_stream(stream):
                continue
            table = self._row_group(entry, group.index, parquet, fill)
            offsets = table.column("offset").to_numpy()
            lo = int(np.searchsorted(offsets, first, side="left"))
            hi = int(np.searchsorted(offsets, last, side="right"))
            if hi > lo:
                yield table.slice(lo, hi - lo)
