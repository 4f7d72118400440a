"""The per-database tier manifest: which Parquet objects the tier holds, and in what state.

The manifest is stored in the tier at ``<db>/_manifest.json`` (a leading ``_`` so Spark's
Parquet reader skips it) and, when a path is given, as a local copy written atomically (temp
file + fsync + rename + directory fsync). Every save increments ``seq``; :meth:`Manifest.load`
takes whichever copy has the higher ``seq``, so a save that reached the local disk but not
the tier is not lost. One process writes a database's manifest at a time (the DB's tiering
task), or one per shard (shared manifests, below).

Heads and checkpoints, so that a save costs what changed, not the whole history: a manifest
of up to ``HEAD_CHANGES_MAX`` entries is one document holding every entry (version 1).
Above that, ``_manifest.json`` is a *head* (version 2) naming a *checkpoint*, an immutable
full document at ``<db>/_manifest.d/<seq>-<token>.json`` (locally in ``<copy>.d/``), and
carrying only the entries changed or removed since it, plus the small per-shard maps. A save
whose head would carry more than ``HEAD_CHANGES_MAX`` changes first writes a new checkpoint
(every copy of it before any head names it), then a head naming it, then deletes the
checkpoint the replaced head named. A reader that finds a checkpoint gone (replaced between
its reads of the head and of the checkpoint) reads the head again. Checkpoints older than
the one the head names are deleted at recovery (those a crash left behind); a newer one may
be another writer's, about to be named, and is left alone.

Entry states (after KIP-405's remote log segment states)::

    uploading --> committed --> deleting --> (removed)
        \\-------------------------------------^   (aborted upload)

Upload protocol for one sealed segment (each numbered step is durable before the next):

1. Encode: ``data = segment_table_to_parquet(table)``; compute its size and sha256.
2. ``manifest.begin_upload(entry)`` (state ``uploading``, with the expected size and
   sha256), then ``manifest.save(...)``.
3. ``target.put(key, data)``, then ``target.verify(key, expected)``.
4. ``manifest.mark_committed(key)``, then ``manifest.save(...)``.
5. Only now may the local segment be deleted; reads below the local log start are served
   from ``committed`` entries.

Deleting tiered data (remote retention):

0. ``manifest.raise_log_start(shard, offset)`` and save -- the shard's retention floor
   (``log_starts`` in the document): nothing below it is served, even from an object that
   straddles it, and objects wholly below it are deleted as follows.
1. ``manifest.mark_deleting(key)`` and save -- readers stop using the object.
2. ``target.delete(key)``.
3. ``manifest.remove(key)`` and save.

Crash recovery (:meth:`Manifest.recover`, run when the DB opens):

* ``uploading``: the local segment still exists (step 5 was not reached). If the object
  verifies against the entry's size and sha256, the crash hit between steps 3 and 4: the
  entry is committed. Otherwise the object is missing, partial or stale: it is deleted and
  the entry dropped, and the DB tiers the segment again.
* ``deleting``: the object is deleted (idempotent) and the entry dropped.
* ``committed``: nothing to do.

An object is only ever written after its ``uploading`` entry is durable, and an entry is
only dropped after its object is deleted, so the tier holds no unreferenced objects;
:meth:`Manifest.orphans` finds any left by other writers or a lost local manifest.

Shared manifests (:meth:`Manifest.load_shared`; a replicated database, whose shards are led
by different nodes): each shard has one writer at a time, the node leading it, which
claims with its leader epoch (:meth:`Manifest.claim`). The document records each shard's
writer epoch (``writer_epochs``). Every save is a conditional put
(:meth:`~seglog.tiering.targets.TierTarget.put_if`) of the version last read: on a conflict
the writer reads the tier copy again, takes every other shard's entries from it, keeps its
own shards' entries, and puts again. A writer whose shard was claimed at a higher epoch
(a leader that was replaced) finds that on its next save or refresh and loses the shard:
its save fails, so it never overwrites the new leader's entries. Recovery of half-done
uploads and deletes runs per shard, when a writer claims it. The local copy is then only a
cache, read when the tier is unreachable at open.
"""

from __future__ import annotations

import enum
import json
import logging
import secrets
import shutil
import threading
from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from itertools import chain, pairwise, starmap
from pathlib import Path
from typing import Any, NamedTuple

from seglog._fs import atomic_writer
from seglog._gc import gc_paused
from seglog.errors import InvalidArgument, TierError, TierFenced
from seglog.tiering.parquet import SegmentStats, parse_object_key
from seglog.tiering.targets import ObjectInfo, ObjectMismatch, ObjectNotFound, PreconditionFailed, TierTarget

__all__ = [
    "MANIFEST_NAME",
    "MANIFEST_VERSION",
    "EntryState",
    "Manifest",
    "ManifestEntry",
    "ObjectPart",
    "manifest_key",
]

log = logging.getLogger("seglog.tiering")

MANIFEST_VERSION = 1
HEAD_VERSION = 2
MANIFEST_NAME = "_manifest.json"
CHECKPOINT_DIR = "_manifest.d"
HEAD_CHANGES_MAX = 256
"""Entries a head carries (changed or removed since its checkpoint) before a save writes a
new checkpoint; also the size up to which a manifest is one whole document. At ~560 bytes an
entry a head stays under ~150 KB, and a checkpoint of n entries is written once per ~256
changes (two per upload), i.e. ~n/128 entries' worth of bytes per upload."""
# Reads of a head whose checkpoint is gone by the time it is read (replaced in between by a
# newer one) before a load gives up: each means another writer saved a checkpoint meanwhile.
_CHECKPOINT_READ_ATTEMPTS = 8
# Rough sizes for pausing the collector (seglog._gc): JSON bytes per parsed object, objects
# built per entry (the entry, its parts and their tuple).
_JSON_BYTES_PER_OBJECT = 16
_OBJECTS_PER_ENTRY = 12
# Conditional puts of a shared manifest lost to other writers in a row before a save gives up
# (each loss means another writer saved: with a few leaders per database, a handful at most).
_SHARED_SAVE_ATTEMPTS = 32


def _dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def manifest_key(db: str) -> str:
    """Returns the tier key of ``db``'s manifest: ``<db>/_manifest.json``."""
    if not db or "/" in db or db.startswith("."):
        raise InvalidArgument(f"invalid database name {db!r}")
    return f"{db}/{MANIFEST_NAME}"


def checkpoint_key(db: str, seq: int) -> str:
    """A new, unique tier key for a checkpoint of ``db``'s manifest written at save ``seq``."""
    manifest_key(db)  # validates
    return f"{db}/{CHECKPOINT_DIR}/{seq:016d}-{secrets.token_hex(6)}.json"


def checkpoint_seq(key: str) -> int | None:
    """The save ``seq`` a checkpoint key was written at (``None``: not a checkpoint key)."""
    name = key.rsplit("/", 1)[-1]
    head, sep, _ = name.partition("-")
    if not sep or not name.endswith(".json") or not head.isdigit():
        return None
    return int(head)


