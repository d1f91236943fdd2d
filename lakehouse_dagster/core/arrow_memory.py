"""The Arrow allocator of the process that streams the most Arrow memory: `lakehouse serve`.

pyarrow's wheels default to mimalloc. A full export frees and allocates ~400 MB per 2M rows, 12 MB at a time; on
this project's 2-core VM mimalloc handed pages back and faulted them in again, so that about one export in four ran
at half speed. On jemalloc the same server ran 1.15x the rows/s in median at 0.66 instead of 0.75 CPU-s per export
(docs/benchmarks.md, "The service's allocator"). An operator's ARROW_DEFAULT_MEMORY_POOL is kept as given.
"""

from __future__ import annotations

import os

import pyarrow as pa


def prefer_jemalloc() -> str:
    """Make jemalloc the default Arrow pool of this process (unless ARROW_DEFAULT_MEMORY_POOL names one, or this
    pyarrow has none); the name of the pool in use. Call before the first Arrow allocation that matters."""
    if not os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        try:
            pa.set_memory_pool(pa.jemalloc_memory_pool())
        except NotImplementedError:  # a pyarrow built without jemalloc (Windows wheels): keep its default
            pass
    return pa.default_memory_pool().backend_name
