"""A group member in its own process (tests SIGKILL it): ``python -m tests.group_child URL DB GROUP SESSION_MS``.

Prints one JSON line per adopted assignment: ``{"member_id", "generation", "assignment"}``.
"""

from __future__ import annotations

import asyncio
import json
import sys

from seglog.client import Consumer


async def main(url: str, db: str, group: str, session_ms: int) -> None:
    async with Consumer(
        url, db, group=group, session_timeout_ms=session_ms, heartbeat_interval_ms=max(1, session_ms // 5)
    ) as consumer:
        while True:
            report = {
                "member_id": consumer.member_id,
                "generation": consumer.generation,
                "assignment": consumer.assignment(),
            }
            print(json.dumps(report), flush=True)
            await consumer.wait_for_assignment(consumer.generation)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