def local_checkpoint_dir(local_path: Path) -> Path:
    """Where a local manifest copy at ``local_path`` keeps its checkpoints: ``<copy>.d``."""
    return local_path.with_name(local_path.name + ".d")


@dataclass(frozen=True, slots=True)
class _Checkpoint:
    """A checkpoint as read (and checked) or written: its key, save seq, document text, and
    entries, also by shard (a head over it starts from copies of these, checking only its
    own entries)."""

    key: str
    seq: int
    text: bytes
    entries: dict[str, ManifestEntry]
    by_shard: dict[int, dict[str, ManifestEntry]]

    @property
    def name(self) -> str:
        """Its file name (the key's last segment; a local copy's file in ``<copy>.d``)."""
        return self.key.rsplit("/", 1)[-1]


class EntryState(enum.StrEnum):
    """Lifecycle of a tiered object."""

    UPLOADING = "uploading"
    COMMITTED = "committed"
    DELETING = "deleting"


_NEXT_STATE = {
    EntryState.UPLOADING: EntryState.COMMITTED,
    EntryState.COMMITTED: EntryState.DELETING,
}


class ObjectPart(NamedTuple):
    """A byte span of a tiered object that ranged reads fetch whole, and its checksum.

    A named tuple, not a dataclass: an open builds ten per tiered object, and a frozen
    dataclass's construction was most of a large manifest's load.

    Attributes:
        start: First byte.
        end: One past the last byte.
        crc32c: CRC32C of the span's bytes (checked on every ranged read of it).
    """

    start: int
    end: int
    crc32c: int


@dataclass(frozen=True, slots=True)
class ManifestEntry:
    """One tiered Parquet object.

    Attributes:
        key: Object key, ``<db>/shard=<n>/<base>-<end>.parquet``.
        shard: Shard number.
        base_offset: First offset in the object.
        end_offset: Last offset in the object (inclusive).
        min_ts: Smallest record timestamp, µs since the epoch.
        max_ts: Largest record timestamp, µs.
        rows: Number of records.
        bytes: Object size in bytes.
        checksum: sha256 of the object, hex.
        state: Lifecycle state.
        parts: The object's spans for ranged reads (row groups, page indexes, footer),
            contiguous from byte 0 to ``bytes``; empty for objects tiered before ranged
            reads, which are read whole.
    """

    key: str
    shard: int
    base_offset: int
    end_offset: int
    min_ts: int
    max_ts: int
    rows: int
    bytes: int
    checksum: str
    state: EntryState = EntryState.UPLOADING
    parts: tuple[ObjectPart, ...] = ()

    def __post_init__(self) -> None:
        if self.shard < 0 or self.base_offset < 0 or self.end_offset < self.base_offset:
            raise InvalidArgument(f"invalid offset range in manifest entry {self.key!r}")
        if self.min_ts > self.max_ts or self.rows < 1 or self.bytes < 0:
            raise InvalidArgument(f"invalid stats in manifest entry {self.key!r}")
        if self.parts:
            at = 0
            for part in self.parts:
                if part.start != at or part.end <= part.start:
                    raise InvalidArgument(f"manifest entry {self.key!r}: parts are not contiguous at {at}")
                at = part.end
            if at != self.bytes:
                raise InvalidArgument(f"manifest entry {self.key!r}: parts end at {at}, not {self.bytes}")

    @classmethod
    def for_upload(
        cls, shard: int, stats: SegmentStats, info: ObjectInfo, parts: tuple[ObjectPart, ...] = ()
    ) -> ManifestEntry:
        """Builds an ``uploading`` entry from segment stats and the object's size/sha256."""
        return cls(
            key=info.key,
            shard=shard,
            base_offset=stats.base_offset,
            end_offset=stats.end_offset,
            min_ts=stats.min_ts,
            max_ts=stats.max_ts,
            rows=stats.rows,
            bytes=info.size,
            checksum=info.checksum,
            state=EntryState.UPLOADING,
            parts=parts,
        )

    @property
    def object_info(self) -> ObjectInfo:
        """The expected :class:`ObjectInfo`, for ``target.verify``."""
        return ObjectInfo(self.key, self.bytes, self.checksum)

    def overlaps_offsets(self, start: int | None, end: int | None) -> bool:
        """Whether ``[base_offset, end_offset]`` meets ``[start, end]`` (None = open)."""
        return (start is None or self.end_offset >= start) and (end is None or self.base_offset <= end)

    def overlaps_time(self, start_ts: int | None, end_ts: int | None) -> bool:
        """Whether ``[min_ts, max_ts]`` meets ``[start_ts, end_ts]`` (µs, None = open)."""
        return (start_ts is None or self.max_ts >= start_ts) and (end_ts is None or self.min_ts <= end_ts)

    def to_json(self) -> dict[str, Any]:
        """Returns the JSON-ready dict."""
        d: dict[str, Any] = {
            "key": self.key,
            "shard": self.shard,
            "base_offset": self.base_offset,
            "end_offset": self.end_offset,
            "min_ts": self.min_ts,
            "max_ts": self.max_ts,
            "rows": self.rows,
            "bytes": self.bytes,
            "checksum": self.checksum,
            "state": self.state.value,
        }
        if self.parts:  # absent: the document older readers wrote and read
            d["parts"] = [[p.start, p.end, p.crc32c] for p in self.parts]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ManifestEntry:
        """Parses one entry; raises ``KeyError``/``ValueError``/``TypeError`` if malformed."""
        ints = ("shard", "base_offset", "end_offset", "min_ts", "max_ts", "rows", "bytes")
        for name in ints:
            if type(d[name]) is not int:
                raise TypeError(f"{name} must be an integer")
        if not isinstance(d["key"], str) or not isinstance(d["checksum"], str):
            raise TypeError("key and checksum must be strings")
        return cls(
            key=d["key"],
            shard=d["shard"],
            base_offset=d["base_offset"],
            end_offset=d["end_offset"],
            min_ts=d["min_ts"],
            max_ts=d["max_ts"],
            rows=d["rows"],
            bytes=d["bytes"],
            checksum=d["checksum"],
            state=EntryState(d["state"]),
            parts=_parts_from_json(d.get("parts", [])),
        )


def _parts_from_json(raw: Any) -> tuple[ObjectPart, ...]:
    if not isinstance(raw, list):
        raise TypeError("parts must be a list")
    # Checked and built a list at a time (ten parts an entry, a whole manifest at an open):
    # a loop of per-part checks was most of a load.
    if raw and (
        set(map(type, raw)) != {list}
        or set(map(len, raw)) != {3}
        or set(map(type, chain.from_iterable(raw))) != {int}
    ):
        raise TypeError("each part must be [start, end, crc32c] integers")
    return tuple(starmap(ObjectPart, raw))


