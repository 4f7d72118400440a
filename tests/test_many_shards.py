"""10,000 shards under ``ulimit -n 1024``, and the descriptor cache that makes it possible."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from seglog.segment import LogSegment
from seglog.segment.fd_cache import OPEN_FILES_MAX, CachedFile, DescriptorCache, descriptors

ROOT = Path(__file__).resolve().parent.parent


def test_ten_thousand_shards_open_append_and_read_under_ulimit_1024(tmp_path: Path) -> None:
    """The child sets RLIMIT_NOFILE to 1024 first; without the cache it dies with EMFILE."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.many_shards_child", str(tmp_path / "data"), "10000", "30000"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    print(report)  # the figures the README quotes (pytest -s)
    assert report["read_records"] == 30000
    assert report["touched_shards"] > 9000  # keyed records reached almost every shard
    bound = 2 * OPEN_FILES_MAX + 64  # cached descriptors, their read mappings, the rest
    for key in ("fds_after_create", "fds_after_append", "fds_after_read"):
        assert report[key] < bound, (key, report[key])


def _file(tmp_path: Path, name: str, cache: DescriptorCache, data: bytes = b"") -> CachedFile:
    path = tmp_path / name
    path.write_bytes(data)
    return CachedFile(path, os.O_RDWR, cache=cache)


def test_cache_evicts_least_recently_used_and_reopens_on_demand(tmp_path: Path) -> None:
    cache = DescriptorCache(capacity=2)
    a, b, c = (_file(tmp_path, n, cache, n.encode()) for n in "abc")
    with a.fd():
        pass
    with b.fd():
        pass
    with a.fd():  # a is now the most recent
        pass
    with c.fd():
        pass
    assert len(cache) == 2
    assert a.is_open and c.is_open and not b.is_open
    with b.fd() as fd:  # reopened: the same file
        assert os.pread(fd, 1, 0) == b"b"
    assert not a.is_open  # evicted in turn (c was used after a)


def test_pinned_descriptor_is_never_evicted(tmp_path: Path) -> None:
    cache = DescriptorCache(capacity=1)
    a, b = _file(tmp_path, "a", cache), _file(tmp_path, "b", cache)
    with a.fd() as fd_a, b.fd():  # over capacity while a is pinned: a stays open
        assert a.is_open
        os.pwrite(fd_a, b"still mine", 0)
    assert (tmp_path / "a").read_bytes() == b"still mine"


def test_segment_written_evicted_then_synced_and_read(tmp_path: Path) -> None:
    """A write through one descriptor, an eviction, then fdatasync and a read through new ones."""
    seg = LogSegment.create(tmp_path, 0)
    seg.append([b"x" * 100])
    others = [_file(tmp_path, "o0", DescriptorCache())]  # another cache: no effect on seg
    assert seg._file.is_open
    for i in range(OPEN_FILES_MAX + 1):  # push seg's descriptor out of the process-wide cache
        f = CachedFile(tmp_path / f"f{i}", os.O_RDWR, fd=os.open(tmp_path / f"f{i}", os.O_RDWR | os.O_CREAT))
        others.append(f)
    assert not seg._file.is_open
    seg.sync()  # reopens: dirty pages belong to the inode
    assert bytes(seg.view(0, 100)) == b"x" * 100
    for f in others:
        f.close()
    seg.close()
    assert len(descriptors()) < OPEN_FILES_MAX


def test_closed_file_refuses_use(tmp_path: Path) -> None:
    f = _file(tmp_path, "a", DescriptorCache())
    f.close()
    with pytest.raises(ValueError), f.fd():
        pass


def test_concurrent_use_under_a_tiny_cache(tmp_path: Path) -> None:
    """Threads hammering more files than the cache holds: every write lands in its own file."""
    cache = DescriptorCache(capacity=3)
    files = [_file(tmp_path, f"t{i}", cache) for i in range(8)]
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for j in range(200):
                f = files[(k + j) % len(files)]
                with f.fd() as fd:
                    os.pwrite(fd, f.path.name.encode(), 0)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for f in files:
        assert f.path.read_bytes() == f.path.name.encode()
