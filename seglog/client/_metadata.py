"""Cluster metadata for clients: which node leads each shard, learned from any node.

A client given ``bootstrap=[url, ...]`` asks any reachable node for ``GET /v1/cluster`` and
routes each shard's requests to its leader; a ``NotLeader`` or an unreachable node makes it
refresh (at most once per ``min_refresh_interval_s``, so a storm of errors is one request).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from seglog.client._http import NodeSession
from seglog.errors import DatabaseNotFound, InvalidArgument, NotLeader, ServerUnavailable

__all__ = ["ClusterView", "LeaderCache"]

DEFAULT_MIN_REFRESH_INTERVAL_S: Final = 0.1


@dataclass(frozen=True)
class ClusterView:
    """One snapshot of the cluster as a node saw it."""

    # Live node id -> URL.
    nodes: dict[int, str]
    # Database -> per shard (leader node id, leader epoch); leader -1: none right now.
    leaders: dict[str, list[tuple[int, int]]]

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> ClusterView:
        """Parse a ``GET /v1/cluster`` reply."""
        nodes = {int(n): str(u) for n, u in obj.get("nodes", {}).items()}
        leaders = {
            name: [(int(s["leader"]), int(s["leader_epoch"])) for s in db["state"]]
            for name, db in obj.get("dbs", {}).items()
        }
        return cls(nodes, leaders)


class LeaderCache:
    """Shard leaders of a cluster, refreshed on demand, with one session per node."""

    def __init__(
        self,
        bootstrap: Sequence[str],
        *,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        timeout_s: float = 30.0,
        min_refresh_interval_s: float = DEFAULT_MIN_REFRESH_INTERVAL_S,
    ) -> None:
        """A cache over ``bootstrap`` URLs (any live node will do)."""
        if isinstance(bootstrap, str) or not bootstrap:
            raise InvalidArgument("bootstrap must be a non-empty list of node URLs")
        self._bootstrap = [str(u).rstrip("/") for u in bootstrap]
        self._token = token
        self._ssl = ssl_context
        self._timeout_s = timeout_s
        self._min_refresh_s = min_refresh_interval_s
        self._sessions: dict[str, NodeSession] = {}
        self.view = ClusterView({}, {})
        self._refreshed_at = float("-inf")
        self._lock = asyncio.Lock()

    def session(self, url: str) -> NodeSession:
        """The (pooled) session to ``url``."""
        session = self._sessions.get(url)
        if session is None:
            session = self._sessions[url] = NodeSession(
                url, token=self._token, ssl_context=self._ssl, timeout_s=self._timeout_s
            )
        return session

    async def refresh(self, *, force: bool = False, want_db: str | None = None) -> ClusterView:
        """Ask a node for the current view (skipped if one was fetched very recently).

        ``want_db``: ask the other nodes too while the answers lack that database (a node
        whose metadata watch lags does not know a database created a moment ago); the last
        answer is kept when none has it.

        Raises:
            ServerUnavailable: No bootstrap or known node answered.
        """
        async with self._lock:
            loop = asyncio.get_running_loop()
            if not force and loop.time() - self._refreshed_at < self._min_refresh_s:
                return self.view
            candidates = list(dict.fromkeys([*self.view.nodes.values(), *self._bootstrap]))
            last: Exception | None = None
            answered = False
            for url in candidates:
                try:
                    reply = await self.session(url).request("GET", "/v1/cluster")
                except ServerUnavailable as exc:
                    last = exc
                    continue
                self.view = ClusterView.from_json(reply.json())
                self._refreshed_at = loop.time()
                answered = True
                if want_db is None or want_db in self.view.leaders:
                    return self.view
            if answered:
                return self.view
            raise ServerUnavailable(f"no node of {candidates} answered /v1/cluster") from last

    async def leader_url(self, db: str, shard: int) -> str:
        """The URL of ``db``/``shard``'s leader, refreshing once if it is not known.

        Raises:
            DatabaseNotFound: The cluster has no such database.
            NotLeader: The shard has no live leader right now (retriable).
        """
        for attempt in range(2):
            leaders = self.view.leaders.get(db)
            if leaders is not None and 0 <= shard < len(leaders):
                leader, epoch = leaders[shard]
                url = self.view.nodes.get(leader)
                if url is not None:
                    return url
            if attempt == 0:
                await self.refresh(force=db not in self.view.leaders, want_db=db)
        if db not in self.view.leaders:
            raise DatabaseNotFound(f"no node of the cluster knows a database {db!r}")
        leader, epoch = self.view.leaders[db][shard] if shard < len(self.view.leaders[db]) else (-1, -1)
        raise NotLeader(
            f"shard {shard} of {db!r} has no live leader", shard=shard, leader=leader, leader_epoch=epoch
        )

    async def close(self) -> None:
        """Close every session."""
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()
