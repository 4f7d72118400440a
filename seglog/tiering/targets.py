"""Tier targets: where sealed segments go as objects (a local directory or S3/MinIO).

Every method blocks; the DB layer calls them from worker threads. Targets are safe to use
from several threads at once. Keys are relative, ``/``-separated paths such as
``mydb/shard=0/00000000000000000000-00000000000000000999.parquet``.

Guarantees shared by both targets:

* ``put`` is atomic (a reader sees the old object or the whole new one, never a prefix) and
  idempotent (putting the same bytes again is harmless, so a crashed upload is simply
  retried);
* ``verify`` checks the stored bytes, never only a value the writer recorded itself: the
  local target re-reads the file and recomputes its sha256; the S3 target compares the
  SHA256 checksum the server validated on upload and stored with the object
  (``ChecksumAlgorithm='SHA256'``), or, where that checksum cannot be compared with the
  whole-object sha256, downloads the object and hashes it (see :meth:`S3Target.verify`);
* every object put by seglog records the sha256 of its content: the local target
  recomputes it from the file, the S3 target also stores it as user metadata
  ``x-amz-meta-sha256`` (informational: ``head`` reports it, ``verify`` does not trust it);
* every failure is a :class:`~seglog.errors.TierError` with the original exception chained
  as ``__cause__``; a missing object is the subclass :class:`ObjectNotFound`, a failed
  ``verify`` :class:`ObjectMismatch` (or :class:`ObjectNotFound`).
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import fcntl
import hashlib
import io
import logging
import os
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar, runtime_checkable
from urllib.parse import unquote, urlsplit

from seglog._fs import TMP_PREFIX, atomic_writer, fsync_dir
from seglog.errors import InvalidArgument, TierError
from seglog.tiering._fs import copy_and_hash

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client

__all__ = [
    "CHECKSUM_META_KEY",
    "LocalTarget",
    "ObjectInfo",
    "ObjectMismatch",
    "ObjectNotFound",
    "PreconditionFailed",
    "PutData",
    "S3Target",
    "S3Tuning",
    "TierTarget",
    "open_target",
    "validate_key",
    "verify_bytes",
]

log = logging.getLogger("seglog.tiering")

CHECKSUM_META_KEY = "sha256"
"""S3 user-metadata key holding the object's sha256 (hex); informational, never verified."""

S3_CHECKSUM_ALGORITHM = "SHA256"
"""The S3 additional-checksum algorithm of every upload (the server validates it)."""

SENT_CACHE_ENTRIES = 256
"""How many multipart uploads an :class:`S3Target` remembers the expected composite of."""

HASH_CHUNK_BYTES = 1 << 20
DEFAULT_REGION = "us-east-1"

PutData = bytes | bytearray | memoryview | os.PathLike[str]
"""What ``put`` accepts: the object's bytes, or the path of a local file to upload."""

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What a target knows about one stored object.

    Attributes:
        key: The object key, relative to the target's root.
        size: Length in bytes.
        checksum: sha256 of the content, lowercase hex; ``""`` if unknown (an S3 object
            not written by seglog).
    """

    key: str
    size: int
    checksum: str


class ObjectNotFound(TierError):
    """The object does not exist in the tier."""


class ObjectMismatch(TierError):
    """A stored object's size or content differs from what was expected (or cannot be checked)."""


class PreconditionFailed(TierError):
    """A conditional put found the object changed since it was read (or present when it was
    to be created): another writer got there first. Read it again and retry."""


@runtime_checkable
class TierTarget(Protocol):
    """A flat key -> bytes store holding tiered segments and manifests."""

    @property
    def uri(self) -> str:
        """The root this target was opened with (``file:///dir`` or ``s3://bucket/prefix``)."""
        ...

    def put(self, key: str, data: PutData) -> ObjectInfo:
        """Stores ``data`` under ``key`` atomically, replacing any old object."""
        ...

    def get(self, key: str) -> bytes:
        """Returns the whole object; raises :class:`ObjectNotFound` if missing."""
        ...

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Returns bytes ``[start, end)`` of the object; raises :class:`ObjectNotFound` if
        missing and :class:`ObjectMismatch` if the object ends before ``end``."""
        ...

    def head(self, key: str) -> ObjectInfo | None:
        """Returns the object's info, or ``None`` if it does not exist."""
        ...

    def get_versioned(self, key: str) -> tuple[bytes, str]:
        """Returns the whole object and its version, an opaque token that changes with every
        put; raises :class:`ObjectNotFound` if missing."""
        ...

    def put_if(self, key: str, data: bytes, version: str | None) -> str:
        """Stores ``data`` only if the object is still at ``version`` (``None``: only if it
        does not exist), atomically with that check; returns the new version.

        Raises:
            PreconditionFailed: The object is at another version (or exists, or is missing).
        """
        ...

    def list(self, prefix: str = "") -> builtins.list[str]:
        """Returns the sorted keys that start with ``prefix`` (a plain string prefix)."""
        ...

    def delete(self, key: str) -> None:
        """Deletes the object; deleting a missing object is not an error."""
        ...

    def url(self, key: str = "") -> str:
        """Returns the location Spark reads ``key`` (or a key prefix/directory) from."""
        ...

    def verify(self, key: str, expected: ObjectInfo) -> None:
        """Raises :class:`ObjectMismatch`/:class:`ObjectNotFound` unless the object matches.

        The check covers the stored bytes (their size and sha256), not metadata the writer
        recorded; each target documents how it gets at them.
        """
        ...

    def close(self) -> None:
        """Releases connections; the target must not be used afterwards."""
        ...


