"""``GET /metrics``: a node's Prometheus metrics, in a registry of its own.

A registry per server (not ``prometheus_client``'s global one) so two nodes embedded in one
process, or a test's successive servers, never mix their counts.
"""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from seglog import _fs

__all__ = ["CONTENT_TYPE", "NodeMetrics"]

CONTENT_TYPE: Final = CONTENT_TYPE_LATEST

_LATENCY_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
_LAG_BUCKETS: Final = (0, 1, 10, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000)


class NodeMetrics:
    """The metrics one node exports; handlers call the ``*_done`` methods, never the registry."""

    def __init__(self) -> None:
        """Fresh metrics in a fresh registry."""
        self.registry = CollectorRegistry()
        r = self.registry
        self.append_requests = Counter(
            "seglog_append_requests", "Produce requests that wrote their records", ["db"], registry=r
        )
        self.append_records = Counter("seglog_append_records", "Records appended", ["db"], registry=r)
        self.append_bytes = Counter(
            "seglog_append_bytes", "Bytes of produce request bodies appended", ["db"], registry=r
        )
        self.append_latency = Histogram(
            "seglog_append_latency_seconds",
            "Produce request time from its body read to the acknowledgement",
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.fsync_latency = Histogram(
            "seglog_fsync_latency_seconds",
            "fdatasync calls of the write path (journal and segments)",
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.fetch_requests = Counter("seglog_fetch_requests", "Fetch requests answered", ["db"], registry=r)
        self.fetch_bytes = Counter("seglog_fetch_bytes", "Bytes of fetch replies", ["db"], registry=r)
        self.fetch_lag = Histogram(
            "seglog_fetch_lag_records",
            "Log end minus the offset a fetch asked for, when it arrived",
            registry=r,
            buckets=_LAG_BUCKETS,
        )
        self.stream_requests = Counter(
            "seglog_stream_read_requests",
            "Stream reads answered (next, one or many iterators)",
            ["db"],
            registry=r,
        )
        self.stream_records = Counter(
            "seglog_stream_read_records", "Records stream reads answered", ["db"], registry=r
        )
        self.stream_reads = Counter(
            "seglog_stream_reads",
            "Reads of streams for POST .../next: done for the request ('own') or shared with a "
            "request at the same position already reading ('joined')",
            ["db", "kind"],
            registry=r,
        )
        self.stream_waiting = Gauge(
            "seglog_stream_waiting", "Stream long polls waiting for an append now", registry=r
        )
        self.open_connections = Gauge("seglog_open_connections", "Open client connections", registry=r)
        self.inflight_appends = Gauge(
            "seglog_inflight_appends", "Produce requests being written now", registry=r
        )
        self.errors = Counter("seglog_errors", "Error replies by error class", ["error"], registry=r)
        self._observing = False

    def start(self) -> None:
        """Observe the process's fdatasync calls (the hook in :mod:`seglog._fs`)."""
        if not self._observing:
            _fs.add_fsync_observer(self.fsync_latency.observe)
            self._observing = True

    def stop(self) -> None:
        """Stop observing fdatasync calls."""
        if self._observing:
            _fs.remove_fsync_observer(self.fsync_latency.observe)
            self._observing = False

    def append_done(self, db: str, records: int, nbytes: int, seconds: float) -> None:
        """One produce request wrote ``records`` records from a body of ``nbytes``."""
        self.append_requests.labels(db).inc()
        self.append_records.labels(db).inc(records)
        self.append_bytes.labels(db).inc(nbytes)
        self.append_latency.observe(seconds)

    def stream_read_done(self, db: str, records: int) -> None:
        """One stream read (``POST .../next``) answered ``records``."""
        self.stream_requests.labels(db).inc()
        self.stream_records.labels(db).inc(records)

    def stream_read_started(self, db: str, joined: bool) -> None:
        """One read of a stream iterator, shared (``joined``) or not."""
        self.stream_reads.labels(db, "joined" if joined else "own").inc()

    def fetch_done(self, db: str, nbytes: int, lag: int) -> None:
        """One fetch answered ``nbytes``, asked ``lag`` records behind the log end."""
        self.fetch_requests.labels(db).inc()
        self.fetch_bytes.labels(db).inc(nbytes)
        self.fetch_lag.observe(lag)

    def error(self, name: str) -> None:
        """One error reply of class ``name``."""
        self.errors.labels(name).inc()

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
