"""Child process: open a store and its ``crash`` database (journal replay), then close it."""

from __future__ import annotations

import asyncio
import sys

import seglog


async def main(data: str) -> None:
    async with seglog.open(data) as store:
        await store.open_db("crash")
    print("opened", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
