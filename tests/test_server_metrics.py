"""``GET /metrics`` of a real ``seglog serve``: the counts follow what clients did."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from seglog.cluster import protocol
from tests.server_fixtures import ServerProcess

DB = "m"


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_metrics_count_appends_fetches_fsyncs_connections_and_errors(server: ServerProcess) -> None:
    async def main() -> None:
        async with aiohttp.ClientSession() as s:

            async def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
                async with s.get(f"{server.url}/metrics") as r:
                    assert r.status == 200 and r.content_type == "text/plain"
                    return _samples(await r.text())

            before = await scrape()
            assert before[("seglog_open_connections", ())] >= 1  # this scrape's own connection
            async with s.post(f"{server.url}/v1/dbs", json={"name": DB, "shards": 1}) as r:
                assert r.status == 201
            body = b"\n".join(json.dumps({"topic": "a", "value": "x" * 10}).encode() for _ in range(7))
            for _ in range(2):
                async with s.post(
                    f"{server.url}/v1/dbs/{DB}/records", data=body, headers={"Content-Type": protocol.NDJSON}
                ) as r:
                    assert r.status == 200
            async with s.get(f"{server.url}/v1/dbs/{DB}/shards/0/frames?offset=3") as r:
                assert r.status == 200
                fetched = len(await r.read())
            async with s.get(f"{server.url}/v1/dbs/nope") as r:
                assert r.status == 404
            async with s.get(f"{server.url}/v1/dbs/{DB}/shards/0/frames?offset=99") as r:
                assert r.status == 416
            got = await scrape()

        db = (("db", DB),)
        assert got[("seglog_append_requests_total", db)] == 2
        assert got[("seglog_append_records_total", db)] == 14
        assert got[("seglog_append_bytes_total", db)] == 2 * len(body)
        assert got[("seglog_append_latency_seconds_count", ())] == 2
        # fsync="always": every acknowledged append was fdatasynced at least once.
        assert got[("seglog_fsync_latency_seconds_count", ())] >= 2
        assert got[("seglog_fetch_requests_total", db)] == 1
        assert got[("seglog_fetch_bytes_total", db)] == fetched > 0
        assert got[("seglog_fetch_lag_records_count", ())] == 1
        assert got[("seglog_fetch_lag_records_sum", ())] == 14 - 3
        assert got[("seglog_errors_total", (("error", "DatabaseNotFound"),))] == 1
        assert got[("seglog_errors_total", (("error", "OffsetOutOfRange"),))] == 1
        assert got[("seglog_inflight_appends", ())] == 0

    asyncio.run(main())


def test_metrics_count_stream_reads(server: ServerProcess) -> None:
    from seglog.client import StreamReader

    async def main() -> None:
        async with aiohttp.ClientSession() as s:
            body = {"name": DB, "shards": 1, "lts_thresholds": [100]}
            async with s.post(f"{server.url}/v1/dbs", json=body) as r:
                assert r.status == 201
            lines = b"\n".join(json.dumps({"topic": f"t/{i % 2}", "value": "x"}).encode() for i in range(9))
            headers = {"Content-Type": protocol.NDJSON}
            async with s.post(f"{server.url}/v1/dbs/{DB}/records", data=lines, headers=headers) as r:
                assert r.status == 200
            async with StreamReader(server.url, DB) as reader:
                streams = await reader.get_streams("t/1")
                its = await reader.make_iterators(streams, "t/1")
                _, table = await reader.next_arrow(its[0], 100)
                assert table.num_rows == 4
                results = await reader.next_many(its, 100)  # the same records again: one more read
                assert sum(t.num_rows for _, t in results) == 4
            async with s.get(f"{server.url}/metrics") as r:
                got = _samples(await r.text())
        db = (("db", DB),)
        assert got[("seglog_stream_read_requests_total", db)] == 2
        assert got[("seglog_stream_read_records_total", db)] == 8

    asyncio.run(main())
