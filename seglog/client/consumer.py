"""The network consumer: read shards of a database on a seglog node, alone or in a group.

``async with Consumer(url, db, group="g") as c: async for rec in c: ...``. Names follow
aiokafka's ``AIOKafkaConsumer`` with shards for partitions.

How it reads: ``max_concurrent_fetches`` fetch loops (default one) each long-poll the node
for their share of the owned shards in one request (``POST .../fetch``, ``wait_ms``), so a
record appended after the consumer caught up arrives as soon as the node publishes it,
without a sleep loop, and one append that reaches every shard wakes one poll, not one per
shard. Each shard keeps at most two fetched replies buffered; a shard with a full buffer is
left out of the next poll. Replies are the stored frames: they are checked (CRC) and decoded
zero-copy into Arrow by :func:`seglog.record.decode_frames`.

Groups: the consumer joins at start, heartbeats from a task, and adopts a new assignment
when a heartbeat reports a new generation (buffered records of lost shards are dropped,
gained shards start at the group's commits). There is no barrier between the member losing
a shard and the one gaining it: for up to a heartbeat interval both may read it, and
delivery is at least once. Group membership lives in the node's memory: after a node
restart the next heartbeat gets ``UnknownMember`` and the consumer rejoins by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from ssl import SSLContext
from types import TracebackType
from typing import Any, Final, Literal

import pyarrow as pa
import pyarrow.compute as pc

from seglog.client._http import DEFAULT_REQUEST_TIMEOUT_S, NodeSession
from seglog.client._metadata import LeaderCache
from seglog.cluster import fetch_wire, protocol
from seglog.cluster.fetch_wire import FetchPart
from seglog.errors import (
    ClosedResourceError,
    DatabaseNotFound,
    InvalidArgument,
    NotLeader,
    OffsetOutOfRange,
    RemoteError,
    SeglogError,
    ServerUnavailable,
    StaleGeneration,
)
from seglog.groups import validate_group_name
from seglog.record import Record, decode_frames, records_from_table

__all__ = ["Consumer"]

log = logging.getLogger("seglog.client")

# Fetched replies buffered per shard before its loop stops fetching (backpressure).
_PREFETCH_REPLIES: Final = 2
# Records converted at a time for ``async for``.
_ITER_BATCH: Final = 512
_RETRY_MIN_S: Final = 0.05
_RETRY_MAX_S: Final = 5.0
# Connections beyond the fetch polls: heartbeats and commits must never wait behind polls.
_SPARE_CONNECTIONS: Final = 4

OffsetReset = Literal["earliest", "latest"]


class Consumer:
    """Records of a database on a node: every shard, the given ``shards``, or a group's share.

    Args:
        url: The node, ``http[s]://host:port``.
        db: The database.
        group: Consumer group: join it (shards split among members, commits fenced by
            generation). With ``shards`` too, no membership: the group only stores commits,
            accepted while it has no members.
        shards: Read these shards (default: all, or the group's assignment).
        bootstrap: More nodes of a cluster: fetch every shard from its leader, found from any
            of ``url`` and these, and found again after ``NotLeader`` or a node that stopped
            answering. (Without it every shard is read from ``url``'s copy, below that node's
            high watermark.)
        token: Bearer token.
        ssl: TLS context for ``https`` (e.g. trusting a private CA).
        auto_offset_reset: Where a shard without a commit (and without ``from_time_us``)
            starts, and where a position retention removed moves: ``"earliest"`` or ``"latest"``.
        from_time_us: Start shards without a commit at the first record at or after this time.
        session_timeout_ms: Group session: the node reassigns this member's shards when it
            has not heard a heartbeat for this long.
        heartbeat_interval_ms: Time between heartbeats (below ``session_timeout_ms``).
        max_wait_ms: Longest long poll of one fetch.
        fetch_max_bytes: Most bytes of frames one fetch asks for.
        max_concurrent_fetches: Fetch loops, each polling its share of the shards in one
            request (more overlaps decoding with fetching when draining a backlog).
        request_timeout_s: Timeout of a request beyond its long poll.
    """

    def __init__(
        self,
        url: str,
        db: str,
        *,
        group: str | None = None,
        shards: Iterable[int] | None = None,
        bootstrap: Sequence[str] | None = None,
        token: str | None = None,
        ssl: SSLContext | None = None,
        auto_offset_reset: OffsetReset = "earliest",
        from_time_us: int | None = None,
        session_timeout_ms: int = 10_000,
        heartbeat_interval_ms: int = 3_000,
        max_wait_ms: int = 500,
        fetch_max_bytes: int = 1 << 20,
        max_concurrent_fetches: int = 1,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    ) -> None:
        if not isinstance(db, str):
            raise InvalidArgument(f"db must be a database name, not {db!r}")
        if group is not None:
            validate_group_name(group)
        if auto_offset_reset not in ("earliest", "latest"):
            raise InvalidArgument(
                f"auto_offset_reset must be 'earliest' or 'latest', not {auto_offset_reset!r}"
            )
        if from_time_us is not None and type(from_time_us) is not int:
            raise InvalidArgument(f"from_time_us must be an int (µs since 1970), not {from_time_us!r}")
        for name, value in (
            ("session_timeout_ms", session_timeout_ms),
            ("heartbeat_interval_ms", heartbeat_interval_ms),
            ("max_wait_ms", max_wait_ms),
            ("fetch_max_bytes", fetch_max_bytes),
            ("max_concurrent_fetches", max_concurrent_fetches),
        ):
            if type(value) is not int or value < 1:
                raise InvalidArgument(f"{name} must be an int >= 1, not {value!r}")
        if heartbeat_interval_ms >= session_timeout_ms:
            raise InvalidArgument("heartbeat_interval_ms must be below session_timeout_ms")
        self.url = url
        self.db = db
        self.group = group
        self._manual = None if shards is None else sorted(set(shards))
        self._reset_to: OffsetReset = auto_offset_reset
        self._from_time_us = from_time_us
        self._session_timeout_ms = session_timeout_ms
        self._heartbeat_s = heartbeat_interval_ms / 1000
        self._max_wait_ms = max_wait_ms
        self._fetch_max_bytes = fetch_max_bytes
        self._poll_timeout_s = max_wait_ms / 1000 + request_timeout_s
        self._session = NodeSession(
            url,
            token=token,
            ssl_context=ssl,
            timeout_s=request_timeout_s,
            pool_connections=max_concurrent_fetches + _SPARE_CONNECTIONS,
        )
        self._fetch_loops = max_concurrent_fetches
        self._base = f"{protocol.API_PREFIX}/dbs/{db}"
        self._shard_count = 0
        self._assignment: list[int] = []
        self._positions: dict[int, int] = {}
        self._fetch_at: dict[int, int] = {}
        self._chunks: dict[int, deque[pa.Table]] = {}
        # Set (and replaced) whenever a reader takes buffered rows: full shards have room again.
        self._room = asyncio.Event()
        self._fetchers: list[asyncio.Task[None]] = []
        # A cluster: the shards' leaders, and how many reroutes in a row found no records.
        self._leaders = (
            None
            if bootstrap is None
            else LeaderCache([url, *bootstrap], token=token, ssl_context=ssl, timeout_s=request_timeout_s)
        )
        self._reroutes = 0
        # ``async for``: records taken from the chunks but not yet yielded (positions move per yield).
        self._iter: deque[tuple[int, pa.Table, list[Record], int]] = deque()
        self._next_shard = 0
        self._data = asyncio.Event()
        self._failure: SeglogError | None = None
        self._member_id: str | None = None
        self._generation = 0
        self._changed = asyncio.Event()
        self._adopt_lock = asyncio.Lock()
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._heartbeat_now = asyncio.Event()
        self._stopping = asyncio.Event()
        self._started = False

    # --- lifecycle ---------------------------------------------------------------------

    async def __aenter__(self) -> Consumer:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        """Connect: learn the shard count, join the group if any, resolve start positions."""
        if self._started:
            return
        self._check_open()
        self._started = True
        try:
            self._shard_count = int((await self._describe())["shards"])
            if self._manual is not None:
                bad = [s for s in self._manual if not 0 <= s < self._shard_count]
                if bad:
                    raise InvalidArgument(f"shard must be an int in 0..{self._shard_count - 1}, not {bad[0]}")
                await self._adopt(0, self._manual)
            elif self.group is None:
                await self._adopt(0, list(range(self._shard_count)))
            else:
                membership = await self._join()
                await self._adopt(membership["generation"], membership["assignment"])
                self._heartbeat_task = asyncio.create_task(self._heartbeat_loop(), name="seglog-heartbeat")
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop fetching, leave the group, close the connections; idempotent."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._data.set()  # wake readers: they end
        self._changed.set()  # and wait_for_assignment: it raises ClosedResourceError
        tasks = list(self._fetchers)
        if self._heartbeat_task is not None:
            tasks.append(self._heartbeat_task)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._fetchers.clear()
        if self._member_id is not None:
            try:
                await self._post("leave", {"member_id": self._member_id})
            except SeglogError as exc:
                # The session runs out on the node anyway; leaving only makes it quicker.
                log.info("leaving group %s failed: %s", self.group, exc)
        await self._session.close()
        if self._leaders is not None:
            await self._leaders.close()

    def _check_open(self) -> None:
        if self._stopping.is_set():
            raise ClosedResourceError("the consumer was stopped")

    def _check_started(self) -> None:
        self._check_open()
        if not self._started:
            raise InvalidArgument("start the consumer first (await consumer.start() or async with)")

    # --- assignment ----------------------------------------------------------------------

    def assignment(self) -> list[int]:
        """The shards this consumer reads now, sorted."""
        return list(self._assignment)

    @property
    def generation(self) -> int:
        """The group generation of the current assignment (0 without a group)."""
        return self._generation

    @property
    def member_id(self) -> str | None:
        """This consumer's id in its group (None without membership)."""
        return self._member_id

    async def wait_for_assignment(self, after_generation: int) -> list[int]:
        """Wait until the consumer adopted an assignment of a generation other than ``after_generation``."""
        while self._generation == after_generation:
            self._check_open()
            event = self._changed
            await event.wait()
        return self.assignment()

    async def _adopt(self, generation: int, assignment: Iterable[int]) -> None:
        async with self._adopt_lock:
            new = sorted(set(assignment))
            lost = set(self._assignment) - set(new)
            for shard in lost:
                self._drop_shard(shard)
            self._assignment = [s for s in self._assignment if s not in lost]
            gained = sorted(set(new) - set(self._assignment))
            if lost or gained:
                log.info(
                    "group %s generation %d: lost %s, gained %s", self.group, generation, sorted(lost), gained
                )
            starts = await self._start_positions(gained)
            for shard in gained:
                self._positions[shard] = self._fetch_at[shard] = starts[shard]
                self._chunks[shard] = deque()
            self._assignment = new
            if lost or gained:
                self._restart_fetchers()
            self._generation = generation
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()

    def _drop_shard(self, shard: int) -> None:
        self._chunks.pop(shard, None)
        self._positions.pop(shard, None)
        self._fetch_at.pop(shard, None)
        self._iter = deque(p for p in self._iter if p[0] != shard)

    async def _start_positions(self, shards: list[int]) -> dict[int, int]:
        """Committed offset, else the offset of ``from_time_us``, else ``auto_offset_reset``."""
        out: dict[int, int] = {}
        if not shards:
            return out
        if self.group is not None:
            out.update(await self._committed(shards))
        rest = [s for s in shards if s not in out]
        if rest and self._from_time_us is not None:
            out.update(await self.offsets_for_times(dict.fromkeys(rest, self._from_time_us)))
            rest = []
        if rest:
            marks = await self._marks()
            key = "start" if self._reset_to == "earliest" else "high_watermark"
            out.update({s: marks[s][key] for s in rest})
        return out

    # --- group protocol ------------------------------------------------------------------

    async def _post(self, action: str, body: dict[str, Any]) -> Any:
        assert self.group is not None
        reply = await self._session.request(
            "POST", f"{self._base}/groups/{self.group}/{action}", json_body=body
        )
        return reply.json()

    async def _join(self) -> dict[str, Any]:
        body: dict[str, Any] = {"session_timeout_ms": self._session_timeout_ms}
        if self._member_id is not None:
            body["member_id"] = self._member_id
        membership: dict[str, Any] = await self._post("join", body)
        self._member_id = str(membership["member_id"])
        return membership

    async def _heartbeat_loop(self) -> None:
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._heartbeat_now.wait(), self._heartbeat_s)
            self._heartbeat_now.clear()
            try:
                try:
                    membership = await self._post(
                        "heartbeat", {"member_id": self._member_id, "generation": self._generation}
                    )
                except StaleGeneration as exc:  # UnknownMember included: expired, or the node restarted
                    log.warning("group %s: %s; rejoining", self.group, exc)
                    membership = await self._join()
                # After a node restart a rejoin may hand out the same generation number again:
                # compare the assignment too.
                if (
                    membership["generation"] != self._generation
                    or membership["assignment"] != self._assignment
                ):
                    await self._adopt(membership["generation"], membership["assignment"])
            except SeglogError as exc:
                # The next beat retries; the session outlives a few missed ones.
                log.warning("group %s: heartbeat failed: %s", self.group, exc)
            except Exception:
                # Not ours to end: without heartbeats the session expires and the group gives
                # this consumer's shards to others while it goes on reading them.
                log.exception("group %s: heartbeat failed", self.group)

    # --- positions ---------------------------------------------------------------------

    def _owned(self, shard: int) -> int:
        if shard not in self._positions:
            raise InvalidArgument(
                f"shard {shard!r} is not assigned to this consumer (assignment {self._assignment})"
            )
        return shard

    def position(self, shard: int) -> int:
        """The next offset the consumer delivers from ``shard``."""
        self._check_started()
        return self._positions[self._owned(shard)]

    def seek(self, shard: int, offset: int) -> None:
        """Deliver ``shard`` from ``offset`` next; what was fetched of it is dropped."""
        self._check_started()
        self._owned(shard)
        if type(offset) is not int or offset < 0:
            raise InvalidArgument(f"offset must be an int >= 0, not {offset!r}")
        self._move(shard, offset)

    def _move(self, shard: int, offset: int) -> None:
        self._reset(shard, offset)
        # A poll parked at the old position would hold the new one back up to max_wait_ms.
        self._restart_fetchers()

    def _reset(self, shard: int, offset: int) -> None:
        self._positions[shard] = self._fetch_at[shard] = offset
        self._chunks[shard].clear()
        self._iter = deque(p for p in self._iter if p[0] != shard)

    async def seek_to_beginning(self, *shards: int) -> None:
        """Move ``shards`` (default: all assigned) to their first readable offset."""
        await self._seek_to("start", shards)

    async def seek_to_end(self, *shards: int) -> None:
        """Move ``shards`` (default: all assigned) past their last committed-by-the-log record."""
        await self._seek_to("high_watermark", shards)

    async def _seek_to(self, key: str, shards: tuple[int, ...]) -> None:
        self._check_started()
        todo = [self._owned(s) for s in shards] if shards else list(self._assignment)
        marks = await self._marks()
        for shard in todo:
            if shard in self._positions:  # still assigned after the await
                self._move(shard, marks[shard][key])

    async def end_offsets(self, shards: Iterable[int]) -> dict[int, int]:
        """The high watermark of each shard: the offset after the last record consumers may read."""
        marks = await self._marks()
        return {s: marks[self._valid_shard(s)]["high_watermark"] for s in shards}

    async def beginning_offsets(self, shards: Iterable[int]) -> dict[int, int]:
        """The first readable offset of each shard."""
        marks = await self._marks()
        return {s: marks[self._valid_shard(s)]["start"] for s in shards}

    async def offsets_for_times(self, times: Mapping[int, int]) -> dict[int, int]:
        """Per shard, the first offset whose record has ``ts >=`` the time (µs); the end if none."""
        for shard, ts in times.items():
            self._valid_shard(shard)
            if type(ts) is not int:
                raise InvalidArgument(f"times[{shard}] must be an int (µs since 1970), not {ts!r}")

        async def one(shard: int, ts: int) -> tuple[int, int]:
            reply = await self._session.request(
                "GET", f"{self._base}/shards/{shard}/offset", params={"ts": ts}
            )
            return shard, int(reply.json()["offset"])

        return dict(await asyncio.gather(*(one(s, t) for s, t in times.items())))

    def _valid_shard(self, shard: int) -> int:
        if type(shard) is not int or not 0 <= shard < self._shard_count:
            raise InvalidArgument(f"shard must be an int in 0..{self._shard_count - 1}, not {shard!r}")
        return shard

    async def _describe(self) -> dict[str, Any]:
        """``GET /v1/dbs/{db}`` from ``url``, or (``bootstrap``) from any live node holding it."""
        try:
            described: dict[str, Any] = (await self._session.request("GET", self._base)).json()
            return described
        except ServerUnavailable:
            if self._leaders is None:
                raise
        view = await self._leaders.refresh(force=True)
        last: SeglogError | None = None
        for url in view.nodes.values():
            try:
                described = (await self._leaders.session(url).request("GET", self._base)).json()
                return described
            except (ServerUnavailable, DatabaseNotFound) as exc:
                last = exc
        raise ServerUnavailable(f"no node of the cluster answered for database {self.db!r}") from last

    async def _marks(self) -> dict[int, dict[str, int]]:
        return {int(o["shard"]): o for o in (await self._describe())["offsets"]}

    # --- commits -------------------------------------------------------------------------

    def _group_name(self) -> str:
        if self.group is None:
            raise InvalidArgument("this consumer has no group: commits need Consumer(..., group=...)")
        return self.group

    async def commit(self, offsets: Mapping[int, int] | None = None) -> None:
        """Store ``offsets`` (``{shard: next offset}``; default: every position) for the group, durably.

        Raises:
            InvalidArgument: No group, or a shard this member does not own.
            StaleGeneration: The group moved to a newer generation than this consumer knows
                (the commit is refused; the consumer catches up at its next heartbeat).
            UnknownMember: This member's session expired (it rejoins at its next heartbeat).
        """
        self._group_name()
        self._check_started()
        todo = dict(self._positions) if offsets is None else dict(offsets)
        if not todo:
            return
        for shard, offset in todo.items():
            self._valid_shard(shard)
            if type(offset) is not int or offset < 0:
                raise InvalidArgument(f"offsets[{shard}] must be an int >= 0, not {offset!r}")
        body: dict[str, Any] = {"offsets": {str(s): o for s, o in todo.items()}}
        if self._member_id is not None:
            body["member_id"] = self._member_id
            body["generation"] = self._generation
        try:
            await self._post("commit", body)
        except StaleGeneration:
            self._heartbeat_now.set()  # learn the new generation now, not at the next beat
            raise

    async def committed(self, shard: int) -> int | None:
        """The group's committed offset of ``shard`` (None: never committed)."""
        self._group_name()
        self._check_started()
        return (await self._committed([self._valid_shard(shard)])).get(shard)

    async def _committed(self, shards: list[int]) -> dict[int, int]:
        reply = await self._session.request(
            "GET",
            f"{self._base}/groups/{self._group_name()}/committed",
            params={"shards": ",".join(map(str, shards))},
        )
        return {int(s): int(o) for s, o in reply.json()["offsets"].items()}

    # --- fetching ------------------------------------------------------------------------

    def _restart_fetchers(self) -> None:
        """Cancel the fetch loops (their parked polls) and start them over the assignment now."""
        for task in self._fetchers:
            task.cancel()
        self._fetchers = []
        if self._stopping.is_set() or not self._assignment:
            return
        if self._leaders is not None:
            self._spawn(self._route_fetchers(), "seglog-fetch-route")
            return
        loops = min(self._fetch_loops, len(self._assignment))
        for k in range(loops):
            self._spawn(self._fetch_loop(self._assignment[k::loops], self._session), f"seglog-fetch-{k}")

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        self._fetchers.append(asyncio.create_task(coro, name=name))

    async def _route_fetchers(self) -> None:
        """(``bootstrap``) One fetch loop per node over the shards it leads; shards without a
        live leader are routed again after a backoff."""
        assert self._leaders is not None
        by_url: dict[str, list[int]] = {}
        unled: list[int] = []
        for shard in self._assignment:
            try:
                url = await self._leaders.leader_url(self.db, shard)
            except (NotLeader, ServerUnavailable):
                unled.append(shard)
                continue
            except SeglogError as exc:
                # DatabaseNotFound (dropped while the consumer was re-routing), a refused token:
                # getmany raises it (this task ending in silence left the consumer waiting).
                self._fail(exc)
                return
            by_url.setdefault(url, []).append(shard)
        for url, shards in by_url.items():
            self._spawn(self._fetch_loop(shards, self._leaders.session(url)), f"seglog-fetch-{url}")
        if unled:
            log.info("shards %s have no live leader yet; routing them again", unled)
            await self._reroute()

    async def _reroute(self) -> None:
        """(``bootstrap``) Learn the leaders again, after a growing pause, and restart the loops."""
        assert self._leaders is not None
        self._reroutes += 1
        pause = min(_RETRY_MIN_S * 2 ** (self._reroutes - 1), _RETRY_MAX_S)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), pause)
        try:
            await self._leaders.refresh(force=True)
        except ServerUnavailable:
            pass  # no node answered: the loops find out again, after a longer pause
        except SeglogError as exc:
            self._fail(exc)
            return
        self._restart_fetchers()

    async def _fetch_loop(self, shards: list[int], session: NodeSession) -> None:
        """Poll ``shards`` on ``session``'s node in one request per round, until cancelled."""
        path = f"{self._base}/fetch"
        backoff = _RETRY_MIN_S
        turn = 0
        routed = self._leaders is not None
        while not self._stopping.is_set():
            mine = [s for s in shards if len(self._chunks[s]) < _PREFETCH_REPLIES]
            if not mine:
                await self._room.wait()
                continue
            # Rotate which shard comes first: the node spends max_bytes in request order.
            turn = (turn + 1) % len(mine)
            sent = {s: self._fetch_at[s] for s in mine[turn:] + mine[:turn]}
            asked = fetch_wire.ShardsRequest(
                sent, self._max_wait_ms, self._fetch_max_bytes, leader_only=routed
            )
            try:
                reply = await session.request(
                    "POST",
                    path,
                    data=fetch_wire.encode_shards_request(asked),
                    content_type=protocol.JSON,
                    timeout_s=self._poll_timeout_s,
                )
                parts = fetch_wire.decode_reply(reply.body)
            except SeglogError as exc:
                if routed and isinstance(exc, ServerUnavailable):
                    log.warning("fetch from %s failed (%s); finding the leaders again", session.url, exc)
                    await self._reroute()
                    return
                if not protocol.is_retriable(exc):
                    self._fail(exc)
                    return
                log.warning("fetch of shards %s failed (%s); retrying in %.2f s", list(sent), exc, backoff)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), backoff)
                backoff = min(backoff * 2, _RETRY_MAX_S)
                continue
            backoff = _RETRY_MIN_S
            got = moved = False
            for part in parts:
                shard, offset = part.shard, sent.get(part.shard)
                if offset is None or self._fetch_at.get(shard) != offset:
                    continue  # not asked, or moved while the poll was out
                if isinstance(part.error, OffsetOutOfRange):
                    gone = part.error
                    target = gone.start if self._reset_to == "earliest" else gone.end
                    log.warning(
                        "shard %d: offset %d is outside [%d, %d] (retention?); resetting to %s offset %d",
                        shard, offset, gone.start, gone.end, self._reset_to, target,
                    )  # fmt: skip
                    self._reset(shard, target)
                    continue
                if routed and isinstance(part.error, NotLeader):
                    moved = True  # read what the others sent, then route again
                    continue
                if part.error is not None:
                    self._fail(part.error)
                    return
                try:
                    table = _decode(part, offset)
                except SeglogError as exc:  # CorruptFrame: the bytes changed after the node checked them
                    self._fail(exc)
                    return
                except Exception as exc:  # an Arrow body that does not decode
                    failure = RemoteError(f"shard {shard}: fetched records that do not decode: {exc}")
                    failure.__cause__ = exc
                    self._fail(failure)
                    return
                if table.num_rows:
                    self._chunks[shard].append(table)
                    self._fetch_at[shard] = int(table.column("offset")[-1].as_py()) + 1
                    got = True
            if got:
                self._reroutes = 0
                self._data.set()
            if moved:
                log.info("a shard's leader moved away from %s; finding the leaders again", session.url)
                await self._reroute()
                return

    def _fail(self, exc: SeglogError) -> None:
        self._failure = exc
        self._data.set()

    # --- reading -------------------------------------------------------------------------

    def _buffered(self) -> bool:
        return bool(self._iter) or any(self._chunks.values())

    async def _wait(self, timeout_ms: int | None) -> None:
        """Wait until something is buffered, the consumer stops, or ``timeout_ms`` passed."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_ms is None else loop.time() + timeout_ms / 1000
        while not self._buffered():
            if self._failure is not None:
                raise self._failure
            if self._stopping.is_set():
                return
            self._data.clear()
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return
            try:
                await asyncio.wait_for(self._data.wait(), remaining)
            except TimeoutError:
                return

    def _untake_iter(self) -> None:
        # Records taken for ``async for`` but not yielded go back in front of their shard.
        while self._iter:
            shard, table, _, index = self._iter.pop()
            if index < table.num_rows:
                self._chunks[shard].appendleft(table.slice(index))

    def _take(self, max_records: int | None) -> dict[int, list[pa.Table]]:
        """Up to ``max_records`` buffered rows, shards round-robin; positions move past them."""
        self._untake_iter()
        out: dict[int, list[pa.Table]] = {}
        shards = self._assignment
        if not shards:
            return out
        n = 0
        first = self._next_shard % len(shards)
        for i in range(len(shards)):
            if max_records is not None and n >= max_records:
                break
            shard = shards[(first + i) % len(shards)]
            queue = self._chunks.get(shard)
            if not queue:
                continue
            while queue and (max_records is None or n < max_records):
                table = queue[0]
                take = table.num_rows if max_records is None else min(table.num_rows, max_records - n)
                if take == table.num_rows:
                    queue.popleft()
                else:
                    queue[0] = table.slice(take)
                    table = table.slice(0, take)
                out.setdefault(shard, []).append(table)
                n += take
            self._positions[shard] = int(out[shard][-1].column("offset")[-1].as_py()) + 1
            self._next_shard = (first + i + 1) % len(shards)
        if out:
            room, self._room = self._room, asyncio.Event()
            room.set()
        return out

    def _check_limits(self, timeout_ms: int | None, max_records: int | None) -> None:
        self._check_started()
        if timeout_ms is not None and (type(timeout_ms) is not int or timeout_ms < 0):
            raise InvalidArgument(f"timeout_ms must be None or an int >= 0, not {timeout_ms!r}")
        if max_records is not None and (type(max_records) is not int or max_records < 1):
            raise InvalidArgument(f"max_records must be None or an int >= 1, not {max_records!r}")

    async def getmany(
        self, *, timeout_ms: int | None = 0, max_records: int | None = None
    ) -> dict[int, list[Record]]:
        """Buffered records by shard (waiting up to ``timeout_ms`` for some; None: until any).

        Returns:
            ``{shard: [records in offset order]}``; empty on timeout or once stopped.
        """
        self._check_limits(timeout_ms, max_records)
        await self._wait(timeout_ms)
        return {
            shard: [r for t in tables for r in records_from_table(t, shard)]
            for shard, tables in self._take(max_records).items()
        }

    async def getmany_arrow(
        self, *, timeout_ms: int | None = 0, max_records: int | None = None
    ) -> dict[int, pa.Table]:
        """As :meth:`getmany`, as one Arrow table per shard (``offset`` column first; zero-copy)."""
        self._check_limits(timeout_ms, max_records)
        await self._wait(timeout_ms)
        return {shard: pa.concat_tables(tables) for shard, tables in self._take(max_records).items()}

    async def getone(self) -> Record:
        """The next record, waiting for one.

        Raises:
            ClosedResourceError: The consumer stopped.
        """
        self._check_started()
        while not self._iter:
            await self._wait(None)
            self._check_open()
            for shard, tables in self._take(_ITER_BATCH).items():
                # Positions move per yielded record (below), not per batch taken.
                self._positions[shard] = int(tables[0].column("offset")[0].as_py())
                for table in tables:
                    self._iter.append((shard, table, records_from_table(table, shard), 0))
        shard, table, records, index = self._iter[0]
        record = records[index]
        if index + 1 == len(records):
            self._iter.popleft()
        else:
            self._iter[0] = (shard, table, records, index + 1)
        assert record.offset is not None
        self._positions[shard] = record.offset + 1
        return record

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> Record:
        try:
            return await self.getone()
        except ClosedResourceError:
            raise StopAsyncIteration from None

    def __repr__(self) -> str:
        return f"<Consumer {self.url} db={self.db!r} group={self.group!r} assignment={self._assignment}>"


def _decode(part: FetchPart, offset: int) -> pa.Table:
    """A fetched part as rows ``[offset, high watermark)`` (frames CRC-checked, zero-copy)."""
    if part.arrow:
        # Tiered data below the node's local log: the rows themselves, already bounded.
        table = pa.ipc.open_stream(part.frames).read_all()
        return table.filter(pc.greater_equal(table.column("offset"), offset))
    return decode_frames(part.frames, offset, part.high_watermark)
