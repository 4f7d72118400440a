"""MQTT topic filter validation, matching, literal prefix and regex equivalence."""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seglog.errors import InvalidTopicFilter
from seglog.topics import (
    MAX_TOPIC_BYTES,
    filter_literal_prefix,
    filter_to_regex,
    is_wildcard_filter,
    topic_matches,
    validate_topic_filter,
)

VALID = [
    "#",
    "+",
    "/",
    "a",
    "a/b",
    "a/+",
    "a/#",
    "+/+",
    "+/#",
    "/+",
    "a//b",
    "sport/tennis/+/#",
    "$SYS/#",
    "$SYS/+/x",
    "ü/ñ/+",
    "a b/ c",
    "a.b*c?/[x]",
    "+/+/+/+",
]
INVALID = [
    "",
    "a#",
    "#/a",
    "a/#/b",
    "a/b#",
    "a+",
    "+a",
    "a/+b/c",
    "##",
    "++",
    "a/#/#",
    "a\x00b",
    "\ud800",
]


@pytest.mark.parametrize("f", VALID)
def test_valid_filters(f: str) -> None:
    validate_topic_filter(f)


@pytest.mark.parametrize("f", INVALID)
def test_invalid_filters(f: str) -> None:
    with pytest.raises(InvalidTopicFilter):
        validate_topic_filter(f)
    with pytest.raises(InvalidTopicFilter):
        topic_matches(f, "a")


def test_length_limit_is_utf8_bytes() -> None:
    validate_topic_filter("a" * MAX_TOPIC_BYTES)
    with pytest.raises(InvalidTopicFilter):
        validate_topic_filter("a" * (MAX_TOPIC_BYTES + 1))
    with pytest.raises(InvalidTopicFilter):
        validate_topic_filter("é" * (MAX_TOPIC_BYTES // 2 + 1))  # 2 bytes each


def test_not_a_string() -> None:
    with pytest.raises(InvalidTopicFilter):
        validate_topic_filter(b"a/b")  # type: ignore[arg-type]


# (filter, topic, matches) -- the MQTT spec's examples and the '$' rule.
CASES = [
    ("sport/tennis/player1/#", "sport/tennis/player1", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/#", "sport", True),
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player1/tracking", False),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("+", "/finance", False),
    ("#", "a/b/c", True),
    ("#", "/", True),
    ("#", "$SYS/x", False),
    ("+/monitor/Clients", "$SYS/monitor/Clients", False),
    ("$SYS/#", "$SYS/monitor/Clients", True),
    ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
    ("a/$x", "a/$x", True),
    ("a/+", "a/$x", True),
    ("a/b", "a/b", True),
    ("a/b", "a/b/", False),
    ("a/b", "A/b", False),
    ("a//b", "a//b", True),
    ("a/+/b", "a//b", True),
    ("sensors/+/x/#", "sensors/s1/x", True),
    ("sensors/+/x/#", "sensors/s1/y/x", False),
    ("a.b", "aXb", False),
]


@pytest.mark.parametrize(("f", "topic", "expected"), CASES)
def test_topic_matches(f: str, topic: str, expected: bool) -> None:
    assert topic_matches(f, topic) is expected
    assert (re.fullmatch(filter_to_regex(f), topic) is not None) is expected


@pytest.mark.parametrize(
    ("f", "prefix"),
    [
        ("sensors/+/x/#", "sensors/"),
        ("a/b/#", "a/b"),
        ("a/b/+", "a/b/"),
        ("#", ""),
        ("+/x", ""),
        ("a/b", "a/b"),
        ("$SYS/#", "$SYS"),
        ("/#", ""),
        ("//+", "//"),
    ],
)
def test_literal_prefix(f: str, prefix: str) -> None:
    assert filter_literal_prefix(f) == prefix


def test_is_wildcard() -> None:
    assert is_wildcard_filter("a/+")
    assert is_wildcard_filter("#")
    assert not is_wildcard_filter("a/b")


# --- properties ------------------------------------------------------------------------

LEVEL_CHARS = st.sampled_from(["a", "b", "$", "é", ".", "*", " ", "\n"])
levels = st.text(LEVEL_CHARS, max_size=3)
topics = st.lists(levels, min_size=1, max_size=5).map("/".join).filter(bool)


@st.composite
def filters(draw: st.DrawFn) -> str:
    parts = draw(st.lists(st.one_of(levels, st.just("+")), min_size=1, max_size=5))
    if draw(st.booleans()):
        parts.append("#")
    return "/".join(parts) or "#"


@st.composite
def filter_and_topic(draw: st.DrawFn) -> tuple[str, str]:
    """A filter plus a topic derived from it (so matches are common) or a random one."""
    f = draw(filters())
    if draw(st.booleans()):
        return f, draw(topics)
    out: list[str] = []
    for level in f.split("/"):
        if level == "+":
            out.append(draw(levels))
        elif level == "#":
            out.extend(draw(st.lists(levels, max_size=3)))
        else:
            out.append(level)
    topic = "/".join(out) or "x"
    return f, topic


def reference_match(f: str, topic: str) -> bool:
    """A direct recursive transcription of the spec, independent of the implementation."""
    if topic.startswith("$") and f[:1] in ("+", "#"):
        return False

    def rec(fl: list[str], tl: list[str]) -> bool:
        if not fl:
            return not tl
        if fl[0] == "#":
            return True
        if not tl:
            return False
        return (fl[0] == "+" or fl[0] == tl[0]) and rec(fl[1:], tl[1:])

    return rec(f.split("/"), topic.split("/"))


@settings(max_examples=400, deadline=None)
@given(filter_and_topic())
def test_matches_reference_and_regex(pair: tuple[str, str]) -> None:
    f, topic = pair
    expected = reference_match(f, topic)
    assert topic_matches(f, topic) is expected
    assert (re.fullmatch(filter_to_regex(f), topic) is not None) is expected


@settings(max_examples=200, deadline=None)
@given(filters(), st.lists(topics, min_size=1, max_size=20))
def test_vectorised_regex_agrees(f: str, names: list[str]) -> None:
    """The RE2 (pyarrow) evaluation of the regex gives topic_matches' answers."""
    arr = pa.array(names, pa.string())
    got = pc.match_substring_regex(arr, filter_to_regex(f)).to_pylist()
    assert got == [topic_matches(f, t) for t in names]


@settings(max_examples=300, deadline=None)
@given(filter_and_topic())
def test_prefix_is_necessary(pair: tuple[str, str]) -> None:
    f, topic = pair
    if topic_matches(f, topic):
        assert topic.startswith(filter_literal_prefix(f))
