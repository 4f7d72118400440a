"""seglog.cluster.etcd against a real etcd: keys, compare-and-swap, leases, watches, failover."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest

from seglog.cluster.etcd import EtcdClient, WatchEvent, WatchEventType, prefix_end
from seglog.errors import InvalidArgument, LeaseNotFound, MetadataError
from tests.etcd_fixtures import EtcdProcess, _free_port
from tests.helpers import FOREIGN_REPLIES, foreign_server

T = TypeVar("T")
Run = Callable[[Coroutine[Any, Any, T]], T]
WAIT_S = 20.0


def test_prefix_end() -> None:
    assert prefix_end(b"a/") == b"a0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff\xff") == b"\x00"


def test_keys_and_compare_and_swap(etcd: EtcdProcess, run: Run[None]) -> None:
    async def main() -> None:
        async with EtcdClient(etcd.url) as client:
            assert await client.get(b"/seglog/x") is None
            # Create-if-absent: mod_revision 0 means "no such key".
            assert await client.cas(b"/seglog/shard/0", 0, b"leader=1")
            assert not await client.cas(b"/seglog/shard/0", 0, b"leader=2")
            kv = await client.get(b"/seglog/shard/0")
            assert kv is not None and kv.value == b"leader=1" and kv.version == 1
            # A writer holding a stale revision loses; the current one wins.
            assert await client.cas(b"/seglog/shard/0", kv.mod_revision, b"leader=3")
            assert not await client.cas(b"/seglog/shard/0", kv.mod_revision, b"leader=stale")
            now = await client.get(b"/seglog/shard/0")
            assert now is not None and now.value == b"leader=3" and now.mod_revision > kv.mod_revision
            await client.put(b"/seglog/shard/1", b"\x00\xffbinary")
            await client.put(b"/seglog/shardz", b"outside")
            kvs, revision = await client.get_prefix(b"/seglog/shard/")
            assert [(k.key, k.value) for k in kvs] == [
                (b"/seglog/shard/0", b"leader=3"),
                (b"/seglog/shard/1", b"\x00\xffbinary"),
            ]
            assert revision >= now.mod_revision
            # CAS delete, then the key is absent.
            assert await client.cas(b"/seglog/shard/0", now.mod_revision, None)
            assert await client.get(b"/seglog/shard/0") is None
            assert not await client.delete(b"/seglog/shard/0")

    run(main())


def test_leases(etcd: EtcdProcess, run: Run[None]) -> None:
    async def main() -> None:
        async with EtcdClient(etcd.url) as client:
            lease = await client.lease_grant(30)
            await client.put(b"/nodes/1", b"http://a", lease=lease)
            kv = await client.get(b"/nodes/1")
            assert kv is not None and kv.lease == lease
            assert 0 < await client.lease_keepalive(lease) <= 30
            await client.lease_revoke(lease)
            assert await client.get(b"/nodes/1") is None  # the lease took its keys
            assert await client.lease_ttl(lease) == -1
            with pytest.raises(LeaseNotFound):
                await client.lease_keepalive(lease)
            with pytest.raises(InvalidArgument):
                await client.lease_grant(0)

    run(main())


def test_lease_expiry_is_seen_by_a_watch(etcd: EtcdProcess, run: Run[None]) -> None:
    """A node that stops keeping its lease alive disappears: watchers get the delete."""

    async def main() -> None:
        async with EtcdClient(etcd.url) as client:
            lease = await client.lease_grant(1)
            await client.put(b"/nodes/7", b"alive", lease=lease)
            _, revision = await client.get_prefix(b"/nodes/")
            seen: list[WatchEvent] = []

            async def watch() -> None:
                async for events in client.watch_prefix(b"/nodes/", start_revision=revision + 1):
                    seen.extend(events)
                    if any(e.type is WatchEventType.DELETE for e in events):
                        return

            await asyncio.wait_for(watch(), WAIT_S)
            assert [(e.type, e.kv.key) for e in seen] == [(WatchEventType.DELETE, b"/nodes/7")]
            assert await client.get(b"/nodes/7") is None

    run(main())


def test_watch_from_a_revision_misses_nothing(etcd: EtcdProcess, run: Run[None]) -> None:
    async def main() -> None:
        async with EtcdClient(etcd.url) as client:
            _, revision = await client.get_prefix(b"/meta/")
            # Written before the watch starts, after the read: still delivered.
            await client.put(b"/meta/a", b"1")
            await client.put(b"/other", b"x")
            got: list[tuple[WatchEventType, bytes, bytes]] = []

            async def watch() -> None:
                async for events in client.watch_prefix(b"/meta/", start_revision=revision + 1):
                    got.extend((e.type, e.kv.key, e.kv.value) for e in events)
                    if len(got) == 3:
                        return

            task = asyncio.create_task(asyncio.wait_for(watch(), WAIT_S))
            await client.put(b"/meta/b", b"2")
            await client.delete(b"/meta/a")
            await task
            assert got == [
                (WatchEventType.PUT, b"/meta/a", b"1"),
                (WatchEventType.PUT, b"/meta/b", b"2"),
                (WatchEventType.DELETE, b"/meta/a", b""),
            ]

    run(main())


def test_endpoints_fail_over_and_errors(etcd: EtcdProcess, run: Run[None]) -> None:
    dead = f"http://127.0.0.1:{_free_port()}"

    async def main() -> None:
        # A dead first endpoint is skipped.
        async with EtcdClient(f"{dead},{etcd.url}", request_timeout_s=2) as client:
            await client.put(b"k", b"v")
            kv = await client.get(b"k")
            assert kv is not None and kv.value == b"v"
        etcd.kill()
        async with EtcdClient(etcd.url, request_timeout_s=2) as client:
            with pytest.raises(MetadataError) as err:
                await client.get(b"k")
            assert err.value.__cause__ is not None

    run(main())
    with pytest.raises(InvalidArgument):
        EtcdClient("")
    with pytest.raises(InvalidArgument):
        EtcdClient("127.0.0.1:2379")
    for bad in ("http://127.0.0.1:notaport", "http://127.0.0.1:70000", "http://:2379"):
        with pytest.raises(InvalidArgument, match="etcd endpoint must be http"):
            EtcdClient(bad)


@pytest.mark.parametrize("kind", sorted(FOREIGN_REPLIES))
def test_an_endpoint_that_is_not_etcd_is_skipped(etcd: EtcdProcess, run: Run[None], kind: str) -> None:
    """A wrong URL in the endpoint list (a web page, another JSON API, a member without a
    leader) is passed over like a dead one; alone it is a MetadataError naming what answered."""

    async def main() -> None:
        async with foreign_server(kind) as bogus:
            async with EtcdClient(f"{bogus},{etcd.url}", request_timeout_s=2) as client:
                revision = await client.put(b"k", b"v")
                kv = await client.get(b"k")
                assert kv is not None and kv.value == b"v" and kv.mod_revision == revision
                kvs, _ = await client.get_prefix(b"k")
                assert [k.key for k in kvs] == [b"k"]
                assert await client.cas(b"k", revision, b"w")
                lease = await client.lease_grant(30)
                assert 0 < await client.lease_keepalive(lease) <= 30
                assert await client.lease_ttl(lease) > 0
                await client.lease_revoke(lease)
                assert await client.delete(b"k")
            async with EtcdClient(bogus, request_timeout_s=2) as alone:
                with pytest.raises(MetadataError, match="no endpoint") as err:
                    await alone.get(b"k")
                assert err.value.__cause__ is not None
                if kind != "unavailable":
                    assert "not etcd's" in str(err.value.__cause__)
                else:
                    assert "no leader" in str(err.value.__cause__)
                with pytest.raises(MetadataError):
                    await alone.lease_keepalive(1)

    run(main())


def test_a_watch_line_that_is_not_etcd_is_a_metadata_error() -> None:
    from seglog.cluster.etcd import _watch_line

    result, events = _watch_line(
        b'{"result": {"events": [{"type": "DELETE", "kv": {"key": "YQ==", "mod_revision": "7"}}]}}'
    )
    assert result["events"] and [(e.type, e.kv.key, e.kv.mod_revision) for e in events] == [
        (WatchEventType.DELETE, b"a", 7)
    ]
    for line in (b"<html>", b'{"result": {"events": [{"type": "RENAME", "kv": {}}]}}', b"[1, 2]"):
        with pytest.raises(MetadataError, match="not etcd's"):
            _watch_line(line)
