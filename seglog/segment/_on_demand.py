"""A queue of distinct items served one at a time by a thread that runs only while some are
queued: background work (journal growth, segment writeback) that costs an idle store no thread."""

from __future__ import annotations

import abc
import threading
from collections.abc import Iterable
from typing import Generic, TypeVar

__all__ = ["OnDemandThread"]

T = TypeVar("T")


class OnDemandThread(abc.ABC, Generic[T]):
    """Serves queued items in turn (:meth:`_serve`) on a daemon thread started by
    :meth:`_enqueue` and gone when the queue is empty.

    Args:
        name: The thread's name.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._cond = threading.Condition()
        self._queue: dict[T, None] = {}  # insertion-ordered set: the turn order
        self._thread: threading.Thread | None = None
        self._closed = False

    def _enqueue(self, items: Iterable[T]) -> None:
        """Queue ``items`` (one already queued keeps its turn); no-op once closed."""
        with self._cond:
            if self._closed:
                return
            for item in items:
                self._queue[item] = None
            if self._queue and self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()

    @abc.abstractmethod
    def _serve(self, item: T) -> bool:
        """(Thread) Do one turn of ``item``'s work; return whether it wants another turn."""

    @property
    def busy(self) -> bool:
        """Whether the thread is running (items queued or in service)."""
        with self._cond:
            return self._thread is not None

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until nothing is queued or in service; return whether it came within ``timeout``."""
        with self._cond:
            return self._cond.wait_for(lambda: self._thread is None, timeout)

    def close(self) -> None:
        """Drop what is queued and wait for the item in service; idempotent."""
        with self._cond:
            self._closed = True
            self._queue.clear()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._closed or not self._queue:
                    self._thread = None
                    self._cond.notify_all()
                    return
                item = next(iter(self._queue))
                del self._queue[item]
            if self._serve(item):
                with self._cond:
                    if not self._closed:
                        self._queue.setdefault(item, None)
