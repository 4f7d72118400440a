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
from seglog.topics.lts import (
    DEFAULT_LTS_THRESHOLDS,
    LTS,
    structure_regex,
    varying_filter_for,
    varying_matches,
)
from seglog.topics.streams import StreamStamper

__all__ = [
    "DEFAULT_LTS_THRESHOLDS",
    "LTS",
    "MAX_TOPIC_BYTES",
    "StreamStamper",
    "filter_literal_prefix",
    "filter_to_regex",
    "is_wildcard_filter",
    "structure_regex",
    "topic_matches",
    "validate_topic_filter",
    "varying_filter_for",
    "varying_matches",
]
