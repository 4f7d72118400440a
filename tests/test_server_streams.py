"""MQTT stream reads over a node's HTTP API (``seglog.client.StreamReader``) against a real
``seglog serve`` process: wildcard reads equal a brute-force scan, iterators outlive a restart,
long polls are woken by appends, and bad input gets its error class."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import random
from collections.abc import Iterable
from typing import Any

import aiohttp
import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families

from seglog import Iterator, Stream
from seglog.client import Producer, StreamReader
from seglog.client._http import NodeSession
from seglog.cluster import protocol
from seglog.cluster.stream_wire import stream_json
from seglog.errors import (
    CurrentGeneration,
    DatabaseNotFound,
    ForeignIterator,
    GenerationDropped,
    InvalidArgument,
    InvalidIterator,
    InvalidTopicFilter,
    PermissionDenied,
    StreamFilterMismatch,
    UnknownGeneration,
    UnknownStream,
)
from seglog.record import records_from_table
from seglog.topics import topic_matches
from tests.server_fixtures import ServerFactory, ServerProcess

DB = "telemetry"
SHARDS = 3
TS0 = 1_700_000_000_000_000
WAIT_S = 60.0  # a bound on waits for events; never a measured duration
FILTERS = ["site3/#", "+/dev5/t", "site1/+/t", "#", "site2/dev7/t", "$SYS/#", "nosuch/#"]


def topics_for(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        if rng.random() < 0.05:
            out.append(f"$SYS/broker/{rng.randrange(3)}")
        else:
            out.append(f"site{rng.randrange(6)}/dev{rng.randrange(12)}/t")
    return out


async def create(url: str, name: str = DB, **settings: Any) -> None:
    body = {"name": name, "shards": SHARDS, "lts_thresholds": [100, 10], **settings}
    async with aiohttp.ClientSession() as s, s.post(f"{url}/v1/dbs", json=body) as r:
        assert r.status == 201, await r.text()


async def produce(url: str, topics: list[str], start: int) -> list[tuple[int, int, str, bytes]]:
    """Append one record per topic (keyed by device: spread over the shards); return
    ``(shard, offset, topic, value)`` of each."""
    values = [b"v%06d" % (start + i) for i in range(len(topics))]
    table = pa.table(
        {
            "topic": pa.array(topics, pa.string()),
            "key": pa.array([t.encode() for t in topics], pa.binary()),
            "value": pa.array(values, pa.binary()),
            "ts": pa.array([TS0 + start + i for i in range(len(topics))], pa.int64()),
        }
    )
    async with Producer(url, DB, acks="all") as p:
        meta = await (await p.send_arrow(table))
    shards, offsets = meta.column("shard").to_pylist(), meta.column("offset").to_pylist()
    return list(zip(shards, offsets, topics, values, strict=True))


async def read_filter(
    reader: StreamReader, topic_filter: str, n: int = 7
) -> list[tuple[int, int, str, bytes]]:
    out = []
    for stream in await reader.get_streams(topic_filter):
        it = await reader.make_iterator(stream, topic_filter)
        while True:
            it, records = await reader.next(it, n)
            if not records:
                break
            out.extend((r.shard, r.offset, r.topic, r.value) for r in records)
    return out


def matching(
    written: Iterable[tuple[int, int, str, bytes]], topic_filter: str
) -> list[tuple[int, int, str, bytes]]:
    return sorted(w for w in written if topic_matches(topic_filter, w[2]))


def test_wildcard_reads_over_http_equal_a_brute_force_scan(server: ServerProcess) -> None:
    async def main() -> None:
        await create(server.url)
        written = await produce(server.url, topics_for(600, 1), 0)
        async with StreamReader(server.url, DB) as reader:
            for f in FILTERS:
                assert sorted(await read_filter(reader, f)) == matching(written, f), f
            streams = await reader.get_streams("site3/#")
            assert streams and all(isinstance(s, Stream) and s.pattern.startswith("site3") for s in streams)
            assert {s.shard for s in await reader.get_streams("#")} == set(range(SHARDS))

    asyncio.run(main())


def test_the_single_iterator_forms_for_curl_users(server: ServerProcess) -> None:
    """``{"stream"}`` -> ``{"iterator"}`` and ``{"iterator"}`` -> an Arrow body with the moved
    iterator in ``Seglog-Iterator``: what ``StreamReader``'s many-iterator requests read."""

    async def main() -> None:
        await create(server.url)
        written = await produce(server.url, topics_for(200, 6), 0)
        async with StreamReader(server.url, DB) as reader:
            streams = await reader.get_streams("site2/#")
        async with aiohttp.ClientSession() as s:
            got = []
            for stream in streams:
                body = {"stream": stream_json(stream), "filter": "site2/#"}
                async with s.post(f"{server.url}/v1/dbs/{DB}/iterators", json=body) as r:
                    assert r.status == 200
                    text = (await r.json())["iterator"]
                while True:
                    async with s.post(
                        f"{server.url}/v1/dbs/{DB}/next", json={"iterator": text, "max_records": 5}
                    ) as r:
                        assert r.status == 200 and r.content_type == protocol.ARROW_STREAM
                        table = pa.ipc.open_stream(await r.read()).read_all()
                        text = r.headers[protocol.HEADER_ITERATOR]
                        assert r.headers[protocol.HEADER_END_OF_STREAM] == "0"
                    if not table.num_rows:
                        break
                    got += [
                        (stream.shard, o, t)
                        for o, t in zip(
                            table.column("offset").to_pylist(), table.column("topic").to_pylist(), strict=True
                        )
                    ]
        assert sorted(got) == [(sh, o, t) for sh, o, t, _ in matching(written, "site2/#")]

    asyncio.run(main())


