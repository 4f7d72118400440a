"""MQTT topic names and filters."""

from __future__ import annotations

from seglog.topics.filters import (
    MAX_TOPIC_BYTES,
    filter_literal_prefix,
    filter_to_regex,
    is_wildcard_filter,
    topic_matches,
    validate_topic_filter,
)

__all__ = [
    "MAX_TOPIC_BYTES",
    "filter_literal_prefix",
    "filter_to_regex",
    "is_wildcard_filter",
    "topic_matches",
    "validate_topic_filter",
]
