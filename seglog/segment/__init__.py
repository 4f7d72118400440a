"""Segment files of a shard: append, roll, seal, recover, read."""

from seglog.segment.log_segment import LogSegment, segment_name
from seglog.segment.shard_log import FramePosition, RecoveryReport, ShardLog

__all__ = ["FramePosition", "LogSegment", "RecoveryReport", "ShardLog", "segment_name"]
