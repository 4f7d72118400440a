"""A database's persisted configuration (:class:`DbConfig`) and database names.

Apart from :mod:`seglog.db` so that what only reads or checks configs (the store, the CLI,
read-only access, followers) needs neither the Database class nor its imports; ``DbConfig``
and ``validate_db_name`` are re-exported from :mod:`seglog.db` and ``DbConfig`` from
:mod:`seglog`.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields
from typing import Any, Final, Literal

from seglog.engines.base import DEFAULT_SEGMENT_BYTES, DEFAULT_SEGMENT_MS
from seglog.engines.registry import get_engine, tiering_engines
from seglog.errors import ConfigMismatch, InvalidArgument, InvalidName
from seglog.record import DEFAULT_MAX_RECORD_BYTES, DEFAULT_MAX_TS_US, DEFAULT_MIN_TS_US

__all__ = ["MAX_SHARDS", "Compression", "DbConfig", "EngineName", "validate_db_name"]

# The registered engines (seglog.engines.registry); a Literal so mypy checks the defaults.
EngineName = Literal["segment", "memory", "lmdb"]
Compression = Literal["none", "zstd"]
# Always ``fullmatch``: ``$`` with ``match`` also accepts a trailing "\n".
_NAME_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
# Shards cost no descriptor while idle (segment/fd_cache.py); 10,000 are tested under
# ``ulimit -n 1024`` (tests/test_many_shards.py).
MAX_SHARDS: Final = 16_384


def validate_db_name(name: object) -> str:
    """Check a database name: 1-128 of ``[A-Za-z0-9_.-]``, not starting with ``.`` or ``-``.

    Raises:
        InvalidName: The name could escape the data directory or is otherwise unusable.
    """
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or ".." in name:
        raise InvalidName(
            f"invalid database name {name!r}: use 1-128 characters of letters, digits, '_', '.', '-', "
            "starting with a letter or digit, without '..'"
        )
    return name


@dataclass(frozen=True)
class DbConfig:
    """A database's persisted configuration. ``shards`` and ``engine`` are immutable."""

    shards: int = 1
    engine: EngineName = "segment"
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    segment_ms: int = DEFAULT_SEGMENT_MS
    compression: Compression = "none"
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    index_interval_bytes: int = 4096
    retention_bytes: int | None = None
    retention_ms: int | None = None
    retention_overrides_groups: bool = False
    # Tiering (``segment`` engine in a store opened with ``tier=...``): after a sealed
    # segment is committed in the tier, its local copy goes when the shard's local bytes stay
    # at or above ``local_retention_bytes`` without it, or its newest record is older than
    # ``local_retention_ms``. ``None`` (both): keep every local copy.
    local_retention_bytes: int | None = None
    local_retention_ms: int | None = None
    # The ``ts`` an append accepts, in µs since 1970 (``None``: no bound). A record outside
    # it raises InvalidTimestamp, whose message names the likely unit (s, ms, ns) when the
    # value looks like one. Default: 2000-01-01T00:00:00Z .. 2200-01-01T00:00:00Z.
    min_ts_us: int | None = DEFAULT_MIN_TS_US
    max_ts_us: int | None = DEFAULT_MAX_TS_US
    # Streams (fixed at creation): each shard learns its topics' structure (LTS, EMQX's
    # rules) and appends stamp every record with its stream, which makes wildcard reads
    # through ``get_streams``/``make_iterator``/``next`` skip frames of other streams.
    # Per depth, how many distinct static children a topic level keeps before later tokens
    # at that level vary (the last value applies to all deeper levels); 0: always varies.
    # ``None`` (the default): no streams (the ``stream`` column stays as given, 0 by
    # default). Opt in with ``DEFAULT_LTS_THRESHOLDS`` (EMQX's ``[100, 10]``): stamping
    # costs 30-40 % of append throughput today (measured; the target is 10 %), too much to
    # charge every database. A config persisted before streams existed reads as ``None``.
    lts_thresholds: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.lts_thresholds, list):  # from JSON, or a caller's list
            object.__setattr__(self, "lts_thresholds", tuple(self.lts_thresholds))

    IMMUTABLE: Final = ("shards", "engine")  # type: ignore[misc]
    # What Database.configure may change (``compression`` and ``index_interval_bytes`` are
    # fixed at creation too, like the immutable ones).
    MUTABLE: Final = (  # type: ignore[misc]
        "segment_bytes",
        "segment_ms",
        "max_record_bytes",
        "retention_bytes",
        "retention_ms",
        "retention_overrides_groups",
        "local_retention_bytes",
        "local_retention_ms",
        "min_ts_us",
        "max_ts_us",
    )

    def validate(self) -> DbConfig:
        """Check every setting's domain.

        Raises:
            InvalidArgument: A setting is out of range.
        """
        if not isinstance(self.shards, int) or not 1 <= self.shards <= MAX_SHARDS:
            raise InvalidArgument(f"shards must be an int in 1..{MAX_SHARDS}")
        get_engine(self.engine)  # raises InvalidArgument naming the registered engines
        if not isinstance(self.segment_bytes, int) or self.segment_bytes < 4096:
            raise InvalidArgument("segment_bytes must be an int >= 4096")
        if not isinstance(self.segment_ms, int) or self.segment_ms < 1:
            raise InvalidArgument("segment_ms must be an int >= 1")
        if self.compression not in ("none", "zstd"):
            raise InvalidArgument("compression must be 'none' or 'zstd'")
        if not isinstance(self.max_record_bytes, int) or not 1 <= self.max_record_bytes <= 64 << 20:
            raise InvalidArgument("max_record_bytes must be an int in 1..64 MiB")
        if not isinstance(self.index_interval_bytes, int) or self.index_interval_bytes < 1:
            raise InvalidArgument("index_interval_bytes must be an int >= 1")
        for name in ("retention_bytes", "retention_ms", "local_retention_bytes", "local_retention_ms"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 0):
                raise InvalidArgument(f"{name} must be None or an int >= 0")
        if not get_engine(self.engine).tiering and (
            self.local_retention_bytes is not None or self.local_retention_ms is not None
        ):
            raise InvalidArgument(
                f"local_retention_bytes/local_retention_ms need the {tiering_engines()} engine (tiering)"
            )
        if type(self.retention_overrides_groups) is not bool:
            raise InvalidArgument("retention_overrides_groups must be a bool")
        for name in ("min_ts_us", "max_ts_us"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or not -(1 << 63) <= value < 1 << 63):
                raise InvalidArgument(f"{name} must be None or an int64 (µs since 1970)")
        if self.min_ts_us is not None and self.max_ts_us is not None and self.min_ts_us > self.max_ts_us:
            raise InvalidArgument("min_ts_us must not be greater than max_ts_us")
        thresholds = self.lts_thresholds
        if thresholds is not None and (
            not isinstance(thresholds, tuple)
            or not 1 <= len(thresholds) <= 64
            or any(type(t) is not int or not 0 <= t <= 0xFFFFFFFF for t in thresholds)
        ):
            raise InvalidArgument(
                "lts_thresholds must be None or a list of 1..64 ints in 0..2**32-1 "
                f"(static children per topic level before it varies), not {thresholds!r}"
            )
        return self

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DbConfig:
        """Read a persisted config, ignoring unknown keys from newer versions."""
        known = {f.name for f in fields(cls)}
        settings = {k: v for k, v in data.items() if k in known}
        # Written before streams existed: its records carry no stream stamps.
        settings.setdefault("lts_thresholds", None)
        return cls(**settings).validate()

    def check_compatible(self, requested: dict[str, Any]) -> None:
        """Raise :class:`ConfigMismatch` if ``requested`` changes an immutable setting."""
        for name in self.IMMUTABLE:
            if name in requested and requested[name] != getattr(self, name):
                raise ConfigMismatch(
                    f"{name}={requested[name]!r} conflicts with the existing database's {name}="
                    f"{getattr(self, name)!r} (immutable)"
                )
