from __future__ import annotations

import inspect
from pathlib import Path

import seglog
from seglog import errors


def test_all_is_exact_and_importable() -> None:
    expected = {
        "AppendFailed",
        "AppendResult",
        "ClosedResourceError",
        "ConfigMismatch",
        "Consumer",
        "Database",
        "DbConfig",
        "Follower",
        "InvalidArgument",
        "InvalidRecord",
        "InvalidTimestamp",
        "OffsetOutOfRange",
        "ProducerStamp",
        "Record",
        "RecordMeta",
        "SeglogError",
        "ShardStats",
        "StorageError",
        "Store",
        "StoreLocked",
        "TierShardStats",
        "__version__",
        "errors",
        "follow",
        "now_us",
        "open",
        "timestamp_us",
    }
    assert set(seglog.__all__) >= expected
    for name in seglog.__all__:
        assert hasattr(seglog, name), name
    public = {
        n
        for n in vars(seglog)
        if not n.startswith("_") and n != "annotations" and not inspect.ismodule(getattr(seglog, n))
    }
    # Nothing public leaks in without being declared.
    assert public <= set(seglog.__all__)


def test_error_tree_is_rooted_and_split() -> None:
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.SeglogError), name
    assert issubclass(errors.InvalidTopic, errors.InvalidRecord)
    assert issubclass(errors.InvalidRecord, errors.UsageError)
    assert issubclass(errors.InvalidTimestamp, errors.InvalidRecord)
    assert issubclass(errors.StoreNotFound, errors.DatabaseNotFound)
    assert issubclass(errors.StoreLocked, errors.BusyResourceError)
    assert issubclass(errors.CorruptFrame, errors.StorageError)
    assert issubclass(errors.TierError, errors.StorageError)
    assert not issubclass(errors.OffsetOutOfRange, errors.UsageError)
    assert issubclass(errors.OutOfOrderSequence, errors.UsageError)
    assert issubclass(errors.ProducerFenced, errors.UsageError)
    e = errors.OffsetOutOfRange(5, 10, 20, shard=1)
    assert (e.offset, e.start, e.end, e.shard) == (5, 10, 20, 1)


def test_append_failed_is_a_storage_error_with_parts() -> None:
    cause = OSError(28, "No space left on device")
    e = errors.AppendFailed("x", failed={1: cause}, written={0: 5})
    assert isinstance(e, errors.StorageError) and not isinstance(e, errors.UsageError)
    assert e.failed == {1: cause} and e.written == {0: 5}


def test_the_project_does_not_claim_replication_it_lacks() -> None:
    root = Path(__file__).resolve().parent.parent
    assert "replicated" not in (seglog.__doc__ or "")
    assert "replicated" not in (root / "pyproject.toml").read_text()


def test_what_public_methods_return_is_nameable_from_the_package() -> None:
    """A type a public method returns can be imported from ``seglog`` (or a public subpackage)
    by a caller who wants to annotate with it."""
    import typing

    import seglog.tiering

    def returned(method: object) -> object:
        return typing.get_type_hints(method)["return"]

    assert typing.get_args(returned(seglog.Database.stats)) == (seglog.ShardStats,)
    assert typing.get_args(returned(seglog.Database.tier_stats)) == (seglog.TierShardStats,)
    assert seglog.tiering.TierCacheStats in typing.get_args(returned(seglog.Store.tier_cache_stats))
