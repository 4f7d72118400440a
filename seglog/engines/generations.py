"""Generations of a database with streams: which offsets of each shard each one holds, on disk.

A *generation* is a run of every shard's log learned with one LTS (EMQX's generations;
``Database.add_generation``): it starts at an offset per shard, and the next one starts
where it ends. A new generation's tries inherit only the old ones' wildcard structure
(:meth:`~seglog.topics.LTS.inherit_wildcards`), so its stream ids are its own.

On disk, under the database's directory:

* ``generations.json`` -- the manifest, replaced atomically (the commit point of
  ``add_generation`` and ``drop_slab``): per generation its id, creation time, start offset
  per shard and whether it was dropped. A database without the file has one generation, 1,
  starting at offset 0 of every shard (every database made before generations existed).
* ``generations/gen-NNNNNN.lts`` -- a closed generation's final tries, one per shard
  (written before the manifest names a newer generation, so a committed closed generation
  always has its file). Reads of a closed generation's streams match filters against them.
* ``lts/`` holds the current generation's snapshots (:class:`SnapshotFiles`); generation
  ``G > 1`` keeps them in ``lts/gen-NNNNNN/``, so a snapshot of the old trie is never taken
  for the new one. Without a snapshot, a generation's trie is its predecessor's final trie's
  inherited wildcards, and the log from the generation's start is learned again.

Only the stamper of the leader changes generations: replication (``seglog.isr``,
``seglog.cluster``) does not carry them yet, so a follower's stream ids are those of one
generation.
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

from seglog._fs import atomic_write, makedirs_durable
from seglog.engines.base import GenerationInfo
from seglog.engines.streams import StreamLookups
from seglog.errors import CorruptLTS, InvalidArgument, StorageError, UnknownGeneration
from seglog.topics.lts import LTS

__all__ = ["GENERATIONS_FILE", "GEN_DIR", "GenerationLog", "GenerationLookups"]

log = logging.getLogger("seglog.engines.generations")

GENERATIONS_FILE: Final = "generations.json"
GEN_DIR: Final = "generations"
_TRIES_MAGIC: Final = b"SLGT"
_TRIES_VERSION: Final = 1
_TRIES_HEAD: Final = struct.Struct("<4sBI")  # magic, version, shard count
_LEN: Final = struct.Struct("<Q")
_CRC: Final = struct.Struct("<I")
_MANIFEST_VERSION: Final = 1


def _info_json(g: GenerationInfo) -> dict[str, Any]:
    return {"id": g.id, "created_us": g.created_us, "starts": list(g.starts), "dropped": g.dropped}


class GenerationLog:
    """The generations of one database (manifest and closed generations' tries).

    Args:
        db_directory: The database's directory.
        shards: Its number of shards.

    Raises:
        CorruptLTS: The manifest is unreadable or names another number of shards.
    """

    def __init__(self, db_directory: Path, shards: int) -> None:
        self.directory = db_directory
        self.shards = shards
        self._tries: dict[int, list[LTS]] = {}  # closed generation -> final tries (loaded lazily)
        path = db_directory / GENERATIONS_FILE
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            self.generations: list[GenerationInfo] = [GenerationInfo(1, 0, (0,) * shards)]
            return
        try:
            doc = json.loads(raw)
            if doc["version"] != _MANIFEST_VERSION:
                raise ValueError(f"manifest version {doc['version']!r}")
            gens = [
                GenerationInfo(
                    int(g["id"]), int(g["created_us"]), tuple(int(x) for x in g["starts"]), bool(g["dropped"])
                )
                for g in doc["generations"]
            ]
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptLTS(f"{path}: unreadable generations manifest ({exc})") from exc
        if not gens or any(len(g.starts) != shards for g in gens):
            raise CorruptLTS(f"{path}: the generations do not fit {shards} shards")
        if [g.id for g in gens] != list(range(gens[0].id, gens[0].id + len(gens))):
            raise CorruptLTS(f"{path}: generation ids are not consecutive")
        self.generations = gens

    # --- lookups -----------------------------------------------------------------------

    @property
    def current(self) -> GenerationInfo:
        """The generation appends go to (the newest)."""
        return self.generations[-1]

    def get(self, generation: int) -> GenerationInfo | None:
        """A generation of the manifest, or ``None`` (never existed, or forgotten)."""
        if type(generation) is not int:
            return None
        i = generation - self.generations[0].id
        return self.generations[i] if 0 <= i < len(self.generations) else None

    def end(self, generation: int, shard: int) -> int | None:
        """The offset of ``shard`` where ``generation`` ends (``None``: it is the current one)."""
        nxt = self.get(generation + 1)
        return None if nxt is None else nxt.starts[shard]

    def until_us(self, generation: int) -> int | None:
        """When ``generation`` was closed (the next one's creation), ``None`` while current."""
        nxt = self.get(generation + 1)
        return None if nxt is None else nxt.created_us

    def tries_path(self, generation: int) -> Path:
        return self.directory / GEN_DIR / f"gen-{generation:06d}.lts"

    def final_trie(self, generation: int, shard: int) -> LTS:
        """A closed generation's final trie of ``shard`` (read from its file once).

        Raises:
            CorruptLTS: The file is missing or damaged.
        """
        tries = self._tries.get(generation)
        if tries is None:
            path = self.tries_path(generation)
            try:
                data = path.read_bytes()
            except FileNotFoundError as exc:
                raise CorruptLTS(f"{path}: the tries of closed generation {generation} are missing") from exc
            tries = self._tries[generation] = decode_tries(data, self.shards, path)
        return tries[shard]

    def mark_unreadable(self, generation: int) -> None:
        """Serve empty tries for a closed generation whose tries file is damaged."""
        empty = LTS([1], cache_size=0)
        self._tries[generation] = [empty] * self.shards

    def snapshot_subdir(self, generation: int) -> str | None:
        """Where generation's LTS snapshots go under ``lts/`` (``None``: ``lts/`` itself)."""
        return None if generation == 1 else f"gen-{generation:06d}"

    # --- changes (the caller serialises them) -------------------------------------------

    def write_final_tries(self, generation: int, tries: list[LTS]) -> None:
        """Write a generation's final tries durably (before the manifest names its successor)."""
        self.save_final_tries(generation, tries)
        self._tries[generation] = tries

    def save_final_tries(self, generation: int, tries: list[LTS]) -> None:
        """(Any thread) The file part of :meth:`write_final_tries`; :meth:`adopt` takes it in."""
        makedirs_durable(self.directory / GEN_DIR)
        atomic_write(self.tries_path(generation), encode_tries(tries))

    def commit(self, generations: list[GenerationInfo]) -> None:
        """Replace the manifest atomically and durably (raises ``OSError``; the old one stays)."""
        self.save_manifest(generations)
        self.generations = generations

    def save_manifest(self, generations: list[GenerationInfo]) -> None:
        """(Any thread) The file part of :meth:`commit`."""
        doc = {"version": _MANIFEST_VERSION, "generations": [_info_json(g) for g in generations]}
        atomic_write(self.directory / GENERATIONS_FILE, json.dumps(doc, separators=(",", ":")).encode())

    def adopt(self, generation: int, tries: list[LTS], generations: list[GenerationInfo]) -> None:
        """(Loop) Take in what :meth:`save_final_tries` and :meth:`save_manifest` wrote."""
        self._tries[generation] = tries
        self.generations = generations

    def clamp_to(self, log_ends: list[int]) -> bool:
        """Move generation starts past a shard's log end back to it (at open, durably).

        A generation starts at each shard's *next* offset when it is added, which counts
        appends still in flight; a crash may lose them (they were never acknowledged), and
        their offsets are handed out again, to the current generation's records.

        Returns:
            Whether anything moved (then the manifest was rewritten).

        Raises:
            OSError: The manifest could not be written.
        """
        clamped = [
            replace(g, starts=tuple(min(start, end) for start, end in zip(g.starts, log_ends, strict=True)))
            for g in self.generations
        ]
        if clamped == self.generations:
            return False
        self.commit(clamped)
        return True

    def forget_tries(self, generation: int) -> None:
        """Delete a dropped generation's tries file (best effort)."""
        self._tries.pop(generation, None)
        self.tries_path(generation).unlink(missing_ok=True)


class GenerationLookups(StreamLookups):
    """The generation questions of an engine with a :class:`GenerationLog` (``generations``)
    and a stamper (``_streams``, the current generation's tries; see :class:`StreamLookups`)."""

    generations: GenerationLog | None

    @property
    def generations_enabled(self) -> bool:
        """Whether the database has streams, hence generations."""
        return self.generations is not None

    def _generation_log(self) -> GenerationLog:
        if self.generations is None or self._streams is None:
            raise InvalidArgument("this database has no streams, hence no generations")
        return self.generations

    def list_generations(self) -> list[GenerationInfo]:
        return list(self._generation_log().generations)

    def _closed_trie(self, generation: int, shard: int) -> LTS | None:
        """A closed generation's final trie, ``None`` for the current one."""
        gens = self._generation_log()
        if gens.get(generation) is None:
            raise UnknownGeneration(f"no generation {generation!r}")
        if generation == gens.current.id:
            return None
        try:
            return gens.final_trie(generation, shard)
        except CorruptLTS as exc:
            # Its streams cannot be matched any more (its records stay readable by offset).
            log.error("generation %d: %s; its streams are left out of stream reads", generation, exc)
            gens.mark_unreadable(generation)
            return gens.final_trie(generation, shard)

    def generation_streams(
        self, generation: int, shard: int, topic_filter: str
    ) -> list[tuple[int, tuple[str, ...], bool]]:
        self._check_shard_number(shard)
        lts = self._closed_trie(generation, shard)
        if lts is None:
            stamper = self._streams
            assert stamper is not None
            out = []
            for sid, _vf in stamper.match(shard, topic_filter):
                found = stamper.structure(shard, sid)
                if found is not None:
                    out.append((sid, *found))
            return out
        return [(sid, lts.structure(sid), lts.is_special(sid)) for sid, _vf in lts.match(topic_filter)]

    def generation_stream_structure(
        self, generation: int, shard: int, stream: int
    ) -> tuple[tuple[str, ...], bool] | None:
        self._check_shard_number(shard)
        lts = self._closed_trie(generation, shard)
        if lts is None:
            assert self._streams is not None
            return self._streams.structure(shard, stream)
        if type(stream) is not int or not 0 <= stream < lts.stream_count:
            return None
        return lts.structure(stream), lts.is_special(stream)

    def _mark_dropped_blocking(self, generation: int) -> None:
        gens = self._generation_log()
        info = gens.get(generation)
        if info is None or info.dropped:
            return
        gens.commit([replace(g, dropped=True) if g.id == generation else g for g in gens.generations])
        if generation < gens.current.id - 1:  # the one before the current is its recovery base
            gens.forget_tries(generation)

    async def mark_generation_dropped(self, generation: int) -> None:
        """Record durably that a closed generation was dropped (the caller frees its records).

        Raises:
            StorageError: The manifest could not be written (the generation stays).
        """
        try:
            await asyncio.to_thread(self._mark_dropped_blocking, generation)
        except OSError as exc:
            raise StorageError(f"cannot record that generation {generation} was dropped") from exc


def encode_tries(tries: list[LTS]) -> bytes:
    """Every shard's trie in one file body (:meth:`LTS.to_bytes` each, with a CRC)."""
    parts = [_TRIES_HEAD.pack(_TRIES_MAGIC, _TRIES_VERSION, len(tries))]
    for lts in tries:
        raw = lts.to_bytes()
        parts += [_LEN.pack(len(raw)), raw]
    body = b"".join(parts)
    return body + _CRC.pack(zlib.crc32(body))


def decode_tries(data: bytes, shards: int, path: Path) -> list[LTS]:
    """Inverse of :func:`encode_tries`.

    Raises:
        CorruptLTS: Damaged, or for another number of shards.
    """
    if len(data) < _TRIES_HEAD.size + _CRC.size:
        raise CorruptLTS(f"{path}: too short for a generation's tries")
    body, (crc,) = data[: -_CRC.size], _CRC.unpack(data[-_CRC.size :])
    if zlib.crc32(body) != crc:
        raise CorruptLTS(f"{path}: CRC mismatch")
    magic, version, count = _TRIES_HEAD.unpack_from(body, 0)
    if magic != _TRIES_MAGIC or version != _TRIES_VERSION or count != shards:
        raise CorruptLTS(f"{path}: not the tries of {shards} shards (magic {magic!r}, version {version})")
    at = _TRIES_HEAD.size
    out = []
    for _ in range(count):
        (size,) = _LEN.unpack_from(body, at)
        at += _LEN.size
        out.append(LTS.from_bytes(body[at : at + size], cache_size=0))
        at += size
    if at != len(body):
        raise CorruptLTS(f"{path}: lengths do not add up")
    return out
