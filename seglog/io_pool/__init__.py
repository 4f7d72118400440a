"""I/O worker threads: shard -> worker routing, batch collection, group commit."""

from seglog.io_pool.pool import DEFAULT_IO_WORKERS, BatchWriter, IoPool, ItemError

__all__ = ["DEFAULT_IO_WORKERS", "BatchWriter", "IoPool", "ItemError"]