def test_an_iterator_goes_on_after_a_restart_and_sees_new_records(server: ServerProcess) -> None:
    """An iterator saved as bytes mid-stream reads the rest after a restart, then what was
    appended since: exactly what a fresh iterator of the stream reads, nothing twice."""

    async def read_all(reader: StreamReader, it: Iterator) -> list[tuple[int, int, str, bytes]]:
        out = []
        while True:
            it, records = await reader.next(it, 50)
            if not records:
                return out
            out.extend((r.shard, r.offset, r.topic, r.value) for r in records)

    async def main() -> tuple[Stream, bytes, list[tuple[int, int, str, bytes]]]:
        await create(server.url)
        await produce(server.url, topics_for(300, 2), 0)
        async with StreamReader(server.url, DB) as reader:
            streams = await reader.get_streams("site1/#")
            stream = max(streams, key=lambda s: s.structure.count("+"))  # the busiest one
            it = await reader.make_iterator(stream, "site1/#")
            it, first = await reader.next(it, 3)
            assert len(first) == 3
            return stream, it.to_bytes(), [(r.shard, r.offset, r.topic, r.value) for r in first]

    stream, saved, first = asyncio.run(main())
    server.stop()
    server.restart()

    async def after() -> None:
        await produce(server.url, topics_for(300, 3), 1000)
        async with StreamReader(server.url, DB) as reader:
            rest = await read_all(reader, Iterator.from_bytes(saved))
            fresh = await read_all(reader, await reader.make_iterator(stream, "site1/#"))
        assert first + rest == fresh
        assert any(value >= b"v001000" for *_, value in rest)  # appended after the restart

    asyncio.run(after())


def test_a_long_poll_is_woken_by_a_matching_append(server: ServerProcess) -> None:
    async def main() -> None:
        await create(server.url)
        await produce(server.url, ["site1/dev1/t"], 0)
        async with StreamReader(server.url, DB) as reader:
            (stream,) = await reader.get_streams("site1/dev1/t")
            it = await reader.make_iterator(stream, "site1/dev1/t")
            it, records = await reader.next(it, 10)
            assert [r.topic for r in records] == ["site1/dev1/t"]
            it, none = await reader.next(it, 10)  # at the end, no wait: empty at once
            assert none == []
            # Waits up to 10 minutes unless the append wakes it; the bound below fails the
            # test long before that.
            poll = asyncio.ensure_future(reader.next(it, 10, wait_ms=600_000))
            await produce(server.url, ["site1/dev1/t"], 1)
            it, woken = await asyncio.wait_for(poll, WAIT_S)
            assert [r.value for r in woken] == [b"v000001"]
            assert not it.end_of_stream

    asyncio.run(main())