def validate_key(key: str, *, prefix: bool = False) -> str:
    """Checks an object key (or, with ``prefix=True``, a key prefix) and returns it.

    Keys are relative ``/``-separated paths without empty, ``.`` or ``..`` segments, NUL,
    backslashes, or segments starting with ``.tmp-`` (reserved for temp files). A prefix
    may be empty and may end with ``/``.

    Raises:
        InvalidArgument: If the key is malformed.
    """
    if not isinstance(key, str):
        raise InvalidArgument(f"object key must be str, not {type(key).__name__}")
    if not key:
        if prefix:
            return key
        raise InvalidArgument("object key is empty")
    if "\x00" in key or "\\" in key:
        raise InvalidArgument(f"object key contains NUL or backslash: {key!r}")
    if key.startswith("/"):
        raise InvalidArgument(f"object key must be relative: {key!r}")
    segments = key.split("/")
    if prefix and segments[-1] == "":
        segments = segments[:-1]
    for seg in segments:
        if seg in ("", ".", "..") or seg.startswith(TMP_PREFIX):
            raise InvalidArgument(f"invalid segment {seg!r} in object key {key!r}")
    return key


def _as_view_or_path(data: PutData) -> memoryview | Path:
    if isinstance(data, bytes | bytearray | memoryview):
        return memoryview(data).cast("B")
    if isinstance(data, os.PathLike):
        return Path(data)
    raise InvalidArgument(f"put data must be bytes or a path, not {type(data).__name__}")


def _hash_file(path: Path) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK_BYTES):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def _check_matches(key: str, actual: ObjectInfo | None, expected: ObjectInfo) -> None:
    if actual is None:
        raise ObjectNotFound(f"verify {key!r}: object is missing")
    if actual.size != expected.size:
        raise ObjectMismatch(f"verify {key!r}: size {actual.size} != expected {expected.size}")
    if not expected.checksum or actual.checksum != expected.checksum:
        raise ObjectMismatch(
            f"verify {key!r}: sha256 {actual.checksum or '<none>'} != expected "
            f"{expected.checksum or '<none>'}"
        )


def _check_range(start: int, end: int) -> None:
    if type(start) is not int or type(end) is not int or not 0 <= start < end:
        raise InvalidArgument(f"invalid byte range [{start!r}, {end!r})")


def _whole_range(key: str, data: bytes, start: int, end: int) -> bytes:
    """``data`` if it is all of ``[start, end)``; a shorter read means a shorter object."""
    if len(data) != end - start:
        raise ObjectMismatch(
            f"{key!r}: bytes {start}-{end} asked, {len(data)} returned (the object is shorter)"
        )
    return data


def verify_bytes(key: str, data: bytes | memoryview, expected: ObjectInfo) -> None:
    """Raises :class:`ObjectMismatch` unless ``data`` has ``expected``'s size and sha256.

    Use it on bytes returned by ``get`` to catch corruption in transit or at rest.
    """
    view = memoryview(data).cast("B")
    _check_matches(key, ObjectInfo(key, len(view), hashlib.sha256(view).hexdigest()), expected)


# --- local directory -------------------------------------------------------------------


