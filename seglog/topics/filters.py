"""MQTT topic filters: validation, matching and helpers for pushdown.

The rules are MQTT 3.1.1/5 section 4.7:

* a filter is a non-empty UTF-8 string of at most 65535 encoded bytes without NUL;
* levels are separated by ``/`` and may be empty (``/a`` has an empty first level);
* ``+`` matches exactly one whole level and must occupy a whole level;
* ``#`` matches the parent level and any number of child levels and must be the last
  level, alone (``a/#`` matches ``a``, ``a/b`` and ``a/b/c``);
* topics starting with ``$`` are not matched by a filter whose first level is a wildcard.
"""

from __future__ import annotations

__all__ = [
    "MAX_TOPIC_BYTES",
    "filter_literal_prefix",
    "filter_to_regex",
    "is_wildcard_filter",
    "topic_matches",
    "validate_topic_filter",
]

import functools

from seglog.errors import InvalidTopicFilter

MAX_TOPIC_BYTES = 65535
"""Largest topic name or filter, in UTF-8 bytes (the MQTT string length limit)."""

_LEVEL_SEP = "/"
_SINGLE = "+"
_MULTI = "#"
# RE2 (used by pyarrow.compute) and Python's re both accept these escaped as literals.
_REGEX_META = frozenset("\\.+*?()|[]{}^$")


def validate_topic_filter(topic_filter: str) -> None:
    """Checks that ``topic_filter`` is a well-formed MQTT topic filter.

    Args:
        topic_filter: The filter, e.g. ``sensors/+/temp/#``.

    Raises:
        InvalidTopicFilter: If it is empty, too long, contains NUL or a lone surrogate,
            or has a misplaced ``+`` or ``#``.
    """
    _validated_levels(topic_filter)


@functools.lru_cache(maxsize=1024)
def _validated_levels(topic_filter: str) -> tuple[str, ...]:
    if not isinstance(topic_filter, str):
        raise InvalidTopicFilter(f"topic filter must be str, not {type(topic_filter).__name__}")
    if not topic_filter:
        raise InvalidTopicFilter("topic filter is empty")
    if "\x00" in topic_filter:
        raise InvalidTopicFilter("topic filter contains NUL")
    try:
        encoded_bytes = len(topic_filter.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidTopicFilter("topic filter is not valid UTF-8") from exc
    if encoded_bytes > MAX_TOPIC_BYTES:
        raise InvalidTopicFilter(f"topic filter is {encoded_bytes} UTF-8 bytes, more than {MAX_TOPIC_BYTES}")
    levels = tuple(topic_filter.split(_LEVEL_SEP))
    last = len(levels) - 1
    for i, level in enumerate(levels):
        if _MULTI in level and (level != _MULTI or i != last):
            raise InvalidTopicFilter(f"'#' must be the last level and alone in it: {topic_filter!r}")
        if _SINGLE in level and level != _SINGLE:
            raise InvalidTopicFilter(f"'+' must occupy a whole level: {topic_filter!r}")
    return levels


def is_wildcard_filter(topic_filter: str) -> bool:
    """Returns whether a valid filter contains ``+`` or ``#`` (else it names one topic)."""
    levels = _validated_levels(topic_filter)
    return any(level in (_SINGLE, _MULTI) for level in levels)


def topic_matches(topic_filter: str, topic: str) -> bool:
    """Returns whether MQTT topic name ``topic`` matches ``topic_filter``.

    Args:
        topic_filter: A valid MQTT topic filter.
        topic: A topic name (not validated; a name containing wildcards never matches a
            wildcard level literally, it is compared level by level like any other).

    Raises:
        InvalidTopicFilter: If ``topic_filter`` is malformed.
    """
    levels = _validated_levels(topic_filter)
    if topic.startswith("$") and levels[0] in (_SINGLE, _MULTI):
        return False
    topic_levels = topic.split(_LEVEL_SEP)
    n_topic = len(topic_levels)
    for i, level in enumerate(levels):
        if level == _MULTI:
            return True  # matches the parent (i == n_topic) and any children
        if i >= n_topic:
            return False
        if level != _SINGLE and level != topic_levels[i]:
            return False
    return len(levels) == n_topic


def filter_literal_prefix(topic_filter: str) -> str:
    """Returns the longest string every topic matching ``topic_filter`` starts with.

    Levels before the first wildcard are kept; a following ``+`` level keeps the
    separator (``a/+`` -> ``a/``) while a following ``#`` drops it, because ``a/#``
    also matches the parent topic ``a``. A filter without wildcards is its own prefix.

    Examples:
        ``sensors/+/x/#`` -> ``sensors/``; ``a/b/#`` -> ``a/b``; ``#`` -> ``""``.

    Raises:
        InvalidTopicFilter: If ``topic_filter`` is malformed.
    """
    levels = _validated_levels(topic_filter)
    literal: list[str] = []
    for level in levels:
        if level == _SINGLE:
            return _LEVEL_SEP.join(literal) + _LEVEL_SEP if literal else ""
        if level == _MULTI:
            return _LEVEL_SEP.join(literal)
        literal.append(level)
    return topic_filter


def _escape_regex(text: str) -> str:
    return "".join("\\" + ch if ch in _REGEX_META else ch for ch in text)


def filter_to_regex(topic_filter: str) -> str:
    """Returns an anchored regular expression equivalent to :func:`topic_matches`.

    The expression uses only syntax shared by RE2 (``pyarrow.compute.match_substring_regex``)
    and Python's :mod:`re`, with ``(?s)`` so topics containing newlines match as well.

    Raises:
        InvalidTopicFilter: If ``topic_filter`` is malformed.
    """
    levels = _validated_levels(topic_filter)
    parts: list[str] = []
    for i, level in enumerate(levels):
        sep = "" if i == 0 else "/"
        if level == _MULTI:
            if i == 0:
                parts.append("(?:[^$].*)?")  # everything except '$'-topics
            else:
                parts.append("(?:/.*)?")
        elif level == _SINGLE:
            parts.append(sep + ("(?:[^/$][^/]*)?" if i == 0 else "[^/]*"))
        else:
            parts.append(sep + _escape_regex(level))
    return "(?s)^" + "".join(parts) + "$"