class _Adopted(NamedTuple):
    """The shards a merge takes from the tier's copy (see ``Manifest._adopted``)."""

    by_shard: dict[int, dict[str, ManifestEntry]]
    entries: dict[str, ManifestEntry]
    dirty: set[str]


@dataclass
class _ShardView:
    """One shard's entries sorted by offset, and what lookups need of them (built on demand,
    dropped on any change to the shard: lookups far outnumber changes)."""

    # Every entry (any state), by base offset. A shard's entries never overlap, so their end
    # offsets are sorted too.
    all: list[ManifestEntry]
    bases: list[int] = field(init=False)
    committed: list[ManifestEntry] = field(init=False)
    committed_ends: list[int] = field(init=False)
    committed_bases: list[int] = field(init=False)
    # Per committed entry: the base offset of the first one of the gapless run it is in.
    run_starts: list[int] = field(init=False)
    committed_bytes: int = field(init=False)

    def __post_init__(self) -> None:
        self.bases = [e.base_offset for e in self.all]
        self.committed = [e for e in self.all if e.state is EntryState.COMMITTED]
        self.committed_ends = [e.end_offset for e in self.committed]
        self.committed_bases = [e.base_offset for e in self.committed]
        self.run_starts = []
        prev: ManifestEntry | None = None
        for e in self.committed:
            contiguous = prev is not None and prev.end_offset + 1 == e.base_offset
            self.run_starts.append(self.run_starts[-1] if contiguous else e.base_offset)
            prev = e
        self.committed_bytes = sum(e.bytes for e in self.committed)


