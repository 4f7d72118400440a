"""Jepsen's queue checks over a cluster test's history (tests/test_cluster_faults.py, tests/test_cluster_etcd_restart.py).

The history is what a client saw: values acknowledged at an offset, values refused before
writing, values whose outcome it could not know, and (optionally) what a consumer read; the
result is the healed shard's log as its leader serves it and each replica's copy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def check_queue(
    final: list[tuple[int, bytes]],
    logs: Mapping[int, list[tuple[int, bytes]]],
    acked: Mapping[str, int],
    refused: Iterable[str],
    unknown: Iterable[str],
    consumed: Iterable[tuple[int, bytes]] = (),
    *,
    min_acked: int = 50,
) -> dict[str, list[int]]:
    """Assert the checks; return where each value of the final log sits (value -> offsets).

    * lost-write: every acknowledged value is in the final log;
    * duplicate: no value sits at two offsets;
    * inconsistent-offsets: an acknowledged value sits exactly at its acknowledged offset;
    * G1a: a value refused before writing never appears;
    * no value appears that nobody sent (acknowledged or unknown);
    * nonmonotonic-poll / truncated reads: the consumer saw offsets in increasing order, each
      holding the value the final log holds there (nothing it read was later truncated);
    * every replica's log starts with the final log, byte for byte.
    """
    where: dict[str, list[int]] = {}
    for offset, v in final:
        where.setdefault(v.decode(), []).append(offset)
    by_offset = dict(final)
    lost = [v for v in acked if v not in where]
    duplicated = {v: o for v, o in where.items() if len(o) > 1}
    inconsistent = {v: (o, where[v]) for v, o in acked.items() if v in where and where[v] != [o]}
    g1a = [v for v in refused if v in where]
    seen = list(consumed)
    truncated_reads = [(o, v) for o, v in seen if by_offset.get(o) != v]
    offsets = [o for o, _ in seen]
    assert len(acked) > min_acked, f"too few acknowledged sends to mean anything: {len(acked)}"
    assert not lost, (
        f"lost-write: {[(v, acked[v], by_offset.get(acked[v])) for v in lost[:10]]} of {len(acked)} "
        f"acknowledged; log {len(final)}"
    )
    assert not duplicated, f"duplicate: {list(duplicated.items())[:5]}"
    assert not inconsistent, f"inconsistent-offsets: {list(inconsistent.items())[:5]}"
    assert not g1a, f"G1a (refused but visible): {g1a[:10]}"
    assert set(where) <= set(acked) | set(unknown), "a value nobody sent"
    assert not truncated_reads, f"the consumer read records later truncated: {truncated_reads[:5]}"
    assert offsets == sorted(set(offsets)), "the consumer saw an offset twice or went back"
    for i, log in logs.items():
        assert log[: len(final)] == final, f"node {i} diverges"
    return where