class LocalTarget:
    """A tier in a local directory (the default tier).

    Objects are plain files under ``root``; puts go through a temp file, fsync, rename and
    directory fsync. ``head`` and ``verify`` recompute the sha256 from the file.
    """

    def __init__(self, root: Path) -> None:
        """Args: root: absolute directory; created on first put if missing."""
        if not root.is_absolute():
            raise InvalidArgument(f"local tier root must be absolute: {root}")
        self._root = root

    @property
    def root(self) -> Path:
        """The directory objects are stored in."""
        return self._root

    @property
    def uri(self) -> str:
        """The ``file://`` URI of the root."""
        return self._root.as_uri()

    def _path(self, key: str) -> Path:
        return self._root / validate_key(key)

    def put(self, key: str, data: PutData) -> ObjectInfo:
        """Writes the object atomically and durably; returns its size and sha256."""
        path = self._path(key)
        src = _as_view_or_path(data)
        try:
            with atomic_writer(path, make_parents=True) as f:
                if isinstance(src, memoryview):
                    f.write(src)
                    size, checksum = len(src), hashlib.sha256(src).hexdigest()
                else:
                    with open(src, "rb") as src_file:
                        size, checksum = copy_and_hash(src_file, f)
        except OSError as exc:
            raise TierError(f"put {key!r} to {self.uri} failed: {exc}") from exc
        return ObjectInfo(key, size, checksum)

    def get(self, key: str) -> bytes:
        """Reads the whole object."""
        path = self._path(key)
        try:
            return path.read_bytes()
        except FileNotFoundError as exc:
            raise ObjectNotFound(f"{key!r} not found in {self.uri}") from exc
        except OSError as exc:
            raise TierError(f"get {key!r} from {self.uri} failed: {exc}") from exc

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Reads bytes ``[start, end)`` of the object (one ``pread``)."""
        _check_range(start, end)
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                data = os.pread(f.fileno(), end - start, start)
        except FileNotFoundError as exc:
            raise ObjectNotFound(f"{key!r} not found in {self.uri}") from exc
        except OSError as exc:
            raise TierError(f"get {key!r} bytes {start}-{end} from {self.uri} failed: {exc}") from exc
        return _whole_range(key, data, start, end)

    def get_versioned(self, key: str) -> tuple[bytes, str]:
        """Reads the whole object; its version is the sha256 of its bytes."""
        data = self.get(key)
        return data, hashlib.sha256(data).hexdigest()

    def put_if(self, key: str, data: bytes, version: str | None) -> str:
        """Writes atomically and durably if the object's sha256 is still ``version``.

        The check and the write hold an exclusive ``flock`` on the object's directory, so
        processes sharing the directory (nodes of one machine) take turns.
        """
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            raise TierError(f"put {key!r} to {self.uri} failed: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                current: str | None = hashlib.sha256(path.read_bytes()).hexdigest()
            except FileNotFoundError:
                current = None
            if current != version:
                raise PreconditionFailed(
                    f"put {key!r} to {self.uri}: the object is at {current or 'nothing'}, not {version or 'nothing'}"
                )
            with atomic_writer(path) as f:
                f.write(data)
        except OSError as exc:
            raise TierError(f"put {key!r} to {self.uri} failed: {exc}") from exc
        finally:
            os.close(fd)  # releases the lock
        return hashlib.sha256(data).hexdigest()

    def head(self, key: str) -> ObjectInfo | None:
        """Returns size and (recomputed) sha256, or ``None`` if missing."""
        path = self._path(key)
        try:
            size, checksum = _hash_file(path)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        except OSError as exc:
            raise TierError(f"head {key!r} in {self.uri} failed: {exc}") from exc
        return ObjectInfo(key, size, checksum)

    def list(self, prefix: str = "") -> builtins.list[str]:
        """Returns sorted keys starting with ``prefix``, skipping temp files."""
        validate_key(prefix, prefix=True)
        base_rel = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        base = self._root / base_rel if base_rel else self._root
        keys: builtins.list[str] = []

        def on_error(exc: OSError) -> None:
            if not isinstance(exc, FileNotFoundError | NotADirectoryError):
                raise TierError(f"list {prefix!r} in {self.uri} failed: {exc}") from exc

        for dirpath, dirnames, filenames in os.walk(base, onerror=on_error):
            rel_dir = Path(dirpath).relative_to(self._root).as_posix()
            rel_dir = "" if rel_dir == "." else rel_dir + "/"
            dirnames[:] = [
                d
                for d in dirnames
                if not d.startswith(TMP_PREFIX)
                and (rel_dir + d + "/").startswith(prefix[: len(rel_dir + d + "/")])
            ]
            for name in filenames:
                rel = rel_dir + name
                if not name.startswith(TMP_PREFIX) and rel.startswith(prefix):
                    keys.append(rel)
        keys.sort()
        return keys

    def delete(self, key: str) -> None:
        """Removes the file (and fsyncs its directory); a missing file is fine."""
        path = self._path(key)
        try:
            path.unlink()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise TierError(f"delete {key!r} from {self.uri} failed: {exc}") from exc
        with contextlib.suppress(FileNotFoundError):
            fsync_dir(path.parent)

    def url(self, key: str = "") -> str:
        """Returns ``file:///root/key`` (``key`` may be a directory-like prefix or empty)."""
        if not key:
            return self.uri
        return (self._root / validate_key(key.rstrip("/"))).as_uri()

    def verify(self, key: str, expected: ObjectInfo) -> None:
        """Re-reads the whole file and compares its size and recomputed sha256 with ``expected``."""
        _check_matches(key, self.head(key), expected)

    def close(self) -> None:
        """Nothing to release."""

    def __repr__(self) -> str:
        return f"LocalTarget({self.uri!r})"


