"""The stream endpoints' wire shapes, shared by the server (:mod:`seglog.cluster.stream_routes`)
and the client (:mod:`seglog.client.streams`); nothing here does I/O.

A stream travels as :func:`stream_json` (no database id: the URL names the database). The
many-iterator read reply (``POST /v1/dbs/{db}/next`` with ``"iterators"``) is::

    HEAD_LEN   uint32 big-endian: length of the JSON head
    HEAD       JSON {"iterators": [base64, ...], "end_of_stream": [bool, ...], "counts": [int, ...]}
    ROWS       one Arrow IPC stream (``read_arrow``'s columns): every iterator's rows, in
               iterator order, ``counts[i]`` of them for iterator ``i``
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
from dataclasses import replace
from typing import Any, Final

import pyarrow as pa

from seglog.errors import InvalidIterator, RemoteError
from seglog.iterators import Iterator, Stream
from seglog.record import READ_SCHEMA

__all__ = [
    "MAX_NEXT_ITERATORS",
    "MAX_NEXT_RECORDS",
    "NEXT_REPLY",
    "decode_next_reply",
    "encode_next_reply",
    "iterator_from_text",
    "iterator_text",
    "stream_from_json",
    "stream_json",
]

NEXT_REPLY: Final = "application/vnd.seglog.next-reply"
# Bounds of one next request: records answered, iterators asked.
MAX_NEXT_RECORDS: Final = 100_000
MAX_NEXT_ITERATORS: Final = 10_000
_HEAD_LEN: Final = struct.Struct(">I")


def stream_json(stream: Stream) -> dict[str, Any]:
    """One stream as the wire carries it (the database is the URL's)."""
    return {
        "shard": stream.shard,
        "id": stream.id,
        "structure": list(stream.structure),
        "special": stream.special,
        "generation": stream.generation,
        "pattern": stream.pattern,
    }


def stream_from_json(obj: Any, db_id: int) -> Stream:
    """A stream of :func:`stream_json`, bound to ``db_id``.

    Raises:
        ValueError: Not of that shape (the server answers ``InvalidRequest``, the client
            raises ``RemoteError``).
    """
    try:
        shard, sid, structure = obj["shard"], obj["id"], obj["structure"]
        special, generation = obj.get("special", False), obj.get("generation", 1)
    except (TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"a stream is {{shard, id, structure, special, generation}}: {exc!r}") from None
    if not all(type(v) is int for v in (shard, sid, generation)) or type(special) is not bool:
        raise ValueError("a stream's shard, id and generation are ints, special a bool")
    if not isinstance(structure, list) or not all(isinstance(t, str) for t in structure):
        raise ValueError("a stream's structure is a list of strings")
    return Stream(shard, sid, tuple(structure), special, db_id, generation)


def iterator_text(it: Iterator, db_id: int) -> str:
    """An iterator as the wire carries it: base64 of its bytes with the database id ``db_id``."""
    return base64.b64encode(replace(it, db_id=db_id).to_bytes()).decode()


def iterator_from_text(text: Any) -> Iterator:
    """The iterator of :func:`iterator_text` (its database id as sent).

    Raises:
        InvalidIterator: Not base64 of an iterator.
    """
    if not isinstance(text, str):
        raise InvalidIterator("the iterator is a base64 string")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidIterator("the iterator is not base64") from None
    return Iterator.from_bytes(raw)


def encode_next_reply(iterators: list[str], ends: list[bool], tables: list[pa.Table]) -> bytes:
    """The many-iterator reply: the directory, then every iterator's rows in one Arrow stream."""
    head = {"iterators": iterators, "end_of_stream": ends, "counts": [t.num_rows for t in tables]}
    raw = json.dumps(head, separators=(",", ":")).encode()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, READ_SCHEMA) as writer:
        for table in tables:
            if table.num_rows:
                writer.write_table(table.cast(READ_SCHEMA))
    return b"".join([_HEAD_LEN.pack(len(raw)), raw, sink.getvalue().to_pybytes()])


def decode_next_reply(body: bytes) -> tuple[list[str], list[bool], list[pa.Table]]:
    """The iterators (base64), end flags and each iterator's rows of :func:`encode_next_reply`.

    Raises:
        RemoteError: The body is not such a reply.
    """
    try:
        (size,) = _HEAD_LEN.unpack_from(body, 0)
        head = json.loads(body[_HEAD_LEN.size : _HEAD_LEN.size + size])
        iterators, ends, counts = head["iterators"], head["end_of_stream"], head["counts"]
        table = pa.ipc.open_stream(body[_HEAD_LEN.size + size :]).read_all()
        if not len(iterators) == len(ends) == len(counts) or sum(counts) != table.num_rows:
            raise ValueError("the directory does not match the rows")
    except (struct.error, ValueError, KeyError, TypeError, pa.ArrowInvalid) as exc:
        raise RemoteError(f"malformed next reply from a node: {exc}") from exc
    tables, at = [], 0
    for count in counts:
        tables.append(table.slice(at, count))
        at += count
    return iterators, ends, tables
