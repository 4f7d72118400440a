"""Child for the producer-restart test: send N records into a disk buffer, say so, wait to be killed.

``python -m tests.producer_child URL DB BUFFER_DIR N [one-by-one]``: starts a Producer on
BUFFER_DIR (buffer_fsync="always", so a returned send() is on disk), sends values ``b"r<i>"``
for i in ``range(N)`` concurrently (or, with ``one-by-one``, each after the previous one
returned: every record then is its own buffered item), prints ``SENT N`` once every send()
has returned, then sleeps until the parent SIGKILLs it. The node is down meanwhile: nothing
is acknowledged.
"""

from __future__ import annotations

import asyncio
import sys

from seglog.client import Producer
from seglog.record import RecordMeta


async def main(url: str, db: str, buffer_dir: str, n: int, one_by_one: bool) -> None:
    producer = Producer(url, db, buffer_dir=buffer_dir, retries=None, retry_backoff_max_ms=200)
    await producer.start()

    async def send(i: int) -> asyncio.Future[RecordMeta]:
        return await producer.send(f"child/{i % 5}", b"r%d" % i, key=None if i % 2 else b"k%d" % i)

    if one_by_one:
        futures = [await send(i) for i in range(n)]
    else:
        futures = await asyncio.gather(*(send(i) for i in range(n)))
    assert len(futures) == n
    print(f"SENT {n}", flush=True)
    await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:] == ["one-by-one"]))