class Manifest:
    """The set of tiered objects of one database. Methods are thread-safe.

    Mutations change memory only; call :meth:`save` to make them durable, following the
    protocol in the module docstring.
    """

    def __init__(
        self,
        db: str,
        entries: Iterable[ManifestEntry] = (),
        *,
        seq: int = 0,
        log_starts: dict[int, int] | None = None,
        writer_epochs: dict[int, int] | None = None,
    ) -> None:
        """Args: db: database name; entries: initial entries; seq: save counter;
        log_starts: per-shard retention floors (see :meth:`log_start`); writer_epochs: per
        shard, the epoch of its last writer (shared manifests)."""
        manifest_key(db)  # validates
        self._db = db
        self._seq = seq
        self._log_starts: dict[int, int] = dict(log_starts or {})
        self._writer_epochs: dict[int, int] = dict(writer_epochs or {})
        self._entries: dict[str, ManifestEntry] = {}
        # The same entries by shard, and each shard's sorted view (see _view).
        self._by_shard: dict[int, dict[str, ManifestEntry]] = {}
        self._views: dict[int, _ShardView] = {}
        # Each entry's JSON text as the last save wrote it: a save serialises only the
        # entries that changed since (entries are immutable; a change is a new object).
        self._texts: dict[str, tuple[ManifestEntry, str]] = {}
        # The checkpoint this state's head is written against (None: saved as one whole
        # document), the keys changed or removed since it (what a head carries), and the
        # checkpoint the tier's head names as last read or put (deleted once replaced).
        self._base: _Checkpoint | None = None
        self._dirty: set[str] = set()
        self._named: str | None = None
        self._lock = threading.RLock()
        self._save_lock = threading.Lock()
        self._merge_lock = threading.Lock()
        self._local_lock = threading.Lock()
        # Shared mode: the shards this process writes, with its epoch for each, and the tier
        # copy's version this state was last merged with (None: there was none).
        self._shared = False
        self._owned: dict[int, int] = {}
        self._version: str | None = None
        self._add_all(entries)
        self._dirty = set()  # no checkpoint yet: the first save is a whole document or one

    @property
    def db(self) -> str:
        """The database name."""
        return self._db

    @property
    def seq(self) -> int:
        """How many times this manifest was saved (the higher copy wins on load)."""
        return self._seq

    # --- (de)serialisation ---------------------------------------------------------------

    def to_json(self) -> str:
        """Returns the whole JSON document (entries sorted by shard, then base offset)."""
        with self._lock:
            texts: dict[str, tuple[ManifestEntry, str]] = {}
            for e in self._sorted():
                cached = self._texts.get(e.key)
                if cached is None or cached[0] is not e:
                    cached = (e, _dumps(e.to_json()))
                texts[e.key] = cached
            self._texts = texts
            return self._document({"version": MANIFEST_VERSION}, [text for _, text in texts.values()])

    def _document(self, fields: dict[str, Any], entry_texts: list[str], *, seq: int | None = None) -> str:
        """The document of ``fields``, this state's per-shard maps and save counter (``seq``
        when given), and ``entry_texts`` (hold the lock)."""
        doc: dict[str, Any] = {
            **fields,
            "db": self._db,
            "seq": self._seq if seq is None else seq,
            "entries": [],
            "log_starts": {str(k): v for k, v in sorted(self._log_starts.items())},
        }
        if self._writer_epochs:
            doc["writer_epochs"] = {str(k): v for k, v in sorted(self._writer_epochs.items())}
        # The one place the empty list stands in the document: a string holding these
        # characters would have its quotes escaped.
        head, tail = _dumps(doc).split('"entries":[]', 1)
        return f'{head}"entries":[{",".join(entry_texts)}]{tail}\n'

    def _head(self) -> bytes:
        """What ``_manifest.json`` holds now: the whole document, or a head carrying the
        changes since the base checkpoint (hold the lock)."""
        base = self._base
        if base is None:
            return self.to_json().encode()
        changed: list[ManifestEntry] = []
        removed: list[str] = []
        for key in self._dirty:
            entry = self._entries.get(key)
            old = base.entries.get(key)
            if entry is None:
                if old is not None:
                    removed.append(key)
            elif old is None or (old is not entry and old != entry):
                changed.append(entry)
        changed.sort(key=lambda e: (e.shard, e.base_offset))
        texts = []
        for e in changed:
            cached = self._texts.get(e.key)
            if cached is None or cached[0] is not e:
                cached = self._texts[e.key] = (e, _dumps(e.to_json()))
            texts.append(cached[1])
        fields = {
            "version": HEAD_VERSION,
            "checkpoint": {"key": base.key, "seq": base.seq},
            "removed": sorted(removed),
        }
        return self._document(fields, texts).encode()

    @staticmethod
    def _parse(text: str | bytes, db: str | None) -> dict[str, Any]:
        """A document or head, checked for its version and database."""
        try:
            # Collector paused: a large document is millions of acyclic objects, and the young
            # collections they trigger were most of a load's time.
            with gc_paused(len(text) // _JSON_BYTES_PER_OBJECT):
                doc = json.loads(text)
            version = doc["version"]
            name = doc["db"]
        except (ValueError, KeyError, TypeError) as exc:
            raise TierError(f"malformed manifest: {exc!r}") from exc
        if version not in (MANIFEST_VERSION, HEAD_VERSION):
            raise TierError(f"unsupported manifest version {version!r}")
        if db is not None and name != db:
            raise TierError(f"manifest is for database {name!r}, not {db!r}")
        return doc  # type: ignore[no-any-return]

    @staticmethod
    def _checkpoint_ref(doc: dict[str, Any]) -> tuple[str, int] | None:
        """The checkpoint a head names, as (key, seq); ``None`` for a whole document."""
        if doc["version"] != HEAD_VERSION:
            return None
        try:
            key, seq = doc["checkpoint"]["key"], doc["checkpoint"]["seq"]
        except (KeyError, TypeError) as exc:
            raise TierError(f"malformed manifest head: {exc!r}") from exc
        if (
            not isinstance(key, str)
            or type(seq) is not int
            or not key.startswith(f"{doc['db']}/{CHECKPOINT_DIR}/")
        ):
            raise TierError(f"malformed manifest head: checkpoint {key!r} at {seq!r}")
        return key, seq

    @classmethod
    def _read_checkpoint(cls, ref: tuple[str, int], data: bytes, db: str) -> _Checkpoint:
        """The checkpoint ``ref`` names, from its bytes: parsed and checked like a document."""
        doc = cls._parse(data, db)
        if doc["version"] != MANIFEST_VERSION:
            raise TierError(f"manifest checkpoint {ref[0]!r} is not a whole document")
        try:
            # Checked once, as a whole document is (keys, overlaps): heads over it are not again.
            with gc_paused(len(doc["entries"]) * _OBJECTS_PER_ENTRY):
                checked = cls(db, [ManifestEntry.from_json(e) for e in doc["entries"]])
        except (ValueError, KeyError, TypeError, AttributeError, InvalidArgument) as exc:
            raise TierError(f"malformed manifest checkpoint {ref[0]!r}: {exc!r}") from exc
        return _Checkpoint(ref[0], ref[1], bytes(data), checked._entries, checked._by_shard)

    @classmethod
    def _from_doc(cls, doc: dict[str, Any], base: _Checkpoint | None, *, shared: bool = False) -> Manifest:
        """The manifest a parsed document is, or a head is over ``base`` (its checkpoint)."""
        try:
            seq = doc["seq"]
            if type(seq) is not int:
                raise TypeError("seq must be an integer")
            with gc_paused(len(doc["entries"]) * _OBJECTS_PER_ENTRY):
                changed = [ManifestEntry.from_json(e) for e in doc["entries"]]
            removed = doc.get("removed", [])
            if type(removed) is not list or not all(isinstance(k, str) for k in removed):
                raise TypeError("removed must be a list of keys")
            # Absent in manifests written before retention reached the tier.
            starts = {int(k): int(v) for k, v in doc.get("log_starts", {}).items()}
            epochs = {int(k): int(v) for k, v in doc.get("writer_epochs", {}).items()}
            if base is None:
                manifest = cls(doc["db"], changed, seq=seq, log_starts=starts, writer_epochs=epochs)
            else:
                manifest = cls(doc["db"], seq=seq, log_starts=starts, writer_epochs=epochs)
                manifest._apply_head(base, removed, changed)
        except TierError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise TierError(f"malformed manifest: {exc!r}") from exc
        manifest._shared = shared
        if base is not None:
            manifest._base = base
            manifest._named = base.key
        return manifest

    def _apply_head(self, base: _Checkpoint, removed: list[str], changed: list[ManifestEntry]) -> None:
        """Becomes ``base`` with a head's changes applied; only those are checked (a new
        object): its keys, and each touched shard's order once."""
        self._entries = dict(base.entries)
        self._by_shard = {s: dict(v) for s, v in base.by_shard.items()}
        for key in removed:
            entry = self._entries.get(key)
            if entry is not None:
                self._drop(entry)
        for entry in changed:
            self._check_key(entry)
            self._put(entry)
        self._check_overlaps({e.shard for e in changed})
        # What the next head carries again: exactly this one's changes (_put/_drop noted them).

    @classmethod
    def from_json(cls, text: str | bytes, *, db: str | None = None, shared: bool = False) -> Manifest:
        """Parses a whole manifest document (``shared``: as :meth:`load_shared` would).

        Raises:
            TierError: If it is malformed, of an unknown version, for another database, or a
                head (which needs its checkpoint: :meth:`load`, :meth:`load_local`).
        """
        doc = cls._parse(text, db)
        if cls._checkpoint_ref(doc) is not None:
            raise TierError("this manifest is a head naming a checkpoint: read it with load or load_local")
        return cls._from_doc(doc, None, shared=shared)

    @classmethod
    def load_local(cls, path: Path, db: str, *, shared: bool = False) -> Manifest:
        """Reads a local copy as :meth:`save` writes it (``shared``: as :meth:`load_shared`
        would, for a copy read while the tier is unreachable; its first save merges).

        Raises:
            FileNotFoundError: There is no local copy.
            TierError: It is malformed, or its checkpoint is missing or unreadable.
        """
        misses = 0
        while True:
            doc = cls._parse(path.read_bytes(), db)
            ref = cls._checkpoint_ref(doc)
            if ref is None:
                return cls._from_doc(doc, None, shared=shared)
            file = local_checkpoint_dir(path) / ref[0].rsplit("/", 1)[-1]
            try:
                data = file.read_bytes()
            except FileNotFoundError as exc:
                # Another process (a read-only follower reads its owner's copy) may read the
                # head just before the owner's next save replaces the checkpoint: read again.
                misses += 1
                if misses < _CHECKPOINT_READ_ATTEMPTS:
                    continue
                raise TierError(f"local manifest {path}: its checkpoint {file} is missing") from exc
            except OSError as exc:
                raise TierError(f"local manifest {path}: cannot read its checkpoint {file}: {exc}") from exc
            return cls._from_doc(doc, cls._read_checkpoint(ref, data, db), shared=shared)

    @classmethod
    def _read_tier(
        cls,
        target: TierTarget,
        db: str,
        *,
        known_base: _Checkpoint | None = None,
        known_version: str | None = None,
    ) -> tuple[Manifest | None, str | None, bytes]:
        """The tier copy (empty when there is none), its version and its head's bytes; the
        copy is ``None`` when at ``known_version`` (not parsed). ``known_base`` is reused,
        not read again, when the head names it."""
        for _ in range(_CHECKPOINT_READ_ATTEMPTS):
            try:
                data, version = target.get_versioned(manifest_key(db))
            except ObjectNotFound:
                return cls(db), None, b""
            if known_version is not None and version == known_version:
                return None, version, data
            doc = cls._parse(data, db)
            ref = cls._checkpoint_ref(doc)
            base = None
            if ref is not None:
                if known_base is not None and known_base.key == ref[0]:
                    base = known_base
                else:
                    try:
                        base = cls._read_checkpoint(ref, target.get(ref[0]), db)
                    except ObjectNotFound:
                        continue  # replaced by a newer one since the head was read
            return cls._from_doc(doc, base), version, data
        raise TierError(
            f"tier manifest of {db!r}: the checkpoint its head named was gone {_CHECKPOINT_READ_ATTEMPTS} times"
        )

    @classmethod
    def load(cls, target: TierTarget, db: str, *, local_path: Path | None = None) -> Manifest:
        """Loads ``db``'s manifest: the tier copy or the local copy, whichever is newer.

        A missing copy counts as empty; an unreadable local copy is logged and ignored (the
        tier copy is then authoritative). Errors reaching the tier propagate.

        Raises:
            TierError: If the tier fails or its copy is malformed.
        """
        remote, version, _ = cls._read_tier(target, db)
        if version is None:
            remote = None
        local: Manifest | None = None
        if local_path is not None:
            try:
                local = cls.load_local(local_path, db)
            except FileNotFoundError:
                pass
            except (OSError, TierError) as exc:
                log.warning("ignoring unreadable local manifest %s: %s", local_path, exc)
        candidates = [m for m in (remote, local) if m is not None]
        if not candidates:
            return cls(db)
        return max(candidates, key=lambda m: m.seq)

    def save(self, target: TierTarget, *, local_path: Path | None = None) -> None:
        """Makes the current state durable: local copy first (atomically), then the tier.

        A shared manifest (:meth:`load_shared`) is put conditionally, merged with other
        writers' saves as needed, and its local copy written after the tier's.

        Raises:
            TierError: If either write fails (``seq`` stays incremented; save again).
            TierFenced: Shared: a shard this process wrote was claimed at a higher epoch.
        """
        if self._shared:
            self._save_shared(target, local_path)
            return
        # One save at a time; the state lock only while the state is read or changed, never
        # across a write: lookups (the event loop's among them) do not wait for the tier.
        with self._save_lock:
            with self._lock:
                self._seq += 1
                checkpoint = self._plan_checkpoint()
            if checkpoint is not None:
                self._put_checkpoint(target, checkpoint)
            with self._lock:
                head = self._head()
                base = self._base
            if local_path is not None:
                try:
                    self._write_local(local_path, head, base)
                except OSError as exc:
                    raise TierError(f"cannot write local manifest {local_path}: {exc}") from exc
            target.put(manifest_key(self._db), head)
            with self._lock:
                replaced = self._now_named()
        self._delete_checkpoint(target, replaced)

    # --- heads and checkpoints ------------------------------------------------------------

    def _plan_checkpoint(self) -> _Checkpoint | None:
        """Decides what the next save writes (hold the lock): a whole document while the
        manifest is small, else a head, after a new checkpoint if the head would carry too
        many changes. Returns that checkpoint (not yet written), if any."""
        if len(self._entries) <= HEAD_CHANGES_MAX:
            self._base = None
            self._dirty = set()  # a whole document carries everything
            return None
        if self._base is not None and len(self._dirty) <= HEAD_CHANGES_MAX:
            return None
        return _Checkpoint(
            checkpoint_key(self._db, self._seq),
            self._seq,
            b"",  # serialised by _write_text, without the lock
            dict(self._entries),
            {s: dict(v) for s, v in self._by_shard.items()},
        )

    def _write_text(self, checkpoint: _Checkpoint) -> _Checkpoint:
        """``checkpoint`` with its document text: the entries are serialised (or taken from
        the saved texts) without the lock, as the state was when it was planned; the lock
        is held only to frame them and to keep their texts for later saves."""
        with self._lock:
            frame = self._document({"version": MANIFEST_VERSION}, [], seq=checkpoint.seq)
        head, tail = frame.split('"entries":[]', 1)
        ordered = sorted(checkpoint.entries.values(), key=lambda e: (e.shard, e.base_offset))
        cached = self._texts.get  # read-only here; a stale pair fails the identity check
        texts: dict[str, tuple[ManifestEntry, str]] = {}
        for e in ordered:
            pair = cached(e.key)
            texts[e.key] = pair if pair is not None and pair[0] is e else (e, _dumps(e.to_json()))
        text = f'{head}"entries":[{",".join(t for _, t in texts.values())}]{tail}'.encode()
        with self._lock:
            for key in self._texts.keys() - self._entries.keys():  # entries gone since
                del self._texts[key]
            for key, pair in texts.items():
                if self._entries.get(key) is pair[0]:
                    self._texts[key] = pair
        return replace(checkpoint, text=text)

    def _put_checkpoint(self, target: TierTarget, checkpoint: _Checkpoint) -> _Checkpoint:
        """Serialises a planned checkpoint and puts it in the tier; heads are then written
        against it. (Every copy exists before a head names it: the local copy's file is
        written by ``_write_local``, before the local head.)"""
        checkpoint = self._write_text(checkpoint)
        target.put(checkpoint.key, checkpoint.text)
        with self._lock:
            self._rebase(checkpoint)
        return checkpoint

    def _rebase(self, checkpoint: _Checkpoint) -> None:
        """``checkpoint`` is written everywhere: heads from now on are written against it (hold the lock)."""
        self._base = checkpoint
        # By identity: it holds the very entry objects of the state it was taken from, and
        # whatever changed since (even while the lock was let go) is another object.
        entries = checkpoint.entries
        dirty = {k for k, e in self._entries.items() if entries.get(k) is not e}
        dirty.update(k for k in entries if k not in self._entries)
        self._dirty = dirty

    def _now_named(self) -> str | None:
        """The tier's head now names this state's base: returns the checkpoint it named
        before, if that is another (to delete) (hold the lock)."""
        named = self._base.key if self._base is not None else None
        replaced, self._named = self._named, named
        return replaced if replaced != named else None

    def _delete_checkpoint(self, target: TierTarget, key: str | None) -> None:
        """Deletes a checkpoint no head names (any more); a failure leaves it to
        :meth:`collect_checkpoints`."""
        if key is None:
            return
        try:
            target.delete(key)
        except TierError as exc:
            log.warning("tier manifest of %r: cannot delete old checkpoint %s: %s", self._db, key, exc)

    @staticmethod
    def _write_local_file(path: Path, data: bytes) -> None:
        with atomic_writer(path, make_parents=True) as f:
            f.write(data)

    def _write_local(self, path: Path, head: bytes, base: _Checkpoint | None) -> None:
        """Writes the local copy: ``base``'s checkpoint file if it is not there yet, the
        head, then drops the checkpoint files the head does not name."""
        with self._local_lock:
            directory = local_checkpoint_dir(path)
            if base is not None and not (directory / base.name).is_file():
                self._write_local_file(directory / base.name, base.text)
            self._write_local_file(path, head)
            if directory.is_dir():
                for old in directory.iterdir():
                    if base is None or old.name != base.name:
                        old.unlink(missing_ok=True)

    @staticmethod
    def remove_local(path: Path) -> None:
        """Deletes a local copy and its checkpoints."""
        path.unlink(missing_ok=True)
        shutil.rmtree(local_checkpoint_dir(path), ignore_errors=True)

    def collect_checkpoints(self, target: TierTarget) -> list[str]:
        """Deletes the checkpoints older than the one the head names (a crash's leftovers;
        a newer one may be another writer's about to be named, and stays).

        Returns:
            The keys deleted.

        Raises:
            TierError: If the tier fails (call again).
        """
        with self._lock:
            floor = self._base.seq if self._base is not None else self._seq
            keep = self._base.key if self._base is not None else None
        deleted = []
        for key in target.list(f"{self._db}/{CHECKPOINT_DIR}/"):
            seq = checkpoint_seq(key)
            if seq is not None and seq < floor and key != keep:
                target.delete(key)
                deleted.append(key)
        return deleted

    # --- shared manifests (one writer per shard) ------------------------------------------

    @classmethod
    def load_shared(cls, target: TierTarget, db: str) -> Manifest:
        """Loads ``db``'s manifest for writing shard by shard (see the module docstring).

        It writes nothing until a shard is claimed (:meth:`claim`).

        Raises:
            TierError: If the tier fails or its copy is malformed.
        """
        manifest = cls(db)
        manifest._shared = True
        manifest.refresh(target)
        return manifest

    @property
    def shared(self) -> bool:
        """Whether each shard is written by the process that claimed it (:meth:`load_shared`)."""
        return self._shared

    def owned(self) -> dict[int, int]:
        """The shards this process writes, with its epoch for each (shared manifests)."""
        with self._lock:
            return dict(self._owned)

    def writer_epoch(self, shard: int) -> int:
        """The epoch of the shard's last writer as this copy knows it (-1: none)."""
        return self._writer_epochs.get(shard, -1)

    def refresh(self, target: TierTarget) -> list[int]:
        """Takes in other writers' saves: every shard this process does not write is replaced
        by the tier copy's; its own shards are kept unless claimed at a higher epoch.

        Returns:
            The shards this process lost that way (it no longer writes them).

        Raises:
            TierError: If the tier fails or its copy is malformed.
        """
        with self._lock:
            known = self._version
        remote, version, _ = self._read_remote(target, known)
        if remote is None:
            return []  # what this copy last merged or saved: nothing to take in
        return self._merge(remote, version)

    def claim(self, target: TierTarget, shard: int, epoch: int) -> list[str]:
        """Becomes the writer of ``shard`` at ``epoch`` (a leader epoch): takes the tier
        copy's entries of the shard, resolves the uploads and deletes its previous writer
        left half-done, and saves, which records the epoch and fences older writers.

        Returns:
            The recovery actions taken (as :meth:`recover`).

        Raises:
            TierFenced: The shard was claimed at a higher epoch already.
            TierError: The tier failed (nothing is claimed; call again).
        """
        if not self._shared:
            raise InvalidArgument("only a shared manifest (load_shared) is written shard by shard")
        self.refresh(target)
        with self._lock:
            if self._writer_epochs.get(shard, -1) > epoch:
                raise TierFenced(
                    f"shard {shard} of {self._db!r} is written at epoch {self._writer_epochs[shard]} > {epoch}"
                )
            self._owned[shard] = epoch
            self._writer_epochs[shard] = epoch
        try:
            actions = self._recover(target, shard)
            self.save(target)
        except BaseException:
            with self._lock:
                self._owned.pop(shard, None)
            raise
        try:
            actions += [f"deleted old checkpoint {k}" for k in self.collect_checkpoints(target)]
        except TierError as exc:
            log.warning("tier manifest of %r: old checkpoints stay for now: %s", self._db, exc)
        return actions

    def release(self, shard: int) -> None:
        """Stops writing ``shard`` (its leadership ended); the next refresh takes the tier's view."""
        with self._lock:
            self._owned.pop(shard, None)

    def _read_remote(
        self, target: TierTarget, known: str | None = None
    ) -> tuple[Manifest | None, str | None, bytes]:
        """The tier copy, its version and its head's bytes (an empty manifest when there is
        none); ``None`` for the copy when it is at ``known``: not parsed, as this copy holds
        it already. The checkpoint this copy is based on is not read again."""
        with self._lock:
            base = self._base
        return Manifest._read_tier(target, self._db, known_base=base, known_version=known)

    def _merge(self, remote: Manifest, version: str | None) -> list[int]:
        """Adopt ``remote`` (at ``version``) for every shard not written here. Call without
        the lock: the adopted shards are built outside it (only merges, one at a time, change
        them), so lookups wait only for the swap."""
        with self._merge_lock:
            with self._lock:
                owned = dict(self._owned)
            adopted = self._adopted(remote, owned)
            with self._lock:
                if self._owned != owned:  # claimed or released meanwhile: again, holding it
                    adopted = self._adopted(remote, self._owned)
                return self._install(remote, version, adopted)

    def _adopted(self, remote: Manifest, owned: dict[int, int]) -> _Adopted:
        """What ``remote`` gives this copy while it writes ``owned``: every other shard's
        entries (and those of shards claimed there at a higher epoch), with the keys of theirs
        changed since ``remote``'s checkpoint."""
        keep = {s for s, epoch in owned.items() if remote._writer_epochs.get(s, -1) <= epoch}
        by_shard: dict[int, dict[str, ManifestEntry]] = {}
        entries: dict[str, ManifestEntry] = {}
        for s, theirs in remote._by_shard.items():
            if s in keep:
                continue
            # Keep this copy's object of an unchanged entry: its saved text stays valid.
            # (Identity first: entries read from a checkpoint both copies hold are the same objects.)
            get = self._by_shard.get(s, {}).get
            adopted = {
                k: e if (old := get(k)) is None or (old is not e and old != e) else old
                for k, e in theirs.items()
            }
            by_shard[s] = adopted
            entries.update(adopted)
        dirty: set[str] = set()
        base = remote._base
        if base is not None:  # remote's changes since its checkpoint, in the adopted shards
            for key in remote._dirty:
                entry = remote._entries.get(key) or base.entries.get(key)
                if entry is not None and entry.shard not in keep:
                    dirty.add(key)
        return _Adopted(by_shard, entries, dirty)

    def _install(self, remote: Manifest, version: str | None, adopted: _Adopted) -> list[int]:
        """Swap in ``adopted`` beside this copy's own shards (hold the lock)."""
        lost = [s for s, epoch in self._owned.items() if remote._writer_epochs.get(s, -1) > epoch]
        for shard in lost:
            del self._owned[shard]
            log.warning(
                "tier manifest of %r: shard %d was claimed at epoch %d; this node no longer writes it",
                self._db,
                shard,
                remote._writer_epochs[shard],
            )
        mine = set(self._owned)
        by_shard = {s: v for s, v in self._by_shard.items() if s in mine}
        entries = adopted.entries  # built for this swap alone
        for own in by_shard.values():
            entries.update(own)
        by_shard.update(adopted.by_shard)
        self._by_shard = by_shard
        self._entries = entries
        self._views = {s: v for s, v in self._views.items() if s in mine}
        starts = {s: v for s, v in remote._log_starts.items() if s not in mine}
        starts.update({s: v for s, v in self._log_starts.items() if s in mine})
        self._log_starts = starts
        self._writer_epochs = {**remote._writer_epochs, **self._owned}
        self._seq = remote._seq
        self._version = version
        # Heads from now on are written against the checkpoint the tier's names.
        base = self._base = remote._base
        self._named = remote._named
        if base is None:
            self._dirty = set()
            return lost
        dirty = adopted.dirty
        base_get = base.entries.get
        for s in mine:
            dirty.update(
                k for k, e in by_shard.get(s, {}).items() if (old := base_get(k)) is not e and old != e
            )
            dirty.update(k for k in base.by_shard.get(s, {}) if k not in entries)
        self._dirty = dirty
        return lost

    def _save_shared(self, target: TierTarget, local_path: Path | None) -> None:
        key = manifest_key(self._db)
        for _ in range(_SHARED_SAVE_ATTEMPTS):
            with self._lock:
                if not self._owned:
                    raise TierFenced(f"tier manifest of {self._db!r}: this node writes no shard of it")
                self._seq += 1
                checkpoint = self._plan_checkpoint()
            if checkpoint is not None:
                checkpoint = self._put_checkpoint(target, checkpoint)
            with self._lock:
                text = self._head()
                version = self._version
                base = self._base
            try:
                new_version = target.put_if(key, text, version)
            except PreconditionFailed:
                remote, found, data = self._read_remote(target)
                assert remote is not None  # read without a known version: always parsed
                if found is not None and data == text:
                    new_version = found  # a retried put whose first attempt landed
                else:
                    lost = self._merge(remote, found)
                    if checkpoint is not None:
                        self._delete_checkpoint(target, checkpoint.key)  # no head names it
                    if lost:
                        raise TierFenced(
                            f"tier manifest of {self._db!r}: shards {lost} were claimed by a newer leader"
                        ) from None
                    continue
            with self._lock:
                self._version = new_version
                replaced = self._now_named()
            self._delete_checkpoint(target, replaced)
            if local_path is not None:
                try:
                    self._write_local(local_path, text, base)
                except OSError as exc:  # a cache: the tier copy is the manifest
                    log.warning("cannot write local manifest cache %s: %s", local_path, exc)
            return
        raise TierError(
            f"tier manifest of {self._db!r}: {_SHARED_SAVE_ATTEMPTS} conditional puts lost in a row"
        )

    # --- retention floor -----------------------------------------------------------------

    def log_start(self, shard: int) -> int:
        """The shard's retention floor: offsets below it are deleted (0: none set).

        Objects wholly below it are being deleted; one that straddles it stays until it is
        wholly below, but its records under the floor are no longer readable.
        """
        return self._log_starts.get(shard, 0)

    def raise_log_start(self, shard: int, offset: int) -> bool:
        """Moves the floor of ``shard`` up to ``offset`` (never down); True if it moved."""
        with self._lock:
            self._check_writer(shard)
            if offset <= self._log_starts.get(shard, 0):
                return False
            self._log_starts[shard] = offset
            return True

    # --- mutations -----------------------------------------------------------------------

    def _check_writer(self, shard: int) -> None:
        if self._shared and shard not in self._owned:
            raise InvalidArgument(
                f"shard {shard} of {self._db!r}: this process does not write it (claim it first)"
            )

    def _check_key(self, entry: ManifestEntry) -> None:
        db, shard, base, end = parse_object_key(entry.key)
        if (db, shard, base, end) != (self._db, entry.shard, entry.base_offset, entry.end_offset):
            raise InvalidArgument(f"entry key {entry.key!r} does not match its db/shard/range")

    def _add(self, entry: ManifestEntry) -> None:
        self._check_key(entry)
        view = self._view(entry.shard)
        # The entries starting at or before this one's end: the last of them (other than
        # this key's own) is the only one that can reach into it.
        i = bisect_right(view.bases, entry.end_offset) - 1
        if i >= 0 and view.all[i].key == entry.key:
            i -= 1
        if i >= 0 and view.all[i].end_offset >= entry.base_offset:
            raise InvalidArgument(f"{entry.key!r} overlaps tiered object {view.all[i].key!r}")
        self._put(entry)

    def _add_all(self, entries: Iterable[ManifestEntry]) -> None:
        """Add many entries at once (a document being loaded): one sort per shard checks
        them for overlaps, not a search per entry."""
        added: set[int] = set()
        for entry in entries:
            self._check_key(entry)
            if entry.key in self._entries:
                raise InvalidArgument(f"{entry.key!r} is in the manifest twice")
            self._put(entry)
            added.add(entry.shard)
        self._check_overlaps(added)

    def _check_overlaps(self, shards: Iterable[int]) -> None:
        """Raises ``InvalidArgument`` if two entries of one of ``shards`` overlap (one sort each)."""
        for shard in shards:
            view = self._view(shard)
            for before, after in pairwise(view.all):
                if before.end_offset >= after.base_offset:
                    raise InvalidArgument(f"{after.key!r} overlaps tiered object {before.key!r}")

    def _put(self, entry: ManifestEntry) -> None:
        self._entries[entry.key] = entry
        self._dirty.add(entry.key)
        self._by_shard.setdefault(entry.shard, {})[entry.key] = entry
        self._views.pop(entry.shard, None)

    def _drop(self, entry: ManifestEntry) -> None:
        del self._entries[entry.key]
        self._dirty.add(entry.key)
        shard = self._by_shard[entry.shard]
        del shard[entry.key]
        if not shard:
            del self._by_shard[entry.shard]
        self._views.pop(entry.shard, None)

    def _view(self, shard: int) -> _ShardView:
        """``shard``'s sorted view, built now if a change dropped it (hold the lock)."""
        view = self._views.get(shard)
        if view is None:
            entries = self._by_shard.get(shard, {})
            view = self._views[shard] = _ShardView(sorted(entries.values(), key=lambda e: e.base_offset))
        return view

    def begin_upload(self, entry: ManifestEntry) -> ManifestEntry:
        """Records the intent to upload ``entry`` (state forced to ``uploading``).

        Re-beginning an ``uploading`` entry with the same key replaces it.

        Raises:
            InvalidArgument: If the key is already committed/deleting, does not match the
                entry's db/shard/range, or the range overlaps another object of the shard.
        """
        with self._lock:
            self._check_writer(entry.shard)
            old = self._entries.get(entry.key)
            if old is not None and old.state is not EntryState.UPLOADING:
                raise InvalidArgument(f"{entry.key!r} is already {old.state}")
            entry = replace(entry, state=EntryState.UPLOADING)
            self._add(entry)
            return entry

    def _advance(self, key: str, to: EntryState) -> ManifestEntry:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                raise InvalidArgument(f"{key!r} is not in the manifest of {self._db!r}")
            self._check_writer(entry.shard)
            if entry.state is to:
                return entry
            if _NEXT_STATE.get(entry.state) is not to:
                raise InvalidArgument(f"{key!r}: cannot go from {entry.state} to {to}")
            entry = replace(entry, state=to)
            self._put(entry)
            return entry

    def mark_committed(self, key: str) -> ManifestEntry:
        """``uploading`` -> ``committed`` (after the object was put and verified)."""
        return self._advance(key, EntryState.COMMITTED)

    def mark_deleting(self, key: str) -> ManifestEntry:
        """``committed`` -> ``deleting`` (before the object is deleted)."""
        return self._advance(key, EntryState.DELETING)

    def remove(self, key: str) -> None:
        """Drops a ``deleting`` entry (object deleted) or an ``uploading`` one (aborted)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return
            self._check_writer(entry.shard)
            if entry.state is EntryState.COMMITTED:
                raise InvalidArgument(f"{key!r} is committed: mark it deleting first")
            self._drop(entry)

    # --- queries -------------------------------------------------------------------------

    def _sorted(self) -> list[ManifestEntry]:
        return [e for shard in sorted(self._by_shard) for e in self._view(shard).all]

    def get(self, key: str) -> ManifestEntry | None:
        """Returns the entry for ``key`` in any state, or ``None``."""
        with self._lock:
            return self._entries.get(key)

    def entries(self, state: EntryState | None = None) -> list[ManifestEntry]:
        """Returns entries (optionally only those in ``state``), by shard then offset."""
        with self._lock:
            if state is EntryState.COMMITTED:
                return [e for shard in sorted(self._by_shard) for e in self._view(shard).committed]
            return [e for e in self._sorted() if state is None or e.state is state]

    def committed(
        self,
        shard: int | None = None,
        *,
        start_offset: int | None = None,
        end_offset: int | None = None,
        start_ts: int | None = None,
        end_ts: int | None = None,
    ) -> list[ManifestEntry]:
        """Returns committed entries that may hold matching records.

        Args:
            shard: Only this shard (None: all).
            start_offset: Entries whose ``end_offset >= start_offset``.
            end_offset: Entries whose ``base_offset <= end_offset`` (inclusive).
            start_ts: Entries whose ``max_ts >= start_ts`` (µs).
            end_ts: Entries whose ``min_ts <= end_ts`` (µs, inclusive).

        Returns:
            Matching entries sorted by shard, then base offset.
        """
        out: list[ManifestEntry] = []
        with self._lock:
            for s in sorted(self._by_shard) if shard is None else [shard]:
                if s not in self._by_shard:
                    continue
                view = self._view(s)
                committed = view.committed
                i = 0 if start_offset is None else bisect_left(view.committed_ends, start_offset)
                j = len(committed) if end_offset is None else bisect_right(view.committed_bases, end_offset)
                if start_ts is None and end_ts is None:
                    out += committed[i:j]
                else:
                    out += [e for e in committed[i:j] if e.overlaps_time(start_ts, end_ts)]
        return out

    def find_offset(self, shard: int, offset: int) -> ManifestEntry | None:
        """Returns the committed entry of ``shard`` holding ``offset``, or ``None``."""
        found = self.committed(shard, start_offset=offset, end_offset=offset)
        return found[0] if found else None

    def tiered_end(self, shard: int) -> int | None:
        """Returns the highest committed ``end_offset`` of ``shard`` (None if none)."""
        with self._lock:
            committed = self._view(shard).committed if shard in self._by_shard else []
            return committed[-1].end_offset if committed else None

    def committed_bytes(self, shard: int) -> int:
        """Bytes of the committed objects of ``shard``."""
        with self._lock:
            return self._view(shard).committed_bytes if shard in self._by_shard else 0

    def run_start(self, shard: int, offset: int) -> int | None:
        """The first offset of the gapless run of committed objects of ``shard`` whose last
        object holds ``offset - 1`` (``None``: no committed object holds it)."""
        with self._lock:
            if shard not in self._by_shard:
                return None
            view = self._view(shard)
            # The first object ending at or past offset - 1 holds it if it starts below offset.
            i = bisect_left(view.committed_ends, offset - 1)
            if i == len(view.committed) or view.committed[i].base_offset >= offset:
                return None
            return view.run_starts[i]

    def shards(self) -> list[int]:
        """Returns the shards with at least one entry, sorted."""
        with self._lock:
            return sorted(self._by_shard)

    # --- recovery ------------------------------------------------------------------------

    def recover(self, target: TierTarget) -> list[str]:
        """Resolves ``uploading`` and ``deleting`` entries left by a crash (see module doc).

        Changes memory only; save afterwards if the returned list is non-empty.

        Returns:
            One line per action taken, e.g. ``"committed db/shard=0/..."``.

        Raises:
            TierError: If the tier fails (the manifest is then partly recovered; retry).
        """
        if self._shared:
            return [a for shard in sorted(self._owned) for a in self._recover(target, shard)]
        return self._recover(target, None)

    def _recover(self, target: TierTarget, shard: int | None) -> list[str]:
        actions: list[str] = []
        # A snapshot of the entries, and no lock across the tier's calls (the mutators lock).
        for entry in self.entries():
            if shard is not None and entry.shard != shard:
                continue
            if entry.state is EntryState.UPLOADING:
                try:
                    target.verify(entry.key, entry.object_info)
                except ObjectNotFound:
                    self.remove(entry.key)
                    actions.append(f"dropped {entry.key}")
                    continue
                except ObjectMismatch as exc:
                    log.warning("discarding unverifiable upload %s: %s", entry.key, exc)
                    target.delete(entry.key)
                    self.remove(entry.key)
                    actions.append(f"deleted {entry.key}")
                    continue
                self.mark_committed(entry.key)
                actions.append(f"committed {entry.key}")
            elif entry.state is EntryState.DELETING:
                target.delete(entry.key)
                self.remove(entry.key)
                actions.append(f"removed {entry.key}")
        return actions

    def orphans(self, target: TierTarget) -> list[str]:
        """Returns object keys under ``<db>/shard=`` that no entry references."""
        with self._lock:
            known = set(self._entries)
        return [k for k in target.list(f"{self._db}/shard=") if k.endswith(".parquet") and k not in known]

    def __repr__(self) -> str:
        with self._lock:
            return f"Manifest(db={self._db!r}, seq={self._seq}, entries={len(self._entries)})"