# --- S3 / MinIO ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class S3Tuning:
    """Knobs of the S3 target.

    Attributes:
        multipart_threshold_bytes: Objects at least this large use multipart upload.
        multipart_chunk_bytes: Part size (S3 requires >= 5 MiB for all parts but the last).
        max_concurrency: Parallel part uploads/downloads per call.
        max_attempts: Attempts per operation on transient errors (>= 1).
        backoff_base_s: First retry delay; doubles each attempt, with full jitter.
        backoff_max_s: Upper bound of one retry delay.
        connect_timeout_s: TCP connect timeout per request.
        read_timeout_s: Socket read timeout per request.
    """

    multipart_threshold_bytes: int = 16 << 20
    multipart_chunk_bytes: int = 16 << 20
    max_concurrency: int = 4
    max_attempts: int = 5
    backoff_base_s: float = 0.2
    backoff_max_s: float = 5.0
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise InvalidArgument("max_attempts must be >= 1")
        if self.multipart_chunk_bytes < 5 << 20:
            raise InvalidArgument("multipart_chunk_bytes must be >= 5 MiB")
        if self.multipart_threshold_bytes < 1 or self.max_concurrency < 1:
            raise InvalidArgument("multipart_threshold_bytes and max_concurrency must be >= 1")
        if self.backoff_base_s < 0 or self.backoff_max_s < 0:
            raise InvalidArgument("backoff delays must be >= 0")


_TRANSIENT_CODES = frozenset(
    {
        "BadDigest",  # the body did not match its checksum: corrupted in transit, resend
        "InternalError",
        "RequestTimeout",
        "RequestTimeoutException",
        "ServiceUnavailable",
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "XAmzContentChecksumMismatch",  # MinIO's BadDigest for x-amz-checksum-* headers
        "XMinioServerNotInitialized",
    }
)
_NOT_FOUND_CODES = frozenset({"404", "NoSuchKey", "NotFound"})


# A conditional write lost: the object changed (412), or another conditional write to it
# was in progress (AWS answers 409 ConditionalRequestConflict).
_CONDITION_CODES: Final = frozenset({"PreconditionFailed", "ConditionalRequestConflict"})


def _client_error_code(exc: BaseException) -> tuple[str, int]:
    from botocore.exceptions import ClientError

    if not isinstance(exc, ClientError):
        return "", 0
    err = exc.response.get("Error", {})
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return str(err.get("Code", "")), int(status)


def _is_transient(exc: BaseException) -> bool:
    from botocore.exceptions import (
        ClientError,
        ConnectionError,
        HTTPClientError,
        ResponseStreamingError,
    )
    from s3transfer.exceptions import RetriesExceededError

    if isinstance(exc, ConnectionError | HTTPClientError | ResponseStreamingError | RetriesExceededError):
        return True
    if isinstance(exc, ClientError):
        code, status = _client_error_code(exc)
        return code in _TRANSIENT_CODES or status >= 500 or status == 429
    return False


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode("ascii")


@dataclass(frozen=True, slots=True)
class _Sent:
    """What one ``put`` uploaded: size, sha256 (hex) and the ``ChecksumSHA256`` S3 must report."""

    size: int
    sha256: str
    server_checksum: str


def _hash_for_s3(chunks: Iterable[memoryview | bytes], part_bytes: int | None) -> _Sent:
    """Hashes a stream once: its sha256 and the ``ChecksumSHA256`` S3 stores for it.

    Args:
        chunks: The object's bytes, in order.
        part_bytes: The multipart part size, or ``None`` for a single PutObject.

    Returns:
        For a single PutObject the server checksum is the base64 sha256 of the object; for a
        multipart upload it is the base64 sha256 of the parts' concatenated sha256 digests,
        followed by ``-<part count>`` (S3's "composite" checksum).
    """
    whole = hashlib.sha256()
    size = 0
    part = hashlib.sha256()
    in_part = 0
    part_digests: builtins.list[bytes] = []
    for chunk in chunks:
        view = memoryview(chunk).cast("B")
        whole.update(view)
        size += len(view)
        while part_bytes is not None and view:
            take = min(len(view), part_bytes - in_part)
            part.update(view[:take])
            in_part += take
            view = view[take:]
            if in_part == part_bytes:
                part_digests.append(part.digest())
                part, in_part = hashlib.sha256(), 0
    if part_bytes is None:
        return _Sent(size, whole.hexdigest(), _b64(whole.digest()))
    if in_part or not part_digests:
        part_digests.append(part.digest())
    composite = _b64(hashlib.sha256(b"".join(part_digests)).digest())
    return _Sent(size, whole.hexdigest(), f"{composite}-{len(part_digests)}")


