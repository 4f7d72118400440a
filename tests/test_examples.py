"""Every README snippet is a file under examples/, shown verbatim in the README, and runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
README = (ROOT / "README.md").read_text()
BIN = Path(sys.executable).parent
WAIT_S = 300


def fenced(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```$", README, flags=re.S | re.M)


def run(*cmd: str, cwd: Path) -> str:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=WAIT_S)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_readme_shows_every_example_file_verbatim() -> None:
    files = {p.name: p.read_text() for p in sorted(EXAMPLES.iterdir()) if p.suffix in (".py", ".sh")}
    assert set(files) == {
        "quickstart.py",
        "store_features.py",
        "tiering.py",
        "spark_read.py",
        "streams.py",
        "network_streams.py",
        "subscriptions.py",
        "generations.py",
        "cli_quickstart.sh",
    }
    python_blocks = fenced("python")
    shell_scripts = [b for b in fenced("sh") if b.startswith("#!/bin/sh\n")]
    # Every Python snippet and shell script in the README is an example file, and the other way round.
    assert sorted(python_blocks + shell_scripts) == sorted(files.values())
    for name in files:
        assert f"[`examples/{name}`](examples/{name})" in README, name


def test_examples_are_tracked_so_a_fresh_clone_has_them() -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(
        ["git", "ls-files", "examples", "README.md"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert {f"examples/{p.name}" for p in EXAMPLES.iterdir() if p.suffix in (".py", ".sh")} <= set(tracked)


def test_install_section_runs_as_written(tmp_path: Path) -> None:
    """The commands of the Install block, in a directory laid out like a fresh clone after `make venv`."""
    block = README.split("## Install", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    commands = [line for line in block.splitlines() if line.strip() and not line.startswith("make venv")]
    assert len(commands) == 2
    (tmp_path / "examples").symlink_to(EXAMPLES)
    (tmp_path / ".venv").symlink_to(BIN.parent)
    out = run("bash", "-euc", "\n".join(commands), cwd=tmp_path)
    assert "key d7: [b'21.5', b'21.7', b'21.9']" in out and "dashboards" in out
    assert (tmp_path / "data" / "seglog.json").is_file() and (tmp_path / "cli-data" / "seglog.json").is_file()


def test_quickstart(tmp_path: Path) -> None:
    out = run(
        sys.executable, str(EXAMPLES / "quickstart.py"), str(tmp_path / "data"), cwd=tmp_path
    ).splitlines()
    assert out[0] == "RecordMeta(shard=3, offset=0, ts=1767268800000000)"
    assert out[1:3] == [
        "0 sensors/s1/d7/temp b'21.5' 1767268800000000",
        "1 sensors/s1/d7/temp b'21.7' 1767268860000000",
    ]
    assert "['offset', 'ts', 'topic', 'key', 'value', 'headers', 'stream']" in out
    assert "from 12:00:30: [b'21.7', b'21.9']" in out
    assert "key d7: [b'21.5', b'21.7', b'21.9']" in out
    assert sum(line.startswith("shard ") for line in out) == 4


def test_store_features_ends(tmp_path: Path) -> None:
    out = run(sys.executable, str(EXAMPLES / "store_features.py"), str(tmp_path / "data"), cwd=tmp_path)
    assert re.search(r"^tail \d+ b'999'$", out, re.M)  # the tail was left, not waited on forever
    assert "consumed {0: 100} committed {0: 100, 1: 0}" in out and "group position on shard 0: 100" in out
    assert "live: b'new'" in out
    assert re.search(r"^freed [1-9]\d* bytes; shard 0 now starts at 300$", out, re.M)
    assert "databases: []" in out


@pytest.mark.slow
def test_tiering_then_spark(tmp_path: Path) -> None:
    out = run(sys.executable, str(EXAMPLES / "tiering.py"), str(tmp_path / "data"), cwd=tmp_path)
    assert out.count("tiered telemetry/shard=") == 2
    assert "read through the tier: [(0, b'1'), (1, b'3')]" in out
    tier = out.strip().splitlines()[-1].removeprefix("tier: ")
    assert tier == (tmp_path / "data-tier").as_uri()
    out = run(sys.executable, str(EXAMPLES / "spark_read.py"), tier, cwd=tmp_path)
    assert "['offset', 'ts', 'topic', 'key', 'value', 'headers', 'stream', 'shard']" in out
    assert "shard 0 sensors/s1/temp: 50 records below offset 100" in out
    assert out.count("records below offset 100") == 4


def test_cli_quickstart(tmp_path: Path) -> None:
    out = run("sh", str(EXAMPLES / "cli_quickstart.sh"), str(tmp_path / "data"), cwd=tmp_path)
    lines = out.splitlines()
    assert lines[0].startswith('{"shard": 0, "offset": 0, ') and '"value": "1"' in lines[0]
    assert "21.5" in lines  # consume --shard 3 --format raw
    after = lines.index("21.5") + 1
    assert lines[after : after + 4] == ["1", "2", "3", "4"]  # consume --topic 'sensors/+/temp' --max 4
    assert any(line.startswith("dashboards") for line in lines) and "telemetry" in out


def test_streams_example(tmp_path: Path) -> None:
    out = run(sys.executable, str(EXAMPLES / "streams.py"), str(tmp_path / "data"), cwd=tmp_path).splitlines()
    assert out[0] == "['north/+/temp', 'north/+/temp']"
    assert out[-2] == "iterator bytes: [54, 54]"
    assert out[-1] == "the rest after a restart: 30"


def test_network_streams_example(tmp_path: Path) -> None:
    out = run(
        sys.executable, str(EXAMPLES / "network_streams.py"), str(tmp_path / "data"), cwd=tmp_path
    ).splitlines()
    assert out == ["2 streams, 50 records, 50 topics", "the long poll woke with: [b'21.5']"]


def test_generations_example(tmp_path: Path) -> None:
    out = run(
        sys.executable, str(EXAMPLES / "generations.py"), str(tmp_path / "data"), cwd=tmp_path
    ).splitlines()
    assert out[0] == "[(1, 'car/0/speed'), (1, 'car/1/speed'), (1, 'car/+/speed'), (2, 'car/+/speed')]"
    assert out[1:3] == ["generation 1 [b'2', b'3', b'4']", "generation 1 []"]
    assert out[3] == "[(1, (0,), (5,), False), (2, (5,), None, False)]"
    assert out[4] == "dropped generation 1; shard 0 starts at 5 = 5"
    assert out[5].startswith("GenerationDropped: generation 1 was dropped")


def test_subscriptions_example(tmp_path: Path) -> None:
    out = run(
        sys.executable, str(EXAMPLES / "subscriptions.py"), str(tmp_path / "data"), cwd=tmp_path
    ).splitlines()
    assert sorted(out[:3]) == [f"sub{i} got 100 records, last: plant1/dev1/alarm b'99'" for i in range(3)]
    words = out[3].split()
    assert words[:2] == ["stream", "reads:"] and words[3:] == ["for", "300", "deliveries"]
    assert int(words[2]) <= 100 + 2  # not one per subscriber
