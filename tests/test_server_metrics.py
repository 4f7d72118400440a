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
