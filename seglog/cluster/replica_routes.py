"""Routes a cluster node adds: replica fetch, OffsetsForLeaderEpoch, and the cluster view."""

from __future__ import annotations

from aiohttp import web

from seglog.cluster import fetch_wire, replica_wire
from seglog.cluster.context import NODE
from seglog.cluster.node import ClusterNode
from seglog.cluster.params import query_int, shard_param
from seglog.cluster.protocol import API_PREFIX
from seglog.errors import InvalidRequest, UnsupportedContentType

__all__ = ["add_routes", "cluster_of"]


def cluster_of(request: web.Request) -> ClusterNode:
    """The node's cluster membership.

    Raises:
        InvalidRequest: The node was started without ``--etcd`` (not in a cluster).
    """
    cluster = request.app[NODE].cluster
    if cluster is None:
        raise InvalidRequest("this node is not part of a cluster (started without --etcd)")
    return cluster


async def replica_fetch(request: web.Request) -> web.Response:
    """``POST /v1/replica/fetch``: many shards' frames for a follower (see :mod:`replica_wire`)."""
    cluster = cluster_of(request)
    if request.content_type != "application/json":
        raise UnsupportedContentType("replica fetch takes application/json")
    follower, parts, wait_ms, max_bytes = replica_wire.decode_request(await request.read())
    node = request.app[NODE]
    wait_ms = min(wait_ms, node.limits.max_wait_ms)
    max_bytes = min(max_bytes, node.limits.max_fetch_bytes)
    body = await cluster.serve_fetch(follower, parts, wait_ms, max_bytes)
    return web.Response(body=body, content_type=fetch_wire.FETCH_REPLY)


async def epoch_end(request: web.Request) -> web.Response:
    """``GET /v1/dbs/{db}/shards/{shard}/epoch-end?epoch=E&leader_epoch=L``: Kafka's OffsetsForLeaderEpoch."""
    cluster = cluster_of(request)
    db = await request.app[NODE].database(request.match_info["db"])
    shard = shard_param(request, db.shards)
    epoch = query_int(request, "epoch", None)
    leader_epoch = query_int(request, "leader_epoch", None)
    if epoch is None or leader_epoch is None:
        raise InvalidRequest("epoch-end needs ?epoch= and ?leader_epoch=")
    found, end = cluster.epoch_end(db, shard, epoch, leader_epoch)
    return web.json_response({"epoch": found, "end_offset": end})


async def describe_cluster(request: web.Request) -> web.Response:
    """``GET /v1/cluster``: live nodes, databases with every shard's leader, epoch and ISR."""
    return web.json_response(cluster_of(request).describe())


def add_routes(app: web.Application, db_path: str) -> None:
    """Register the cluster routes (they answer 400 on a node outside a cluster)."""
    app.router.add_post(API_PREFIX + "/replica/fetch", replica_fetch)
    app.router.add_get(db_path + "/shards/{shard}/epoch-end", epoch_end)
    app.router.add_get(API_PREFIX + "/cluster", describe_cluster)
