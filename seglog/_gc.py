"""Pausing the cyclic garbage collector while many acyclic objects are built.

Used where seglog builds objects in bulk that can never be part of a cycle: ``Record``
objects from a read (``seglog.record.records_from_table``) and the entries of a tier
manifest being loaded (``seglog.tiering.manifest``).
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator
from typing import Final

__all__ = ["gc_paused"]

_gc_lock = threading.Lock()
_gc_pausers = 0
_gc_resume = False
# Smaller conversions trigger at most one young collection: not worth taking the lock.
_GC_PAUSE_MIN: Final = 512


@contextlib.contextmanager
def gc_paused(n: int) -> Iterator[None]:
    """Hold the cyclic garbage collector while ``n`` acyclic objects are allocated, then file
    them straight into the oldest generation.

    Every record is a GC-tracked object (any instance of a Python class is), so without the
    pause a large read pays for repeated young-generation passes over the records it is
    building. Pausing alone is not enough: records the caller still holds when the next
    young collections run are promoted through generation 1, and every object promoted that
    way counts toward CPython's full-collection trigger (a full pass once the promoted count
    exceeds a quarter of the old generation). A consumer reading 10,000-record pages then
    pays a pass over its whole heap every few pages, 60-170 ms each with the peer bench's
    4 M-element workload lists alive, which made ``read`` 2-3x slower than the conversion
    itself. Records hold only str/bytes/int/None and header dicts of str -> bytes, so they
    can never be part of a cycle and scanning them is wasted work: when the pause ends,
    ``gc.freeze()`` + ``gc.unfreeze()`` (two O(1) list splices) move them, untouched, to the
    oldest generation without counting them as promoted. A generation-1 collection at the
    start keeps the accounting honest for everything else: whatever the application
    allocated before the read is collected, or promoted and counted, as it would have been;
    only objects allocated during the pause (the records, the column lists, whatever other
    threads allocate meanwhile) skip the young generations. An application that froze objects
    itself (``gc.get_freeze_count() > 0``, e.g. before ``fork``) keeps its permanent
    generation: the move is skipped and the records age normally.

    Pausing is refcounted across threads (overlapping conversions on several threads
    re-enable it once, when the last one ends) and restores the state found by the first: a
    collector the application had disabled stays disabled, and is neither run nor used to
    move anything. The one thing it cannot see is the application itself calling
    ``gc.disable()`` on another thread during a pause: that is undone when the pause ends.
    """
    global _gc_pausers, _gc_resume
    if n < _GC_PAUSE_MIN:
        yield
        return
    if gc.isenabled():  # not paused by another thread, not disabled by the application
        gc.collect(1)
    with _gc_lock:
        if _gc_pausers == 0:
            _gc_resume = gc.isenabled()
            gc.disable()
        _gc_pausers += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pausers -= 1
            if _gc_pausers == 0 and _gc_resume:
                if gc.get_freeze_count() == 0:
                    gc.freeze()
                    gc.unfreeze()
                gc.enable()
