"""Types of the compiled ``Record`` -> Arrow buffers pass (``_columns.c``)."""

from collections.abc import Sequence

from typing_extensions import Buffer

def gather(
    records: Sequence[object],
    record_type: type,
    max_topic_bytes: int,
    max_record_bytes: int,
    min_ts: int,
    max_ts: int,
    /,
) -> tuple[bytes, bytes, bytes, bytes, bytes, bytes, bytes | None, int, bytes, bytes | None, int] | None: ...
def check_topics(offsets: Buffer, data: Buffer, n: int, max_topic_bytes: int, /) -> bool: ...
def ts_in_range(ts: Buffer, n: int, min_ts: int, max_ts: int, /) -> bool: ...
