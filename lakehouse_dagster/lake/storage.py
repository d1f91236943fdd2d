"""Where a table's files live: the FileIO properties the catalog hands pyiceberg, and the table's own filesystem for
the listings pyiceberg has no call for (the orphan sweep, the reaper, the fault tests' oracle).

A warehouse may be local (``file://``) or on an S3-compatible store (``s3://bucket/prefix``; LAKEHOUSE_S3_ENDPOINT for
one that is not AWS). pyiceberg's PyArrowFileIO builds pyarrow's S3FileSystem from the catalog's properties
(pyiceberg/io/__init__.py names them); what it is not given it looks up: no region, and it asks AWS for the bucket's
(a request to AWS even for a MinIO bucket); no endpoint, and it talks to AWS. Credentials are left to the AWS SDK's
default chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_SESSION_TOKEN, a profile, an instance role): passing them
as properties would freeze a session token the chain refreshes.
"""

from __future__ import annotations

from pyarrow import fs as pafs
from pyiceberg.io import S3_CONNECT_TIMEOUT, S3_ENDPOINT, S3_REGION, S3_REQUEST_TIMEOUT, S3_RETRY_STRATEGY_IMPL
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.table import Table

from lakehouse_dagster.core.settings import S3Settings

# Retries of one S3 request after its first attempt. A 503 SlowDown or 500 InternalError is S3 asking for a retry, and
# so is a request timed out. pyarrow's default (the SDK's "standard" strategy, 3 attempts, backoff from 1 s up to 20 s)
# failed a sync on a store answering 503 to 30% of requests and took ~60 s to give up on one failing everything; the
# SDK's "default" strategy backs off 25 ms doubling per retry: 8 retries wait 6.4 s in all, then the error surfaces.
# The default of LAKEHOUSE_S3_MAX_RETRIES (core/settings/storage.py); another count is built by lake/s3_retries.py.
S3_MAX_RETRIES = 8


class S3Retry(pafs.AwsDefaultS3RetryStrategy):
    """The AWS SDK's default retry strategy with S3_MAX_RETRIES retries (pyarrow passes its ``max_attempts`` to the
    SDK as the retry count); pyiceberg builds it by name with no arguments (``s3.retry-strategy-impl``), hence a
    class."""

    def __init__(self, max_attempts: int = S3_MAX_RETRIES):
        super().__init__(max_attempts=max_attempts)


def file_io_properties(s3: S3Settings) -> dict[str, str]:
    """Catalog properties for the tables' FileIO: the S3 endpoint, region, timers and retries (only s3:// uses them)."""
    props = {
        S3_CONNECT_TIMEOUT: str(s3.connect_timeout_seconds),
        S3_REQUEST_TIMEOUT: str(s3.request_timeout_seconds),
        S3_RETRY_STRATEGY_IMPL: _retry_strategy_name(s3.max_retries),
    }
    if s3.endpoint:
        endpoint = s3.endpoint
        props[S3_ENDPOINT] = endpoint if "://" in endpoint else "https://" + endpoint
    if s3.region:
        props[S3_REGION] = s3.region
    elif s3.endpoint:
        props[S3_REGION] = "us-east-1"  # an S3-compatible store ignores it; unset, pyiceberg would ask AWS
    return props


def _retry_strategy_name(max_retries: int) -> str:
    if max_retries == S3_MAX_RETRIES:
        return f"{S3Retry.__module__}.{S3Retry.__qualname__}"
    return f"{__package__}.s3_retries.retries_{max_retries}"  # lake/s3_retries.py (it imports this module)


def table_filesystem(table: Table, location: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem of the table's FileIO (its endpoint, region, timers and retries) and ``location``'s path in it.
    ``pafs.FileSystem.from_uri`` would build a bare S3 client instead: AWS's endpoint, pyarrow's defaults."""
    io = table.io
    if isinstance(io, PyArrowFileIO):
        scheme, netloc, path = io.parse_location(location)
        return io.fs_by_scheme(scheme, netloc), path
    return pafs.FileSystem.from_uri(location)


def is_object_store(location: str) -> bool:
    return location.split("://", 1)[0].lower() in ("s3", "s3a", "s3n")
