"""The vectorised JSON-lines fast path of produce agrees with the per-line parser.

``ndjson_table`` either returns exactly the records ``parse_ndjson`` builds (as columns) or
``None``, which sends the body to ``parse_ndjson`` (and its errors with line indexes).
"""

from __future__ import annotations

import contextlib
import json

import pytest

from seglog.cluster.produce import ndjson_table, parse_ndjson
from seglog.errors import InvalidRecord


def _rows(body: bytes) -> list[tuple[object, ...]]:
    return [(r.topic, r.value, r.key, r.ts) for r in parse_ndjson(body)]


def _lines(*objs: object) -> bytes:
    return b"".join(json.dumps(o).encode() + b"\n" for o in objs)


FAST = [
    _lines({"topic": "a/b", "value": "x"}),
    _lines(
        {"topic": "a", "value": "v1", "key": "k", "ts": 1_700_000_000_000_000}, {"topic": "b", "value": ""}
    ),
    _lines({"topic": "t", "value": "é ✓ \u00e9", "key": None, "ts": None}),
    b'\n  \n{"topic":"a","value":"x"}\r\n\n{"ts":-0,"value":"y","topic":"b"}',
    _lines(
        *({"topic": f"s/{i}", "value": "v" * i, "key": f"d{i % 7}", "ts": 10**15 + i} for i in range(500))
    ),
]


@pytest.mark.parametrize("body", FAST)
def test_fast_path_builds_the_same_records(body: bytes) -> None:
    table = ndjson_table(body)
    assert table is not None
    got = list(zip(*(table.column(c).to_pylist() for c in ("topic", "value", "key", "ts")), strict=True))
    assert got == _rows(body)


SLOW = [
    b"",  # nothing to append
    b"\n\n",
    _lines({"topic": "a", "value": {"base64": "eA=="}}),
    _lines({"topic": "a", "value": "x", "headers": {"h": "v"}}),
    _lines({"topic": "a", "value": None}),
    _lines({"topic": None, "value": "x"}),
    _lines({"value": "x"}),
    _lines({"topic": "a", "value": 5}),
    _lines({"topic": "a", "value": "x", "ts": 1.5}),
    _lines({"topic": "a", "value": "x", "ts": True}),
    _lines({"topic": "a", "value": "x", "ts": 2**70}),
    _lines({"topic": "a", "value": "x", "zz": 1}),
    b'{"topic":"a","value":"x"}{"topic":"b","value":"y"}\n',  # two objects on a line
    b'{"topic":"a",\n"value":"x"}\n',  # one object over two lines
    b'{"topic":"a","value":"x","value":"y"}\n',  # duplicate field: the last one wins
    b"[1, 2]\n",
    b"not json\n",
]


@pytest.mark.parametrize("body", SLOW)
def test_everything_else_takes_the_line_parser(body: bytes) -> None:
    assert ndjson_table(body) is None
    with contextlib.suppress(InvalidRecord):  # the line parser reports it, with the line index
        _rows(body)
