"""Wildcard reads over the network (a node in this process): python examples/network_streams.py [DATA_DIR]."""

import asyncio
import sys

import aiohttp

import seglog
from seglog.client import Producer, StreamReader
from seglog.cluster.server import serve


async def main(path: str) -> None:
    async with serve(path, port=0) as node:  # what `seglog serve DATA` runs, on a free port
        async with aiohttp.ClientSession() as http:  # or: seglog admin --url URL create plant ...
            body = {"name": "plant", "shards": 2, "lts_thresholds": [100, 0, 100], "exist_ok": True}
            async with http.post(f"{node.url}/v1/dbs", json=body) as reply:
                reply.raise_for_status()
        async with Producer(node.url, "plant") as producer:
            for site in ("north", "south"):
                for d in range(50):
                    await producer.send(f"{site}/dev{d}/temp", b"%d" % d, key=b"dev%d" % d)
            await producer.flush()
        async with StreamReader(node.url, "plant") as reader:
            streams = await reader.get_streams("north/+/temp")
            iterators = await reader.make_iterators(streams, "north/+/temp")  # one request
            results = await reader.next_many(iterators, 1000)  # every stream in one request
            topics = {topic for _, table in results for topic in table.column("topic").to_pylist()}
            print(
                len(streams),
                "streams,",
                sum(t.num_rows for _, t in results),
                "records,",
                len(topics),
                "topics",
            )
            saved = [it.to_bytes() for it, _ in results]  # go on later, from any node
            restored = [seglog.Iterator.from_bytes(b) for b in saved]
            poll = asyncio.ensure_future(reader.next_many(restored, 100, wait_ms=10_000))  # a long poll
            async with Producer(node.url, "plant") as producer:
                await producer.send_and_wait("south/dev7/temp", b"19.0", key=b"dev7")  # not matching
                await producer.send_and_wait("north/dev7/temp", b"21.5", key=b"dev7")
            woken = [v for _, table in await poll for v in table.column("value").to_pylist()]
            print("the long poll woke with:", woken)


asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "data"))