def _file_chunks(f: io.BufferedReader) -> Iterable[bytes]:
    while chunk := f.read(HASH_CHUNK_BYTES):
        yield chunk


def _view_chunks(view: memoryview) -> Iterable[memoryview]:
    for i in range(0, len(view), HASH_CHUNK_BYTES):
        yield view[i : i + HASH_CHUNK_BYTES]


class S3Target:
    """A tier in an S3 bucket (AWS or MinIO), under an optional key prefix.

    Uploads go through boto3's managed transfer (multipart at or above
    :attr:`S3Tuning.multipart_threshold_bytes`); S3 makes a completed PUT or multipart
    upload visible atomically. Every upload carries S3 SHA256 checksums
    (``ChecksumAlgorithm='SHA256'``): the server recomputes them over the bytes it receives
    (per part for multipart), rejects a mismatch, and stores the object's checksum, which
    :meth:`verify` compares. Transient errors (connection failures, timeouts, 5xx,
    throttling, a body that failed its checksum) are retried with capped exponential
    backoff and full jitter; the last error is raised as :class:`TierError`.
    """

    def __init__(
        self,
        client: S3Client,
        bucket: str,
        prefix: str = "",
        *,
        tuning: S3Tuning | None = None,
    ) -> None:
        """Args: client: a boto3 S3 client (owned by the target); bucket; key prefix."""
        from boto3.s3.transfer import TransferConfig

        if not bucket or "/" in bucket:
            raise InvalidArgument(f"invalid bucket name {bucket!r}")
        prefix = prefix.strip("/")
        if prefix:
            validate_key(prefix)
        self._client = client
        self._bucket = bucket
        self._prefix = prefix + "/" if prefix else ""
        self.tuning = tuning or S3Tuning()
        self._transfer = TransferConfig(
            multipart_threshold=self.tuning.multipart_threshold_bytes,
            multipart_chunksize=self.tuning.multipart_chunk_bytes,
            max_concurrency=self.tuning.max_concurrency,
            use_threads=self.tuning.max_concurrency > 1,
        )
        self._rng = random.Random()
        self._rng_lock = threading.Lock()
        self._sent: OrderedDict[str, _Sent] = OrderedDict()
        self._sent_lock = threading.Lock()

    @property
    def bucket(self) -> str:
        """The bucket name."""
        return self._bucket

    @property
    def prefix(self) -> str:
        """The key prefix inside the bucket (``""`` or ending with ``/``)."""
        return self._prefix

    @property
    def uri(self) -> str:
        """``s3://bucket/prefix``."""
        return f"s3://{self._bucket}/{self._prefix.rstrip('/')}".rstrip("/")

    def _full(self, key: str) -> str:
        return self._prefix + validate_key(key)

    def _retry(self, what: str, op: Callable[[], _T]) -> _T:
        attempts = self.tuning.max_attempts
        for attempt in range(1, attempts + 1):
            try:
                return op()
            except (ObjectNotFound, ObjectMismatch, InvalidArgument, PreconditionFailed):
                raise
            except Exception as exc:
                if not _is_transient(exc):
                    raise TierError(f"{what} failed: {exc}") from exc
                if attempt == attempts:
                    raise TierError(f"{what} failed after {attempts} attempts: {exc}") from exc
                cap_s = min(self.tuning.backoff_max_s, self.tuning.backoff_base_s * 2 ** (attempt - 1))
                with self._rng_lock:
                    delay_s = self._rng.uniform(cap_s / 2, cap_s)
                log.warning(
                    "%s: transient error (attempt %d/%d), retrying in %.2fs: %s",
                    what,
                    attempt,
                    attempts,
                    delay_s,
                    exc,
                )
                time.sleep(delay_s)
        raise AssertionError("unreachable")  # pragma: no cover

    def _part_bytes(self, size: int) -> int | None:
        """The part size boto3 uploads ``size`` bytes with, or ``None`` for one PutObject."""
        from s3transfer.utils import ChunksizeAdjuster

        if size < self.tuning.multipart_threshold_bytes:
            return None
        return ChunksizeAdjuster().adjust_chunksize(self.tuning.multipart_chunk_bytes, size)

    def put(self, key: str, data: PutData) -> ObjectInfo:
        """Uploads the object with S3 SHA256 checksums; multipart when large.

        The server validates the checksum of the body (of each part, for multipart) and
        rejects a mismatch; the sha256 is also stored as user metadata. For a multipart
        upload the target remembers the composite checksum it expects, so that
        :meth:`verify` can check it without downloading.
        """
        full = self._full(key)
        src = _as_view_or_path(data)
        if isinstance(src, memoryview):
            sent = _hash_for_s3(_view_chunks(src), self._part_bytes(len(src)))
        else:
            try:
                with open(src, "rb") as f:
                    sent = _hash_for_s3(_file_chunks(f), self._part_bytes(os.fstat(f.fileno()).st_size))
            except OSError as exc:
                raise TierError(f"put {key!r}: cannot read {src}: {exc}") from exc
        extra: dict[str, Any] = {
            "Metadata": {CHECKSUM_META_KEY: sent.sha256},
            "ChecksumAlgorithm": S3_CHECKSUM_ALGORITHM,
        }

        def upload() -> None:
            if isinstance(src, memoryview):
                self._client.upload_fileobj(
                    io.BytesIO(src), self._bucket, full, ExtraArgs=extra, Config=self._transfer
                )
            else:
                with open(src, "rb") as f:
                    self._client.upload_fileobj(f, self._bucket, full, ExtraArgs=extra, Config=self._transfer)

        self._retry(f"put s3://{self._bucket}/{full}", upload)
        with self._sent_lock:
            self._sent.pop(full, None)
            if "-" in sent.server_checksum:  # multipart: a composite checksum
                self._sent[full] = sent
                while len(self._sent) > SENT_CACHE_ENTRIES:
                    self._sent.popitem(last=False)
        return ObjectInfo(key, sent.size, sent.sha256)

    def get(self, key: str) -> bytes:
        """Downloads the whole object."""
        full = self._full(key)

        def download() -> bytes:
            data: bytes = self._get_object(full)["Body"].read()
            return data

        return self._retry(f"get s3://{self._bucket}/{full}", download)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """One ranged ``GetObject`` (``Range: bytes=start-(end-1)``)."""
        _check_range(start, end)
        full = self._full(key)

        def download() -> bytes:
            data: bytes = self._get_object(full, byte_range=f"bytes={start}-{end - 1}")["Body"].read()
            return data

        data = self._retry(f"get s3://{self._bucket}/{full} bytes {start}-{end}", download)
        return _whole_range(key, data, start, end)

    def get_versioned(self, key: str) -> tuple[bytes, str]:
        """Downloads the whole object; its version is its ETag."""
        full = self._full(key)

        def download() -> tuple[bytes, str]:
            resp = self._get_object(full)
            return resp["Body"].read(), str(resp["ETag"])

        return self._retry(f"get s3://{self._bucket}/{full}", download)

    def put_if(self, key: str, data: bytes, version: str | None) -> str:
        """One ``PutObject`` with ``If-Match: version`` (``If-None-Match: *`` for ``None``).

        A retried put whose first attempt landed fails its condition: callers that see
        :class:`PreconditionFailed` read the object again and compare (the manifest does).
        """
        full = self._full(key)
        condition = {"IfNoneMatch": "*"} if version is None else {"IfMatch": version}

        def put() -> str:
            try:
                resp = self._client.put_object(
                    Bucket=self._bucket,
                    Key=full,
                    Body=bytes(data),
                    ChecksumAlgorithm="SHA256",
                    Metadata={CHECKSUM_META_KEY: hashlib.sha256(data).hexdigest()},
                    **condition,  # type: ignore[arg-type]
                )
            except Exception as exc:
                code, status = _client_error_code(exc)
                # If-Match on a missing object: 404 (MinIO) or 412 (AWS).
                if status in (409, 412) or code in _CONDITION_CODES or code in _NOT_FOUND_CODES:
                    raise PreconditionFailed(f"put s3://{self._bucket}/{full}: {code or status}") from exc
                raise
            return str(resp["ETag"])

        etag = self._retry(f"put s3://{self._bucket}/{full}", put)
        with self._sent_lock:
            self._sent.pop(full, None)
        return etag

    def head(self, key: str) -> ObjectInfo | None:
        """Returns size and the sha256 metadata (``""`` if absent), or ``None`` if missing.

        The checksum is what the writer recorded, not checked against the bytes: use
        :meth:`verify` for that.
        """
        full = self._full(key)

        def head() -> ObjectInfo | None:
            try:
                resp = self._client.head_object(Bucket=self._bucket, Key=full)
            except Exception as exc:
                if _client_error_code(exc)[0] in _NOT_FOUND_CODES:
                    return None
                raise
            checksum = resp.get("Metadata", {}).get(CHECKSUM_META_KEY, "")
            return ObjectInfo(key, int(resp["ContentLength"]), checksum)

        return self._retry(f"head s3://{self._bucket}/{full}", head)

    def list(self, prefix: str = "") -> builtins.list[str]:
        """Returns sorted keys under ``prefix`` (relative to the target's prefix)."""
        validate_key(prefix, prefix=True)
        full_prefix = self._prefix + prefix

        def list_all() -> builtins.list[str]:
            keys: builtins.list[str] = []
            paginator = self._client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self._bucket, Prefix=full_prefix):
                for obj in page.get("Contents", []):
                    keys.append(obj["Key"][len(self._prefix) :])
            return sorted(keys)

        return self._retry(f"list s3://{self._bucket}/{full_prefix}", list_all)

    def delete(self, key: str) -> None:
        """Deletes the object (S3 treats a missing key as success)."""
        full = self._full(key)
        self._retry(
            f"delete s3://{self._bucket}/{full}",
            lambda: self._client.delete_object(Bucket=self._bucket, Key=full),
        )

    def url(self, key: str = "") -> str:
        """Returns ``s3a://bucket/prefix/key`` for Hadoop's S3A filesystem."""
        if not key:
            return f"s3a://{self._bucket}/{self._prefix}".rstrip("/")
        return f"s3a://{self._bucket}/{self._full(key.rstrip('/'))}"

    def _head_checksum(self, full: str) -> tuple[int, str] | None:
        """Size and server-stored ``ChecksumSHA256`` (``""`` if none) of ``full``, or ``None``."""

        def head() -> tuple[int, str] | None:
            try:
                resp = self._client.head_object(Bucket=self._bucket, Key=full, ChecksumMode="ENABLED")
            except Exception as exc:
                if _client_error_code(exc)[0] in _NOT_FOUND_CODES:
                    return None
                raise
            return int(resp["ContentLength"]), str(resp.get("ChecksumSHA256") or "")

        return self._retry(f"head s3://{self._bucket}/{full}", head)

    def _get_object(self, full: str, *, byte_range: str | None = None) -> Any:
        """``GetObject`` of the full key; a missing object raises :class:`ObjectNotFound`."""
        try:
            if byte_range is not None:
                return self._client.get_object(Bucket=self._bucket, Key=full, Range=byte_range)
            return self._client.get_object(Bucket=self._bucket, Key=full)
        except Exception as exc:
            code = _client_error_code(exc)[0]
            if code in _NOT_FOUND_CODES:
                raise ObjectNotFound(f"s3://{self._bucket}/{full} not found") from exc
            if code == "InvalidRange":
                raise ObjectMismatch(f"s3://{self._bucket}/{full}: {byte_range} lies past its end") from exc
            raise

    def _download_sha256(self, full: str) -> tuple[int, str]:
        """Streams the object and returns its size and sha256 (hex)."""

        def download() -> tuple[int, str]:
            resp = self._get_object(full)
            digest = hashlib.sha256()
            size = 0
            with contextlib.closing(resp["Body"]) as body:
                for chunk in body.iter_chunks(HASH_CHUNK_BYTES):
                    digest.update(chunk)
                    size += len(chunk)
            return size, digest.hexdigest()

        return self._retry(f"get s3://{self._bucket}/{full}", download)

    def verify(self, key: str, expected: ObjectInfo, *, deep: bool = False) -> None:
        """Checks that the stored bytes have ``expected``'s size and sha256.

        Asks the server for the object's size and the SHA256 checksum it validated over the
        received bytes and stored at upload (``HeadObject`` with ``ChecksumMode=ENABLED``).
        The object is accepted without a download when that checksum equals:

        * for a single PutObject (whole-object checksum): ``expected``'s sha256;
        * for a multipart upload (composite checksum: sha256 of the parts' sha256 digests,
          ``-N``): the composite this target computed, at ``put``, from the very bytes whose
          sha256 is ``expected``'s.

        In every other case (no SHA256 checksum stored, a composite this target did not
        compute, e.g. after a restart, or a checksum that differs) the object is downloaded
        and its size and sha256 are recomputed and compared; only that read-back raises
        :class:`ObjectMismatch` for content. The sha256 user metadata is never trusted.

        Args:
            key: The object key.
            expected: What ``put`` returned (or the manifest recorded).
            deep: Always download the object and recompute its sha256 as well.

        Raises:
            ObjectNotFound: The object does not exist.
            ObjectMismatch: Size or content differ, or ``expected`` has no sha256.
            TierError: The tier failed.
        """
        full = self._full(key)
        where = f"verify {key!r} (s3://{self._bucket}/{full})"
        stored = self._head_checksum(full)
        if stored is None:
            raise ObjectNotFound(f"{where}: object is missing")
        size, server_checksum = stored
        if size != expected.size:
            raise ObjectMismatch(f"{where}: size {size} != expected {expected.size}")
        try:
            want = bytes.fromhex(expected.checksum)
        except ValueError:
            want = b""
        if len(want) != hashlib.sha256().digest_size:
            raise ObjectMismatch(f"{where}: no valid expected sha256 ({expected.checksum!r})")
        comparable = ""  # the ChecksumSHA256 the server must report for the expected bytes
        if server_checksum and "-" not in server_checksum:  # whole object (single PutObject)
            comparable = _b64(want)
        elif server_checksum:  # composite: only known for bytes this target put itself
            with self._sent_lock:
                sent = self._sent.get(full)
            if sent is not None and sent.size == expected.size and sent.sha256 == want.hex():
                comparable = sent.server_checksum
        if comparable:
            if server_checksum == comparable and not deep:
                return
            if server_checksum != comparable:
                log.warning(
                    "%s: server-stored SHA256 %s != expected %s; reading the object back",
                    where,
                    server_checksum,
                    comparable,
                )
        got_size, got_sha = self._download_sha256(full)
        if got_size != expected.size:
            raise ObjectMismatch(f"{where}: read back {got_size} bytes != expected {expected.size}")
        if got_sha != want.hex():
            raise ObjectMismatch(f"{where}: read-back sha256 {got_sha} != expected {want.hex()}")

    def close(self) -> None:
        """Closes the client's connection pool."""
        self._client.close()

    def __repr__(self) -> str:
        return f"S3Target({self.uri!r})"