def test_a_long_poll_skips_appends_its_filter_does_not_take(server: ServerProcess) -> None:
    """Appends to the iterator's stream that its filter does not take wake the poll, move the
    iterator past them and the poll waits on; the matching append is what it answers."""

    async def main() -> None:
        await create(server.url, shards=1, lts_thresholds=[100, 0])  # site1/<anything>: one stream
        await produce(server.url, ["site1/a"], 0)
        async with StreamReader(server.url, DB) as reader:
            (stream,) = await reader.get_streams("site1/a")
            assert stream.pattern == "site1/+"
            it, first = await reader.next(await reader.make_iterator(stream, "site1/a"), 10)
            assert [r.topic for r in first] == ["site1/a"]
            poll = asyncio.ensure_future(reader.next(it, 10, wait_ms=600_000))
            await produce(server.url, ["site1/b", "site1/c"], 1)
            await produce(server.url, ["site1/b", "site1/a"], 3)
            it, woken = await asyncio.wait_for(poll, WAIT_S)
            assert [(r.topic, r.value) for r in woken] == [("site1/a", b"v000004")]
            assert it.position == 5

    asyncio.run(main())


def test_readers_at_one_position_share_one_read(server: ServerProcess) -> None:
    """Many network readers tailing one stream, woken by one append, read it once for all
    (the node's single flight: ``seglog_stream_reads{kind="joined"}``), and every one gets
    the records."""
    readers_n = 30

    async def main() -> None:
        await create(server.url, shards=1)
        await produce(server.url, ["site1/dev1/t"], 0)
        async with contextlib.AsyncExitStack() as stack:
            readers = [
                await stack.enter_async_context(StreamReader(server.url, DB)) for _ in range(readers_n)
            ]
            (stream,) = await readers[0].get_streams("site1/dev1/t")
            it, first = await readers[0].next(await readers[0].make_iterator(stream, "site1/dev1/t"), 10)
            assert len(first) == 1
            polls = [asyncio.ensure_future(r.next(it, 10, wait_ms=600_000)) for r in readers]
            session = await stack.enter_async_context(aiohttp.ClientSession())

            async def metric(name: str, **labels: str) -> float:
                async with session.get(f"{server.url}/metrics") as r:
                    text = await r.text()
                for family in text_string_to_metric_families(text):
                    for sample in family.samples:
                        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                            return float(sample.value)
                return 0.0

            async with asyncio.timeout(WAIT_S):
                while await metric("seglog_stream_waiting") < readers_n:  # every reader parked
                    await asyncio.sleep(0.01)
            own = await metric("seglog_stream_reads_total", db=DB, kind="own")
            joined = await metric("seglog_stream_reads_total", db=DB, kind="joined")
            await produce(server.url, ["site1/dev1/t", "site2/dev1/t"], 1)
            results = await asyncio.wait_for(asyncio.gather(*polls), WAIT_S)
            for moved, records in results:
                assert [(r.topic, r.value) for r in records] == [("site1/dev1/t", b"v000001")]
                assert moved.position == 3
            # One read answered the wave (a second at most, for a reader that lagged a step).
            assert await metric("seglog_stream_reads_total", db=DB, kind="own") - own <= 2
            assert await metric("seglog_stream_reads_total", db=DB, kind="joined") - joined >= readers_n - 2

    asyncio.run(main())


