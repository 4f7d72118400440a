"""The seglog exception tree.

Every failure seglog raises on purpose is a :class:`SeglogError`. The tree is split the way
trio splits its errors, so callers can catch by *kind of problem*:

* :class:`UsageError` -- the caller asked for something invalid (bad record, bad name,
  conflicting config, closed or busy resource). Retrying the same call will fail again.
* :class:`StorageError` -- the disk or a remote store failed. The original exception is
  chained as ``__cause__``. Data acknowledged before the failure is safe.
* :class:`OffsetOutOfRange` -- a position outside what the log currently holds.
"""

from __future__ import annotations

__all__ = [
    "AppendFailed",
    "AuthenticationFailed",
    "BufferFull",
    "BusyResourceError",
    "ClosedResourceError",
    "ConfigMismatch",
    "CorruptBuffer",
    "CorruptCheckpoint",
    "CorruptFrame",
    "CorruptLTS",
    "CurrentGeneration",
    "DatabaseExists",
    "DatabaseNotFound",
    "EpochRegression",
    "ForeignIterator",
    "GenerationDropped",
    "InvalidArgument",
    "InvalidHeaders",
    "InvalidIterator",
    "InvalidKey",
    "InvalidName",
    "InvalidRecord",
    "InvalidRequest",
    "InvalidTimestamp",
    "InvalidTopic",
    "InvalidTopicFilter",
    "InvalidValue",
    "LeaseNotFound",
    "MetadataError",
    "NodeIdInUse",
    "NotEnoughReplicas",
    "NotEnoughReplicasAfterAppend",
    "NotLeader",
    "OffsetMismatch",
    "OffsetOutOfRange",
    "OutOfOrderSequence",
    "Overloaded",
    "PermissionDenied",
    "ProducerFenced",
    "QuotaExceeded",
    "RecordTooLarge",
    "RemoteError",
    "RequestTooLarge",
    "SeglogError",
    "ServerUnavailable",
    "StaleGeneration",
    "StaleMetadata",
    "StorageError",
    "StoreLocked",
    "StoreNotFound",
    "StreamFilterMismatch",
    "SubackOutOfRange",
    "TierError",
    "TierFenced",
    "UnknownGeneration",
    "UnknownMember",
    "UnknownStream",
    "UnsupportedContentType",
    "UsageError",
]


class SeglogError(Exception):
    """Root of every exception seglog raises deliberately."""


# --- caller mistakes -------------------------------------------------------------------


class UsageError(SeglogError):
    """The call itself is invalid; retrying it unchanged fails the same way."""


class InvalidArgument(UsageError, ValueError):
    """An argument is out of its documented domain (bad shard, negative size, ...)."""


class EpochRegression(InvalidArgument):
    """A leader epoch (or its start offset) would go backwards in a shard's epoch cache.

    Kafka's ``LeaderEpochFileCache`` logs and ignores such an assignment; seglog refuses it,
    because it means a stale leader or a caller bug, and silently dropping it would hide
    either. Nothing is changed.

    Attributes:
        epoch: The epoch asked for.
        start_offset: Its start offset.
        latest_epoch: The cache's latest epoch.
        latest_start_offset: The latest epoch's start offset.
    """

    def __init__(self, epoch: int, start_offset: int, latest_epoch: int, latest_start_offset: int) -> None:
        super().__init__(
            f"leader epoch {epoch} at offset {start_offset} goes back from the latest epoch"
            f" {latest_epoch} at offset {latest_start_offset}"
        )
        self.epoch = epoch
        self.start_offset = start_offset
        self.latest_epoch = latest_epoch
        self.latest_start_offset = latest_start_offset


class InvalidRecord(UsageError, ValueError):
    """A record failed validation; nothing of the call was written."""

    def __init__(self, message: str, *, index: int | None = None) -> None:
        super().__init__(message if index is None else f"record {index}: {message}")
        self.index = index