# --- opening ---------------------------------------------------------------------------


def open_target(
    uri: str,
    *,
    s3_endpoint: str | None = None,
    access_key: str | None = None,
    secret_key: str | None = None,
    region: str | None = None,
    tuning: S3Tuning | None = None,
) -> TierTarget:
    """Opens the tier at ``uri``.

    Args:
        uri: ``file:///abs/dir`` (or an absolute path) for a local directory, or
            ``s3://bucket[/prefix]`` (``s3a://`` accepted too). The bucket must exist.
        s3_endpoint: e.g. ``http://127.0.0.1:9000`` for MinIO; default
            ``$AWS_ENDPOINT_URL_S3`` / ``$AWS_ENDPOINT_URL``, else AWS. Path-style
            addressing is used whenever an endpoint is set.
        access_key: Default: boto3's credential chain (``$AWS_ACCESS_KEY_ID``, ...).
        secret_key: Must be given together with ``access_key``.
        region: Default ``$AWS_REGION`` / ``$AWS_DEFAULT_REGION``, else ``us-east-1``.
        tuning: S3 multipart/retry knobs.

    Raises:
        InvalidArgument: For an unsupported or malformed URI or half-given credentials.
    """
    parts = urlsplit(uri)
    if parts.scheme in ("", "file"):
        if parts.netloc not in ("", "localhost"):
            raise InvalidArgument(f"file URI must be file:///abs/path: {uri!r}")
        path = Path(unquote(parts.path))
        if not path.is_absolute():
            raise InvalidArgument(f"local tier path must be absolute: {uri!r}")
        return LocalTarget(path)
    if parts.scheme not in ("s3", "s3a"):
        raise InvalidArgument(f"unsupported tier URI scheme {parts.scheme!r} in {uri!r}")
    if not parts.netloc:
        raise InvalidArgument(f"S3 URI without bucket: {uri!r}")
    if (access_key is None) != (secret_key is None):
        raise InvalidArgument("access_key and secret_key must be given together")
    import boto3
    from botocore.config import Config

    tuning = tuning or S3Tuning()
    endpoint = (
        s3_endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None
    )
    region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or DEFAULT_REGION
    config = Config(
        region_name=region,
        signature_version="s3v4",
        connect_timeout=tuning.connect_timeout_s,
        read_timeout=tuning.read_timeout_s,
        retries={"total_max_attempts": 1},  # S3Target retries itself
        max_pool_connections=max(10, tuning.max_concurrency * 2),
        s3={"addressing_style": "path" if endpoint else "auto"},
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    session = boto3.session.Session()
    client = session.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        config=config,
    )
    return S3Target(client, parts.netloc, unquote(parts.path), tuning=tuning)
