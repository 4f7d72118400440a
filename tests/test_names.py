"""Name validation: database, group and tier-key names reject control characters.

Python's ``re`` ``$`` also matches before a final ``\\n``, so an anchored ``.match`` accepted
``"evil\\n"``; every check must match the whole string.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import seglog
from seglog import errors
from seglog.db import validate_db_name
from seglog.groups import validate_group_name
from seglog.store import DBS_DIR
from seglog.tiering.parquet import object_key

NEWLINE_NAMES = ["evil\n", "a\nb", "\n", "evil\r\n", "\nevil", "evil\n\n"]
BAD_NAMES = [
    *NEWLINE_NAMES,
    "",
    "evil\r",
    "evil\t",
    "a\x00b",
    "a b",
    ".hidden",
    "-x",
    "../x",
    "a/b",
    "x" * 129,
    "é",
]
GOOD_NAMES = ["a", "A-b_c.d", "0", "x" * 128]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_validate_db_name_rejects(name: str) -> None:
    with pytest.raises(errors.InvalidName):
        validate_db_name(name)


@pytest.mark.parametrize("name", BAD_NAMES)
def test_validate_group_name_rejects(name: str) -> None:
    with pytest.raises(errors.InvalidName):
        validate_group_name(name)


@pytest.mark.parametrize("name", GOOD_NAMES)
def test_valid_names_accepted(name: str) -> None:
    assert validate_db_name(name) == name
    assert validate_group_name(name) == name


@pytest.mark.parametrize("name", ["evil\n", "a\nb", "", "evil\r", "a/b", "a\x00b"])
def test_object_key_rejects_db_name(name: str) -> None:
    with pytest.raises(errors.InvalidArgument):
        object_key(name, 0, 0, 0)


def test_object_key_accepts_valid_db_name() -> None:
    assert (
        object_key("a.b-c_d", 1, 2, 3) == "a.b-c_d/shard=1/00000000000000000002-00000000000000000003.parquet"
    )


@pytest.mark.parametrize("name", ["evil\n", "a\nb", "", "\n"])
def test_store_rejects_db_name_and_creates_nothing(run, data_dir: Path, name: str) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            before = sorted(p.name for p in (data_dir / DBS_DIR).iterdir())
            with pytest.raises(errors.InvalidName):
                await store.create_db(name)
            with pytest.raises(errors.InvalidName):
                await store.create_db(name, exist_ok=True)
            with pytest.raises(errors.InvalidName):
                await store.open_db(name)
            with pytest.raises(errors.InvalidName):
                await store.drop_db(name)
            assert sorted(p.name for p in (data_dir / DBS_DIR).iterdir()) == before
            if name:
                assert not (data_dir / DBS_DIR / name).exists()
            assert store.list_dbs() == []

    run(main())


@pytest.mark.parametrize("name", ["evil\n", "a\nb", ""])
def test_group_commit_rejects_name_and_stores_nothing(run, data_dir: Path, name: str) -> None:
    async def main() -> None:
        async with seglog.open(data_dir) as store:
            db = await store.create_db("t")
            with pytest.raises(errors.InvalidName):
                await db.commit(name, 0, 1)
            with pytest.raises(errors.InvalidName):
                await db.committed(name, 0)
            assert db._group_store().groups() == []

    run(main())


def test_parse_object_key_rejects_a_trailing_newline() -> None:
    from seglog.tiering.parquet import object_key, parse_object_key

    key = object_key("db", 1, 0, 9)
    assert parse_object_key(key) == ("db", 1, 0, 9)
    for bad in (key + "\n", "d\nb/shard=1/" + key.split("/", 2)[2]):
        with pytest.raises(errors.InvalidArgument):
            parse_object_key(bad)
