"""Where a follower cuts its log before following a leader (KIP-101/279, never its high watermark).

On every change of leader epoch a follower asks the leader where its own latest epoch ends
there (OffsetsForLeaderEpoch) and cuts its log at that offset, or at its own end of the
epoch the leader answered with, whichever is lower; then it asks again for the epoch it now
ends with, until the leader's answer is not below its end. Truncating to its own high
watermark instead lost acknowledged records in Kafka (KIP-101's first scenario) and let
replicas diverge after double failures (the second); this rule does neither.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

from seglog.db import Database

__all__ = ["UNDEFINED_EPOCH", "truncate_to_leader"]

# Kafka's answer when the leader knows no epoch at or below the one asked for.
UNDEFINED_EPOCH: Final = -1

AskLeader = Callable[[int], Awaitable[tuple[int, int]]]


def _latest_epoch(db: Database, shard: int, end: int) -> tuple[int, int]:
    """``(epoch, start)`` of the newest epoch that has a frame below ``end``."""
    # An empty cache means every frame is of epoch 0; an entry starting at the end (an epoch
    # begun without a frame yet) holds nothing to compare.
    entries = [e for e in db.leader_epochs(shard) if e[1] < end]
    return entries[-1] if entries else (0, db.start_offset(shard))


async def truncate_to_leader(db: Database, shard: int, ask_leader: AskLeader) -> int:
    """Cut ``shard`` of ``db`` where it diverges from the leader; its new end offset.

    Args:
        db: The follower's database.
        shard: The shard.
        ask_leader: ``epoch -> (largest epoch <= it the leader knows, where that ends)``,
            i.e. the leader's :meth:`Database.end_offset_for_epoch` over the network.
    """
    while True:
        end = db.end_offset(shard)
        if end <= db.start_offset(shard):
            return end
        latest, latest_start = _latest_epoch(db, shard, end)
        leader_epoch, leader_end = await ask_leader(latest)
        if leader_epoch == UNDEFINED_EPOCH:
            # The leader has no frame of our latest epoch: everything we wrote in it diverged.
            target = max(latest_start, db.start_offset(shard))
        elif leader_epoch == latest:
            target = min(leader_end, end)
        else:
            # The leader's history forks below our latest epoch: cut at the lower of the two
            # ends of the epoch both know.
            _, own_end = db.end_offset_for_epoch(shard, leader_epoch)
            target = min(leader_end, own_end if own_end >= 0 else db.start_offset(shard))
        if target >= end:
            return end
        await db.truncate_to(shard, target, force=True)
