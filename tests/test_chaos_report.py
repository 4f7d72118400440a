"""``make chaos`` keeps every run's report: a later run of the same day gets a new name."""

from __future__ import annotations

from pathlib import Path

from tests.chaos import _unused_report_path


def test_a_second_run_of_the_day_does_not_replace_the_first_report(tmp_path: Path) -> None:
    first = _unused_report_path(tmp_path, "chaos-2026-11-26")
    assert first.name == "chaos-2026-11-26.md"
    first.write_text("first run")
    second = _unused_report_path(tmp_path, "chaos-2026-11-26")
    assert second.name == "chaos-2026-11-26-2.md"
    second.write_text("second run")
    assert _unused_report_path(tmp_path, "chaos-2026-11-26").name == "chaos-2026-11-26-3.md"
    assert first.read_text() == "first run"
