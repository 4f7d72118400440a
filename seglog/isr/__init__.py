"""ISR replication: leader-side follower tracking, high watermark, acks, ISR changes."""

from __future__ import annotations

from seglog.isr.leader_state import Acks, IsrChange, ShardLeaderState

__all__ = ["Acks", "IsrChange", "ShardLeaderState"]
