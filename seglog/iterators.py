"""Streams and stream iterators: the positions of wildcard reads (EMQX Durable Storage's API).

A :class:`Stream` is one learned topic structure of one shard (``metrics/+/cpu`` in shard
2): every record whose topic the shard's LTS maps to it, in offset (append) order.
``Database.get_streams(filter)`` lists the streams that may hold matching topics,
``Database.make_iterator(stream, filter, start)`` positions an :class:`Iterator` at the
start of one, and ``Database.next(iterator, n)`` returns the next matching records and the
iterator that goes on after them.

An iterator is a small value, not a handle: it holds nothing open, may be stored (see
:meth:`Iterator.to_bytes`), and survives restarts, since stream ids are a function of the
log (they are learned again in the same order).

Streams and iterators belong to one *generation* (``Database.add_generation``): a stream
id means something only within its generation, whose records of a shard are an offset range
of it. Once a newer generation exists, ``next`` on an iterator that has read all of its
generation's records returns an empty batch with ``end_of_stream`` set.

Iterator bytes (version 3, little-endian), 52 bytes plus the varying filter::

    offset  size  field
    0       2     magic b"SI"
    2       1     version (3; version 2, without the epoch field, is read with epoch -1;
                  version 1, without the generation field either, as generation 1: every
                  iterator made before generations existed)
    3       1     flags (bit 0: end of stream)
    4       8     database id (u64; another database's iterators are refused)
    12      4     shard (u32)
    16      4     stream id (u32)
    20      4     structure check: CRC-32 of the stream's learned structure (a stream id of
                  a log that was cut back and relearned something else is refused)
    24      8     position: the next offset of the shard to read (u64)
    32      8     start time (i64 µs since 1970; earlier records are skipped)
    40      4     generation (u32; versions 2 and 3)
    44      4     epoch (i32; version 3 only): the leader epoch of the record before the
                  position, -1 when unknown (see :class:`Iterator`)
    48      ...   varying filter: a LEB128 count, then per varying level a LEB128 value,
                  0 for "any token", else the token's UTF-8 length + 1 followed by it
    ...     4     CRC-32 of everything before it

The filter is kept compressed to the stream's varying levels (EMQX's ``compress_topic``):
the static levels are the stream's own, so ``metrics/+/cpu`` read with ``metrics/#`` stores
one byte of filter.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Final

from seglog.errors import InvalidIterator

__all__ = ["Iterator", "Slab", "Stream", "structure_check"]

_MAGIC: Final = b"SI"
_VERSION: Final = 3
_VERSION_2: Final = 2  # before epochs: no epoch field (epoch -1, unknown)
_VERSION_1: Final = 1  # before generations: no generation field (generation 1)
_FLAG_END: Final = 0x01
_HEAD: Final = struct.Struct("<2sBBQIIIQq")
_GEN: Final = struct.Struct("<I")
_EPOCH: Final = struct.Struct("<i")
_CRC: Final = struct.Struct("<I")
assert _HEAD.size == 40


def structure_check(structure: Sequence[str], special: bool) -> int:
    """The CRC-32 of a learned structure and its root, as iterators and streams carry it."""
    text = ("$" if special else "") + "\x00" + "/".join(structure)
    return zlib.crc32(text.encode("utf-8", "surrogatepass"))


@dataclass(frozen=True)
class Stream:
    """One learned topic structure of one shard of a database (see the module docstring).

    Attributes:
        shard: The shard.
        id: The stream id within the shard (dense, in order of learning).
        structure: The learned levels, ``+`` where topics vary (``("metrics", "+", "cpu")``).
        special: Whether its topics start with ``$`` (they live under their own root).
        generation: The generation whose trie learned it (ids are per generation).
    """

    shard: int
    id: int
    structure: tuple[str, ...]
    special: bool = False
    db_id: int = field(default=0, repr=False)
    generation: int = 1

    @property
    def pattern(self) -> str:
        """The structure as a topic filter, e.g. ``metrics/+/cpu``."""
        return "/".join(self.structure)

    @property
    def check(self) -> int:
        """The structure's CRC-32 (see :func:`structure_check`)."""
        return structure_check(self.structure, self.special)