def test_many_iterators_in_one_request(server: ServerProcess) -> None:
    """``next_many`` reads every stream of a filter a budget at a time (rotated), equal to a
    brute-force scan; one long poll over all of them answers with the stream an append woke."""

    async def main() -> None:
        await create(server.url)
        written = await produce(server.url, topics_for(500, 5), 0)
        async with StreamReader(server.url, DB) as reader:
            streams = await reader.get_streams("#")
            iterators = await reader.make_iterators(streams, "#")  # one request for all of them
            assert iterators == [await reader.make_iterator(s, "#") for s in streams]
            assert len(iterators) > 10
            assert await reader.make_iterators([], "#") == []
            got: list[tuple[int, int, str, bytes]] = []
            rounds = 0
            while True:
                results = await reader.next_many(iterators, 37)
                rows = [r for it, t in results for r in records_from_table(t, it.shard)]
                assert len(rows) <= 37  # the budget of the request, over all iterators
                got.extend((r.shard, r.offset, r.topic, r.value) for r in rows)
                iterators = [it for it, _ in results]
                iterators = iterators[1:] + iterators[:1]
                rounds += 1
                if not rows:
                    break
            assert rounds > 10
            assert sorted(got) == matching(written, "#")
            # One poll over all of them: an append to one stream answers it.
            poll = asyncio.ensure_future(reader.next_many(iterators, 100, wait_ms=600_000))
            ((shard, offset, topic, _),) = await produce(server.url, ["site4/dev2/t"], 9000)
            results = await asyncio.wait_for(poll, WAIT_S)
            answered = [
                (it.shard, r.offset, r.topic) for it, t in results for r in records_from_table(t, it.shard)
            ]
            assert answered == [(shard, offset, topic)]
            with pytest.raises(InvalidArgument):
                await reader.next_many([])
            with pytest.raises(InvalidArgument):
                await reader.next_many(iterators, 0)
            async with StreamReader(server.url, "other") as other:
                with pytest.raises(ForeignIterator):
                    await other.next_many(iterators)
                with pytest.raises(ForeignIterator):
                    await other.make_iterators(streams, "#")
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{server.url}/v1/dbs/{DB}/next", json={"iterators": []}) as r:
                assert r.status == 400
            async with s.post(f"{server.url}/v1/dbs/{DB}/next", json={"iterators": ["bad!"]}) as r:
                assert r.status == 400 and "iterator 0" in (await r.json())["message"]

    asyncio.run(main())


def test_bad_requests_get_their_error_class(server: ServerProcess) -> None:
    async def main() -> None:
        await create(server.url)
        await create(server.url, "other")
        await create(server.url, "plain", lts_thresholds=None)
        await produce(server.url, topics_for(50, 4), 0)
        async with StreamReader(server.url, DB) as reader, StreamReader(server.url, "other") as other:
            with pytest.raises(InvalidTopicFilter):
                await reader.get_streams("a/#/b")
            (stream, *_) = await reader.get_streams("site1/#")
            with pytest.raises(StreamFilterMismatch):
                await reader.make_iterator(stream, "elsewhere/x")
            with pytest.raises(ForeignIterator):
                await other.make_iterator(stream, "site1/#")  # a stream of another database
            it = await reader.make_iterator(stream, "site1/#")
            with pytest.raises(ForeignIterator):
                await other.next(it)
            with pytest.raises(UnknownStream):
                await reader.make_iterator(Stream(0, 999, ("x",), False, stream.db_id), "#")
            with pytest.raises(InvalidArgument):
                await reader.next(it, 0)
            async with StreamReader(server.url, "plain") as plain:
                with pytest.raises(InvalidArgument, match="no streams"):
                    await plain.get_streams("#")
            async with StreamReader(server.url, "missing") as missing:
                with pytest.raises(DatabaseNotFound):
                    await missing.get_streams("#")
        async with aiohttp.ClientSession() as s:
            for body in ({"iterator": "not base64!"}, {"iterator": base64.b64encode(b"x" * 60).decode()}):
                async with s.post(f"{server.url}/v1/dbs/{DB}/next", json=body) as r:
                    assert r.status == 400
                    assert (await r.json())["error"] == InvalidIterator.__name__
            async with s.get(f"{server.url}/v1/dbs/{DB}/streams") as r:
                assert r.status == 400  # no filter
            good = {"iterator": base64.b64encode(it.to_bytes()).decode()}
            for bad in ({"max_records": 0}, {"max_records": "9"}, {"wait_ms": -1}):
                async with s.post(f"{server.url}/v1/dbs/{DB}/next", json={**good, **bad}) as r:
                    assert r.status == 400, bad

    asyncio.run(main())


