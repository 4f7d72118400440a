"""Consumer groups over HTTP: join, heartbeat, leave, commit (generation-fenced), committed.

Membership is :class:`~seglog.cluster.coordinator.GroupCoordinator` (in memory: a restart
empties every group and members rejoin on ``UnknownMember``); offsets go to the database's
durable group store (``Database.commit``). Every request of one group runs under that
group's lock, so a membership change cannot slip between a commit's fence check and its
write (a zombie's commit never lands after its shards changed hands).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any, Final

from aiohttp import web

from seglog.cluster.context import NODE
from seglog.cluster.coordinator import GroupCoordinator, GroupKey, Membership
from seglog.cluster.params import json_body
from seglog.db import Database
from seglog.errors import InvalidArgument, InvalidRequest
from seglog.groups import validate_group_name

__all__ = ["GROUPS", "GroupService", "add_routes"]

log = logging.getLogger("seglog.server")

_MAX_OFFSET: Final = 2**63 - 1
# After a failed expiry pass, the next one runs this much later (logged each time).
_EXPIRY_RETRY_S: Final = 0.5


class GroupService:
    """The node's coordinator, its per-group locks and the timer that expires sessions."""

    def __init__(self, coordinator: GroupCoordinator | None = None) -> None:
        self.coordinator = coordinator or GroupCoordinator()
        self._locks: dict[GroupKey, asyncio.Lock] = {}
        self._wake = asyncio.Event()
        # Set once the timer (not a request) expired a session: what tests of the timer wait on.
        self.timer_expired = asyncio.Event()

    def lock(self, key: GroupKey) -> asyncio.Lock:
        """The lock every request of group ``key`` holds."""
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    def deadlines_changed(self) -> None:
        """A new session may end before the timer's current wake-up: recompute it."""
        self._wake.set()

    async def expire_forever(self) -> None:
        """Expire sessions as their deadlines pass, so shards move without any request."""
        coordinator = self.coordinator
        loop = asyncio.get_running_loop()
        while True:
            self._wake.clear()
            try:
                for key in coordinator.due():
                    async with self.lock(key):
                        gone = coordinator.expire(key)
                    if gone:
                        self.timer_expired.set()
                        log.info("group %s/%s: sessions expired: %s", key[0], key[1], ", ".join(gone))
                deadline = coordinator.next_deadline()
            except Exception:
                # This timer alone expires silent members (their shards move on): it must not
                # end with one failure, or no group on this node would rebalance again.
                log.exception("expiring group sessions failed; retrying in %g s", _EXPIRY_RETRY_S)
                deadline = loop.time() + _EXPIRY_RETRY_S
            # The coordinator's clock is loop.time()'s (both monotonic seconds) when served.
            timeout = None if deadline is None else max(0.0, deadline - loop.time()) + 0.001
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)


GROUPS: Final = web.AppKey("seglog_groups", GroupService)


def add_routes(app: web.Application, db_path: str) -> None:
    """Serve the group endpoints under ``db_path`` (``/v1/dbs/{db}``) and run the expiry timer."""
    group = db_path + "/groups/{group}"
    app.router.add_post(group + "/join", join)
    app.router.add_post(group + "/heartbeat", heartbeat)
    app.router.add_post(group + "/leave", leave)
    app.router.add_post(group + "/commit", commit)
    app.router.add_get(group + "/committed", committed)
    app.cleanup_ctx.append(_expiry_task)


async def _expiry_task(app: web.Application) -> AsyncIterator[None]:
    loop = asyncio.get_running_loop()
    service = GroupService(GroupCoordinator(clock=loop.time))
    app[GROUPS] = service
    task = asyncio.create_task(service.expire_forever(), name="seglog-group-expiry")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _target(request: web.Request) -> tuple[GroupService, Database, GroupKey]:
    db = await request.app[NODE].database(request.match_info["db"])
    group = validate_group_name(request.match_info["group"])
    return request.app[GROUPS], db, (db.name, group)


def _membership_json(m: Membership) -> dict[str, Any]:
    return {
        "member_id": m.member_id,
        "generation": m.generation,
        "assignment": m.assignment,
        "session_timeout_ms": m.session_timeout_ms,
    }