class InvalidTopic(InvalidRecord):
    """Empty topic, wildcard or NUL in a topic name, or a topic over 65535 UTF-8 bytes."""


class InvalidTopicFilter(UsageError, ValueError):
    """An MQTT topic filter is malformed (misplaced ``#`` or ``+``, empty, NUL)."""


class InvalidValue(InvalidRecord):
    """A record value is not ``bytes``."""


class InvalidKey(InvalidRecord):
    """A record key is neither ``None`` nor ``bytes``."""


class InvalidHeaders(InvalidRecord):
    """Headers are not a ``dict[str, bytes]``."""


class RecordTooLarge(InvalidRecord):
    """A value is larger than the database's ``max_record_bytes``."""


class InvalidTimestamp(InvalidRecord):
    """A ``ts`` that is not µs since 1970 within the database's accepted range.

    The message names the likely unit when the value looks like seconds, milliseconds or
    nanoseconds (see ``DbConfig.min_ts_us``/``max_ts_us``).
    """


class InvalidIterator(InvalidArgument):
    """Iterator bytes that are not an iterator: wrong length, magic, version or CRC.

    ``Iterator.from_bytes`` checks the bytes alone; whether the iterator belongs to the
    database it is used with is checked when it is used (:class:`ForeignIterator`,
    :class:`UnknownStream`).
    """


class ForeignIterator(InvalidIterator):
    """An iterator or stream of another database (or of a dropped and recreated one)."""


class UnknownStream(InvalidArgument):
    """A stream this database does not have: no such shard or stream id, or the id now names
    another learned structure (an iterator of another shard, or of a log cut back since)."""


class StreamFilterMismatch(InvalidArgument):
    """A topic filter that can match no topic of the stream it was given with."""


class UnknownGeneration(InvalidArgument):
    """A generation (slab) this database never had."""


class CurrentGeneration(InvalidArgument):
    """``drop_slab`` of the current generation: only a closed one (one with a newer
    generation after it) can be dropped; call ``add_generation`` first."""


class SubackOutOfRange(InvalidArgument):
    """A subscription ``suback`` beyond the records delivered, or below an earlier suback.

    Attributes:
        seqno: The seqno given.
        acked: The subscription's last acknowledged seqno.
        delivered: The seqno of the last batch the subscriber took.
    """

    def __init__(self, message: str, *, seqno: int, acked: int, delivered: int) -> None:
        super().__init__(message)
        self.seqno = seqno
        self.acked = acked
        self.delivered = delivered


class InvalidName(UsageError, ValueError):
    """A database name is empty, too long, or could escape the data directory."""


class ConfigMismatch(UsageError):
    """An immutable setting conflicts with the persisted configuration."""


class DatabaseExists(UsageError):
    """``create_db`` on an existing database without ``exist_ok=True``."""


class DatabaseNotFound(UsageError, KeyError):
    """The named database does not exist."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class StoreNotFound(DatabaseNotFound):
    """The path is not a seglog data directory (a read-only command never creates one)."""


class ClosedResourceError(UsageError):
    """The store, database or iterator was closed and cannot be used."""


class BusyResourceError(UsageError):
    """The resource is in use by someone else."""


class StoreLocked(BusyResourceError):
    """Another process holds the data directory open."""


class NodeIdInUse(BusyResourceError):
    """Another live process registered this node id in the cluster metadata."""


class StaleMetadata(UsageError):
    """A metadata update was based on a state that changed since (or a deposed controller).

    Re-read the state and decide again.
    """


class QuotaExceeded(UsageError):
    """The append would take the store over its soft quota; nothing was written."""


class BufferFull(QuotaExceeded):
    """A network producer's local buffer (``buffer_max_bytes``) has no room; nothing was enqueued.

    Raised by ``Producer.send`` under ``overflow="error"`` (and under ``"block"`` when no room
    freed up within the request timeout), and set on the futures of records that
    ``overflow="drop_oldest"`` dropped. Like :class:`QuotaExceeded` it is a local quota: the
    same call can succeed once acknowledgements free space.
    """


class InvalidRequest(InvalidArgument):
    """A request to a seglog server is malformed (bad query, undecodable body); nothing was written."""


class UnsupportedContentType(InvalidRequest):
    """A request body's ``Content-Type`` is not one the endpoint takes (HTTP 415)."""


