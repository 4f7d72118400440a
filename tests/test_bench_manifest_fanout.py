"""The manifest and network fan-out benchmarks run end to end (small), so they cannot rot.
No timing asserted."""

from __future__ import annotations

from pathlib import Path

from bench import manifest, net_fanout


def test_manifest_bench_quick() -> None:
    row = manifest.measure(2000, 4, 300)
    assert row["entries"] == 2000 and row["doc_kib"] > 0
    keys = (
        "load_ms",
        "save_ms",
        "upload_ms",
        "find_offset_us",
        "logical_start_us",
        "saved_upload_ms",
        "refresh_ms",
    )
    assert all(row[k] > 0 for k in keys)
    # Past the whole-document size, an upload puts a head, not the history.
    assert row["upload_tier_kib"] < row["doc_kib"] / 4
    text = manifest.render({"after": [row]}, {"after": "this tree"}, 4)
    assert "| after | 2,000 |" in text


def test_fanout_bench_quick(tmp_path: Path) -> None:
    out = tmp_path / "fanout.md"
    assert (
        net_fanout.main(["--readers", "3", "--appends", "5", "--interval-ms", "20", "--out", str(out)]) == 0
    )
    text = out.read_text()
    assert "| after | 3 |" in text
    # Three readers woken by each append: one read for the new records, the others joined it.
    row = next(line for line in text.splitlines() if line.startswith("| after | 3 |"))
    joined = float(row.strip("|").split("|")[-1])
    assert joined >= 1.0


def test_metadata_bench_quick(tmp_path: Path) -> None:
    from bench import metadata

    out = tmp_path / "metadata.md"
    assert metadata.main(["--dbs", "1,3", "--shards", "2", "--repeats", "1", "--out", str(out)]) == 0
    assert "| 3 |" in out.read_text()
