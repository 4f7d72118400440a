"""Segment files of a shard: append, roll, seal, recover, read."""

from seglog.segment.epoch_cache import (
    LEADER_EPOCH_FILE,
    UNDEFINED_EPOCH,
    UNDEFINED_OFFSET,
    EpochEntry,
    LeaderEpochCache,
)
from seglog.segment.high_watermark import HIGH_WATERMARK_FILE, HighWatermarkCheckpoint
from seglog.segment.log_loader import RecoveryReport, open_shard_log
from seglog.segment.log_segment import LogSegment, segment_name
from seglog.segment.shard_log import FramePosition, ShardLog

__all__ = [
    "HIGH_WATERMARK_FILE",
    "LEADER_EPOCH_FILE",
    "UNDEFINED_EPOCH",
    "UNDEFINED_OFFSET",
    "EpochEntry",
    "FramePosition",
    "HighWatermarkCheckpoint",
    "LeaderEpochCache",
    "LogSegment",
    "RecoveryReport",
    "ShardLog",
    "open_shard_log",
    "segment_name",
]