class RequestTooLarge(InvalidRequest):
    """A request body is larger than the server accepts; nothing of it was written."""


class AuthenticationFailed(UsageError):
    """The server got no token, or one it does not know (HTTP 401)."""


class PermissionDenied(UsageError):
    """The token is valid but lacks the permission the request needs (HTTP 403)."""


class StaleGeneration(UsageError):
    """A group member acted (commit, heartbeat) under a generation the group has left.

    A zombie member cannot move a group's offsets backwards: it must rejoin first.

    Attributes:
        generation: The generation the member sent.
        current: The group's current generation.
    """

    def __init__(self, message: str, *, generation: int, current: int) -> None:
        super().__init__(message)
        self.generation = generation
        self.current = current


class ProducerFenced(UsageError):
    """An idempotent producer wrote with an epoch below the one its id has written with since.

    Attributes:
        producer_id: The producer.
        epoch: The producer's current epoch on the shard.
    """

    def __init__(self, message: str, *, producer_id: int, epoch: int) -> None:
        super().__init__(message)
        self.producer_id = producer_id
        self.epoch = epoch


class OutOfOrderSequence(UsageError):
    """An idempotent producer's batch does not continue what the shard stored of it.

    Records between the last stored sequence and the batch's first were never stored (or
    the shard lost them); storing the batch would hide the gap. Nothing was written.

    Attributes:
        producer_id: The producer.
        expected: The sequence the shard expects next.
        got: The batch's first sequence.
    """

    def __init__(self, message: str, *, producer_id: int, expected: int, got: int) -> None:
        super().__init__(message)
        self.producer_id = producer_id
        self.expected = expected
        self.got = got


class UnknownMember(StaleGeneration):
    """The group does not know the member (never joined, left, or its session expired)."""


# --- storage and remote failures -------------------------------------------------------


class StorageError(SeglogError):
    """A local disk operation failed; the OS error is chained as ``__cause__``."""


class AppendFailed(StorageError):
    """An append failed on one or more shards; nothing of those shards' parts is in the log.

    A routed append is atomic per shard, not across shards: parts for other shards may have
    been written (and are durable).

    Attributes:
        failed: Shard -> the failure of its part.
        written: Shard -> base offset of each part that was written.
    """

    def __init__(self, message: str, *, failed: dict[int, BaseException], written: dict[int, int]) -> None:
        super().__init__(message)
        self.failed = failed
        self.written = written


class CorruptFrame(StorageError):
    """A frame failed its magic, length or CRC check."""