@dataclass(frozen=True)
class Iterator:
    """A position in one stream, with the filter and start time of the read.

    Made by ``Database.make_iterator`` and returned (moved on) by ``Database.next``; see the
    module docstring. Compare, store with :meth:`to_bytes`, restore with :meth:`from_bytes`.

    Attributes:
        shard: The stream's shard.
        stream: The stream id.
        position: The next offset of the shard to read.
        start_time_us: Records with an earlier ``ts`` are skipped.
        varying_filter: Per varying level of the stream, the token the filter requires
            there, or ``None`` for any.
        end_of_stream: The stream's generation is closed and every record of it was read.
        generation: The stream's generation.
        epoch: The leader epoch that wrote the record before ``position``, or -1 when
            unknown. ``Database.next`` sets it; with it, a log that was cut back below the
            position and written again under a newer epoch (a failover truncated this
            replica) is noticed: the iterator goes on from where the logs diverged instead
            of skipping the new records there (Kafka's KIP-320 for consumers).
    """

    db_id: int = field(repr=False)
    shard: int
    stream: int
    check: int = field(repr=False)
    position: int
    start_time_us: int
    varying_filter: tuple[str | None, ...] = ()
    end_of_stream: bool = False
    generation: int = 1
    epoch: int = -1

    def advanced(self, position: int, epoch: int = -1) -> Iterator:
        """The same iterator at another position (the epoch before it ``epoch``, -1: unknown)."""
        return replace(self, position=position, epoch=epoch)

    def to_bytes(self) -> bytes:
        """The iterator in a few dozen bytes (format in the module docstring)."""
        head = _HEAD.pack(
            _MAGIC,
            _VERSION,
            _FLAG_END if self.end_of_stream else 0,
            self.db_id,
            self.shard,
            self.stream,
            self.check,
            self.position,
            self.start_time_us,
        )
        parts = [head, _GEN.pack(self.generation), _EPOCH.pack(self.epoch), _leb128(len(self.varying_filter))]
        for token in self.varying_filter:
            if token is None:
                parts.append(b"\x00")
            else:
                raw = token.encode("utf-8")
                parts.append(_leb128(len(raw) + 1))
                parts.append(raw)
        body = b"".join(parts)
        return body + _CRC.pack(zlib.crc32(body))

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> Iterator:
        """An iterator written by :meth:`to_bytes`.

        Only the bytes are checked here; the database checks, when the iterator is used,
        that it is one of its own (``ForeignIterator``, ``UnknownStream``).

        Raises:
            InvalidIterator: Not bytes, too short, wrong magic or version, CRC mismatch,
                or a malformed filter.
        """
        if not isinstance(data, bytes | bytearray | memoryview):
            raise InvalidIterator(f"iterator bytes must be bytes, not {type(data).__name__}")
        raw = bytes(data)
        if len(raw) < _HEAD.size + 1 + _CRC.size:
            raise InvalidIterator(f"{len(raw)} bytes are too short for a stream iterator")
        magic, version, flags, db_id, shard, stream, check, position, start = _HEAD.unpack_from(raw, 0)
        if magic != _MAGIC:
            raise InvalidIterator(f"not a stream iterator (magic {magic!r})")
        if version not in (_VERSION, _VERSION_2, _VERSION_1):
            raise InvalidIterator(
                f"stream iterator version {version} is not supported (this build: {_VERSION_1}..{_VERSION})"
            )
        body, (crc,) = raw[: -_CRC.size], _CRC.unpack(raw[-_CRC.size :])
        if zlib.crc32(body) != crc:
            raise InvalidIterator("stream iterator CRC mismatch (damaged or altered)")
        if flags & ~_FLAG_END:
            raise InvalidIterator(f"unknown stream iterator flags {flags:#x}")
        pos = _HEAD.size
        generation = 1
        epoch = -1
        if version >= _VERSION_2:
            if len(body) < pos + _GEN.size + 1:
                raise InvalidIterator("stream iterator ends inside its generation")
            (generation,) = _GEN.unpack_from(body, pos)
            pos += _GEN.size
            if generation < 1:
                raise InvalidIterator("stream iterator generation 0 does not exist (the first is 1)")
        if version >= _VERSION:
            if len(body) < pos + _EPOCH.size + 1:
                raise InvalidIterator("stream iterator ends inside its epoch")
            (epoch,) = _EPOCH.unpack_from(body, pos)
            pos += _EPOCH.size
            if epoch < -1:
                raise InvalidIterator(f"stream iterator epoch {epoch} is out of range (-1: unknown)")
        try:
            count, pos = _read_leb128(body, pos)
            vf: list[str | None] = []
            for _ in range(count):
                size, pos = _read_leb128(body, pos)
                if size == 0:
                    vf.append(None)
                    continue
                end = pos + size - 1
                if end > len(body):
                    raise InvalidIterator("stream iterator filter runs past its end")
                vf.append(body[pos:end].decode("utf-8"))
                pos = end
        except UnicodeDecodeError as exc:
            raise InvalidIterator("stream iterator filter is not UTF-8") from exc
        if pos != len(body):
            raise InvalidIterator(f"{len(body) - pos} stray bytes in a stream iterator")
        if position >= 1 << 63:
            raise InvalidIterator(f"stream iterator position {position} is out of range")
        return cls(
            db_id,
            shard,
            stream,
            check,
            position,
            start,
            tuple(vf),
            bool(flags & _FLAG_END),
            generation,
            epoch,
        )


@dataclass(frozen=True)
class Slab:
    """One generation of a database, as ``Database.list_slabs`` describes it.

    EMQX's slab is a (shard, generation) pair; seglog adds and drops generations on every
    shard at once, so a :class:`Slab` covers every shard and says where in each it lies.

    Attributes:
        generation: The generation (the first is 1).
        created_us: When it was added (µs since 1970; 0 for the first).
        until_us: When it was closed (the next one's creation); ``None`` while current.
        since: Per shard, the first offset of the generation.
        until: Per shard, the offset where it ends (the next one's start); ``None`` while
            current.
        dropped: Whether ``drop_slab`` dropped it (its reads raise ``GenerationDropped``).
        current: Whether appends go to it (the newest generation).
    """

    generation: int
    created_us: int
    until_us: int | None
    since: tuple[int, ...]
    until: tuple[int, ...] | None
    dropped: bool
    current: bool


def _leb128(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_leb128(data: bytes, pos: int) -> tuple[int, int]:
    value = 0
    shift = 0
    while True:
        if pos >= len(data):
            raise InvalidIterator("stream iterator ends inside a number")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 35:
            raise InvalidIterator("stream iterator number is too long")
