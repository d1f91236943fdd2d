"""Every process of the project allocates Arrow memory with jemalloc, not pyarrow's default mimalloc.

The mirror, the writers and the service free and allocate hundreds of MB of Arrow buffers in chunks of MBs. On
this project's 2-core VM mimalloc handed pages back and faulted them in again: about one full export in four ran at
half speed. On jemalloc the service exported 1.08-1.15x the rows/s in median at less CPU; under 32 clients it held
468 instead of 802 MB at its peak, with a read p99 of 272 instead of 1,189 ms; a 2M-row mirror ran 1.04x the rows/s
at 298 instead of 334 MB peak RSS (docs/benchmarks.md, "The service's allocator" and "The mirror on jemalloc").
Called by each entry point: the CLI, the code location (so the code server, the warm forkserver and its run
workers), the test suite and the benches. An operator's ARROW_DEFAULT_MEMORY_POOL is kept.
"""

from __future__ import annotations

import os
import sys


def prefer_jemalloc_on_import() -> None:
    """As prefer_jemalloc, for a process that may never load pyarrow (most CLI verbs): pyarrow takes ~0.3 s to
    import, so unless it is loaded already the choice is left in ARROW_DEFAULT_MEMORY_POOL, which Arrow reads when
    it creates its default pool (child processes inherit it and choose jemalloc all the same)."""
    if "pyarrow" in sys.modules:
        prefer_jemalloc()
    elif not os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        os.environ["ARROW_DEFAULT_MEMORY_POOL"] = "jemalloc"


def prefer_jemalloc() -> str:
    """Make jemalloc the default Arrow pool of this process (unless ARROW_DEFAULT_MEMORY_POOL names one, or this
    pyarrow has none); the name of the pool in use. Buffers allocated before keep their own pool."""
    import pyarrow as pa  # here, not at the top: the CLI imports this module for every verb

    if not os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        try:
            pa.set_memory_pool(pa.jemalloc_memory_pool())
        except NotImplementedError:  # a pyarrow built without jemalloc (Windows wheels): keep its default
            pass
    return pa.default_memory_pool().backend_name