class CorruptBuffer(StorageError):
    """A producer's disk buffer failed a check that a torn write cannot explain.

    A torn tail (an item cut short, or a bad last item, at the end of the newest segment) is
    truncated on open; a bad item followed by a good one, a bad item in an older segment, or a
    bad commit file is damage and raises this (nothing is dropped silently).

    Attributes:
        path: The damaged file.
        position: Byte position of the bad item (None for the commit file).
    """

    def __init__(self, message: str, *, path: str, position: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.position = position


class CorruptCheckpoint(StorageError):
    """A small checkpoint file (leader epochs, high watermark) failed its format or CRC check.

    Such files are only ever replaced whole (see ``seglog._fs.atomic_write``), so a bad one
    is damage, not a torn write: it is reported rather than read as empty.
    """


class CorruptLTS(StorageError):
    """Serialized learned-topic-structure data failed its magic, version, CRC or layout check."""


class TierError(StorageError):
    """The tier (S3/MinIO or a directory) failed; the cause is chained."""


class TierFenced(TierError):
    """A shard's tier manifest entries are written by another node now: it claimed the shard
    at a higher leader epoch (this node's leadership ended). Nothing this node had not saved
    reaches the manifest."""


# --- the network -----------------------------------------------------------------------


class RemoteError(SeglogError):
    """A seglog server could not be reached or answered outside the protocol; the cause is chained.

    Whether the request took effect is unknown (a produce may have been written).
    """


class ServerUnavailable(RemoteError):
    """The server is shutting down, overloaded or unreachable; retrying later may succeed.

    Attributes:
        retry_after_s: The server's ``Retry-After`` hint in seconds, if it gave one.
    """

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Overloaded(ServerUnavailable):
    """The server refused the request before doing anything (in-flight cap, queue full): HTTP 503."""


class NotLeader(ServerUnavailable):
    """The node does not lead the shard (or no longer does): ask the metadata and retry there.

    Attributes:
        shard: The shard.
        leader: The node id of the leader this node knows of (-1: none), if any.
        leader_epoch: The leader epoch this node knows of.
    """

    def __init__(
        self,
        message: str,
        *,
        shard: int | None = None,
        leader: int | None = None,
        leader_epoch: int | None = None,
    ) -> None:
        super().__init__(message)
        self.shard = shard
        self.leader = leader
        self.leader_epoch = leader_epoch


class NotEnoughReplicas(ServerUnavailable):
    """Fewer in-sync replicas than ``min_insync``: the write was refused before anything was written."""


class NotEnoughReplicasAfterAppend(NotEnoughReplicas):
    """The leader wrote the batch but the ISR shrank below ``min_insync`` before it was replicated.

    The batch may become visible later; retrying can store it twice (the idempotent producer
    removes that).
    """


class MetadataError(RemoteError):
    """The metadata store (etcd) could not be reached or refused a request; the cause is chained."""


class LeaseNotFound(MetadataError):
    """An etcd lease expired or was revoked: every key attached to it is gone."""


# --- positions -------------------------------------------------------------------------


class OffsetMismatch(SeglogError, ValueError):
    """Frames handed to ``append_frames`` do not continue the shard's log exactly.

    Attributes:
        expected: The offset the log continues at (its end).
        actual: The offset the frames start at (or the first gap inside them).
        shard: The shard.
    """

    def __init__(self, message: str, *, expected: int, actual: int, shard: int | None = None) -> None:
        super().__init__(message)
        self.expected = expected
        self.actual = actual
        self.shard = shard


class OffsetOutOfRange(SeglogError, IndexError):
    """An offset outside ``[start_offset, end_offset]`` of a shard.

    Attributes:
        offset: The offset asked for.
        start: The shard's first readable offset when the error was raised.
        end: The shard's end offset (next offset to be assigned).
    """

    def __init__(self, offset: int, start: int, end: int, *, shard: int | None = None) -> None:
        where = "" if shard is None else f" of shard {shard}"
        super().__init__(f"offset {offset} is outside [{start}, {end}]{where}")
        self.offset = offset
        self.start = start
        self.end = end
        self.shard = shard


class GenerationDropped(OffsetOutOfRange):
    """A read of a generation that ``drop_slab`` dropped: its records are gone.

    Raised by ``next``/``next_arrow``, ``make_iterator`` and subscriptions of an iterator
    or stream of that generation (EMQX's ``generation_not_found``).

    Attributes:
        generation: The dropped generation.
        shard: The shard read (``None`` when not one shard's read).
        offset: The position read (0 when none).
    """

    def __init__(self, generation: int, *, shard: int | None = None, offset: int = 0) -> None:
        where = "" if shard is None else f" (shard {shard}, offset {offset})"
        Exception.__init__(self, f"generation {generation} was dropped; its records are gone{where}")
        self.generation = generation
        self.offset = offset
        self.start = offset
        self.end = offset
        self.shard = shard
