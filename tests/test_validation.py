from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

import seglog
from seglog import errors
from tests.helpers import segment_files

BAD = [
    (seglog.Record(topic="", value=b"x"), errors.InvalidTopic),
    (seglog.Record(topic="a/+/b", value=b"x"), errors.InvalidTopic),
    (seglog.Record(topic="a/#", value=b"x"), errors.InvalidTopic),
    (seglog.Record(topic="a\x00b", value=b"x"), errors.InvalidTopic),
    (seglog.Record(topic="a" * 65536, value=b"x"), errors.InvalidTopic),
    (seglog.Record(topic=b"bytes-topic", value=b"x"), errors.InvalidTopic),  # type: ignore[arg-type]
    (seglog.Record(topic="a", value="not bytes"), errors.InvalidValue),  # type: ignore[arg-type]
    (seglog.Record(topic="a", value=None), errors.InvalidValue),  # type: ignore[arg-type]
    (seglog.Record(topic="a", value=b"x" * (1024 + 1)), errors.RecordTooLarge),
    (seglog.Record(topic="a", value=b"x", key="str-key"), errors.InvalidKey),  # type: ignore[arg-type]
    (seglog.Record(topic="a", value=b"x", headers={"h": "str"}), errors.InvalidHeaders),  # type: ignore[dict-item]
    (seglog.Record(topic="a", value=b"x", ts="now"), errors.InvalidRecord),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("bad", "exc"), BAD, ids=[type(b).__name__ + str(i) for i, (b, _) in enumerate(BAD)])
def test_invalid_record_raises_and_writes_nothing(run, data_dir: Path, bad: seglog.Record, exc: type) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t", shards=2, max_record_bytes=1024)
            await db.append([seglog.Record(topic="ok", value=b"first")], shard=0)
            sizes = [f.stat().st_size for s in (0, 1) for f in segment_files(data_dir, "t", s)]
            good = [seglog.Record(topic="ok", value=b"v", key=b"k") for _ in range(5)]
            with pytest.raises(exc) as ei:
                await db.append([*good, bad, *good])
            assert ei.value.index == 5
            assert [db.end_offset(s) for s in (0, 1)] == [1, 0]
            assert [f.stat().st_size for s in (0, 1) for f in segment_files(data_dir, "t", s)] == sizes

    run(main())


def test_invalid_arrow_columns(run, data_dir: Path) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t")
            with pytest.raises(errors.InvalidTopic):
                await db.append_arrow(pa.table({"topic": ["a/+"], "value": [b"x"]}))
            with pytest.raises(errors.InvalidValue):
                await db.append_arrow(pa.table({"topic": ["a"], "value": ["str"]}))
            with pytest.raises(errors.InvalidRecord):
                await db.append_arrow(pa.table({"topic": ["a"]}))
            with pytest.raises(errors.InvalidRecord):
                await db.append_arrow(pa.table({"topic": ["a"], "value": [b"x"], "bogus": [1]}))
            with pytest.raises(errors.InvalidArgument):
                await db.append_arrow([{"topic": "a"}])  # type: ignore[arg-type]
            assert db.end_offset(0) == 0

    run(main())