def test_stream_routes_need_read_on_the_database(server_factory: ServerFactory, tmp_path: Any) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(
        "admin-token-0123456789 ops admin\n"
        "read-token-0123456789 app other:read\n"
        f"reader-token-0123456789 app {DB}:read\n"
    )
    server = server_factory("--tokens", str(tokens))

    async def main() -> None:
        admin = aiohttp.ClientSession(headers={"Authorization": "Bearer admin-token-0123456789"})
        body = {"name": DB, "shards": 1, "lts_thresholds": [100, 10]}
        async with admin as s, s.post(f"{server.url}/v1/dbs", json=body) as r:
            assert r.status == 201
        async with StreamReader(server.url, DB, token="read-token-0123456789") as reader:
            with pytest.raises(PermissionDenied):
                await reader.get_streams("#")
        async with StreamReader(server.url, DB, token="admin-token-0123456789") as reader:
            assert await reader.get_streams("#") == []
        reader_session = NodeSession(server.url, token="reader-token-0123456789")
        try:  # read on the database: streams and the list of generations, not changing them
            assert (
                await reader_session.request("GET", f"/v1/dbs/{DB}/streams", params={"filter": "#"})
            ).json() == {"streams": []}
            assert (
                len((await reader_session.request("GET", f"/v1/dbs/{DB}/generations")).json()["generations"])
                == 1
            )
            with pytest.raises(PermissionDenied):
                await reader_session.request("POST", f"/v1/dbs/{DB}/generations")
            with pytest.raises(PermissionDenied):
                await reader_session.request("DELETE", f"/v1/dbs/{DB}/generations/1")
        finally:
            await reader_session.close()
        async with aiohttp.ClientSession() as s, s.get(f"{server.url}/v1/dbs/{DB}/streams?filter=%23") as r:
            assert r.status == 401
            assert r.headers[protocol.HEADER_NODE]

    asyncio.run(main())


def test_generations_over_http_end_old_iterators_and_drop(server: ServerProcess) -> None:
    """An added generation closes the old one: its iterators read to ``end_of_stream`` over the
    network; dropping it makes them ``GenerationDropped``; the current one cannot be dropped."""

    async def main() -> None:
        await create(server.url)
        await produce(server.url, ["site1/dev1/t"] * 5, 0)
        session = NodeSession(server.url)
        path = f"/v1/dbs/{DB}/generations"
        try:
            async with StreamReader(server.url, DB) as reader:
                (old,) = await reader.get_streams("site1/dev1/t")
                it = await reader.make_iterator(old, "site1/dev1/t")
                it, first = await reader.next(it, 2)
                added = (await session.request("POST", path)).json()
                assert added["generation"] == 2 and added["current"] and added["until"] is None
                await produce(server.url, ["site1/dev1/t"] * 3, 100)
                it, rest = await reader.next(it, 100)
                assert [r.value for r in first + rest] == [b"v%06d" % i for i in range(5)]
                it, none = await reader.next(it, 100, wait_ms=60_000)  # closed: no wait
                assert none == [] and it.end_of_stream
                new = [s for s in await reader.get_streams("site1/dev1/t") if s.generation == 2]
                _, fresh = await reader.next(await reader.make_iterator(new[0], "site1/dev1/t"), 100)
                assert [r.value for r in fresh] == [b"v%06d" % i for i in range(100, 103)]
                gens = (await session.request("GET", path)).json()["generations"]
                assert [(g["generation"], g["current"], g["dropped"]) for g in gens] == [
                    (1, False, False),
                    (2, True, False),
                ]
                with pytest.raises(CurrentGeneration):
                    await session.request("DELETE", path + "/2")
                with pytest.raises(UnknownGeneration):
                    await session.request("DELETE", path + "/7")
                dropped = (await session.request("DELETE", path + "/1")).json()
                assert dropped["generation"] == 1 and dropped["freed_bytes"] >= 0
                with pytest.raises(GenerationDropped):
                    await reader.next(await reader.make_iterator(old, "site1/dev1/t"), 10)
        finally:
            await session.close()

    asyncio.run(main())