def _int_field(body: dict[str, Any], name: str, *, required: bool = True) -> int | None:
    value = body.get(name)
    if value is None and not required:
        return None
    if type(value) is not int or value < 0:
        raise InvalidRequest(f'"{name}" must be an int >= 0, not {value!r}')
    return value


def _member_id(body: dict[str, Any], *, required: bool = True) -> str | None:
    value = body.get("member_id")
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise InvalidRequest(f'"member_id" must be a string, not {value!r}')
    return value


async def join(request: web.Request) -> web.Response:
    """``POST .../join`` ``{"session_timeout_ms", "member_id"?}`` -> ``{member_id, generation, assignment}``."""
    service, db, key = await _target(request)
    body = await json_body(request)
    timeout_ms = _int_field(body, "session_timeout_ms")
    assert timeout_ms is not None
    member_id = _member_id(body, required=False)
    async with service.lock(key):
        m = service.coordinator.join(key, db.shards, session_timeout_ms=timeout_ms, member_id=member_id)
    service.deadlines_changed()
    return web.json_response(_membership_json(m))


async def heartbeat(request: web.Request) -> web.Response:
    """``POST .../heartbeat`` ``{"member_id", "generation"}`` -> the current generation and assignment."""
    service, _, key = await _target(request)
    body = await json_body(request)
    member_id = _member_id(body)
    generation = _int_field(body, "generation")
    assert member_id is not None and generation is not None
    async with service.lock(key):
        m = service.coordinator.heartbeat(key, member_id, generation)
    return web.json_response(_membership_json(m))


async def leave(request: web.Request) -> web.Response:
    """``POST .../leave`` ``{"member_id"}`` -> ``{"left": bool}`` (not a member: false)."""
    service, _, key = await _target(request)
    member_id = _member_id(await json_body(request))
    assert member_id is not None
    async with service.lock(key):
        left = service.coordinator.leave(key, member_id)
    return web.json_response({"left": left})


async def commit(request: web.Request) -> web.Response:
    """``POST .../commit`` ``{"offsets": {shard: offset}, "member_id"?, "generation"?}``.

    Durable when answered. A member commits under its current generation for shards it
    owns; without ``member_id`` only while the group has no members.
    """
    service, db, key = await _target(request)
    body = await json_body(request)
    member_id = _member_id(body, required=False)
    generation = _int_field(body, "generation", required=member_id is not None)
    offsets = _offsets(body.get("offsets"), db.shards)
    async with service.lock(key):
        service.coordinator.check_commit(key, member_id, generation, sorted(offsets))
        for shard, offset in sorted(offsets.items()):
            await db.commit(key[1], shard, offset)
    return web.json_response({"committed": {str(s): o for s, o in sorted(offsets.items())}})


async def committed(request: web.Request) -> web.Response:
    """``GET .../committed?shards=0,1`` (default all) -> ``{"offsets": {shard: offset}}`` (committed ones)."""
    _, db, key = await _target(request)
    raw = request.query.get("shards")
    if raw is None:
        shards = list(range(db.shards))
    else:
        try:
            shards = sorted({int(s, 10) for s in raw.split(",") if s})
        except ValueError:
            raise InvalidRequest(f"shards must be comma-separated shard numbers, not {raw[:40]!r}") from None
        bad = [s for s in shards if not 0 <= s < db.shards]
        if bad:
            raise InvalidArgument(f"shard must be an int in 0..{db.shards - 1}, not {bad[0]}")
    out: dict[str, int] = {}
    for shard in shards:
        offset = await db.committed(key[1], shard)
        if offset is not None:
            out[str(shard)] = offset
    return web.json_response({"offsets": out})


def _offsets(raw: object, shards: int) -> dict[int, int]:
    if not isinstance(raw, dict) or not raw:
        raise InvalidRequest('commit needs "offsets": {shard: offset, ...} (non-empty)')
    out: dict[int, int] = {}
    for k, v in raw.items():
        if not (isinstance(k, str) and k.isdigit() and len(k) <= 12):
            raise InvalidRequest(f"offsets keys must be shard numbers, not {str(k)[:40]!r}")
        shard = int(k)
        if shard >= shards:
            raise InvalidArgument(f"shard must be an int in 0..{shards - 1}, not {shard}")
        if type(v) is not int or not 0 <= v <= _MAX_OFFSET:
            raise InvalidRequest(f"offset of shard {shard} must be an int >= 0, not {v!r}")
        out[shard] = v
    return out
