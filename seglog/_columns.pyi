"""Types of the compiled ``Record`` -> Arrow buffers pass (``_columns.c``)."""

from collections.abc import Sequence

def gather(
    records: Sequence[object],
    record_type: type,
    max_topic_bytes: int,
    max_record_bytes: int,
    min_ts: int,
    max_ts: int,
    /,
) -> tuple[bytes, bytes, bytes, bytes, bytes, bytes, bytes | None, int, bytes, bytes | None, int] | None: ...
