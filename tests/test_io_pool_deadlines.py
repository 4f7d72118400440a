"""The I/O worker's deadline pass: each due writer runs once per pass, and one whose work
failed (still due) is retried later, with the queue served in between."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from seglog.io_pool.pool import DEADLINE_RETRY_S, _Deadlines


class _Writer:
    """A writer whose deadline work fails until told otherwise (its deadline stays past)."""

    def __init__(self, due: float) -> None:
        self.due: float | None = due
        self.calls = 0
        self.failing = True

    def sync_deadline(self) -> float | None:
        return self.due

    def flush_idle(self) -> None:
        self.calls += 1
        if self.calls > 100:
            raise SystemExit("the deadline pass does not return")  # not Exception: not swallowed
        if not self.failing:
            self.due = None

    def write_batch(self, items: Sequence[Any]) -> Sequence[Any]:
        return [None] * len(items)


def test_a_writer_still_due_after_its_work_waits_for_the_retry_interval() -> None:
    deadlines = _Deadlines()
    writer = _Writer(due=10.0)
    deadlines.watch(writer)
    assert deadlines.run_due(11.0) == 1  # once, not until the failure ends
    assert writer.calls == 1
    assert deadlines.wait_s(11.0) == pytest.approx(DEADLINE_RETRY_S)
    assert deadlines.run_due(11.0 + DEADLINE_RETRY_S / 2) == 0
    assert deadlines.run_due(11.0 + DEADLINE_RETRY_S) == 1 and writer.calls == 2
    writer.failing = False
    assert deadlines.run_due(11.0 + 2 * DEADLINE_RETRY_S) == 1
    assert writer.calls == 3 and deadlines.wait_s(12.0) is None  # done: nothing scheduled


def test_a_new_deadline_after_a_write_is_not_held_back_by_the_retry() -> None:
    deadlines = _Deadlines()
    writer = _Writer(due=10.0)
    deadlines.watch(writer)
    deadlines.run_due(11.0)
    writer.failing = False
    writer.due = 10.5  # a drain re-armed it (e.g. new rows): the worker watches it again
    deadlines.watch(writer)
    assert deadlines.run_due(11.0) == 1 and writer.calls == 2
