"""S3 retry strategies by name, for a retry count other than the default (LAKEHOUSE_S3_MAX_RETRIES).

pyiceberg builds a FileIO's retry strategy from the catalog property ``s3.retry-strategy-impl`` (``module.Name``,
called with no arguments), so the count travels in the name: ``lakehouse_dagster.lake.s3_retries.retries_2`` is
lake/storage.py's S3Retry with 2 retries. The default count keeps the name ``lake.storage.S3Retry``. A module of its
own: the ``__getattr__`` below answers any ``retries_<n>``, which would hide a misspelt name of a larger module.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from lakehouse_dagster.lake.storage import S3Retry

PREFIX = "retries_"  # lake/storage.py names them


def __getattr__(name: str) -> Callable[[], S3Retry]:
    if name.startswith(PREFIX) and name[len(PREFIX) :].isdigit():
        return partial(S3Retry, max_attempts=int(name[len(PREFIX) :]))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
