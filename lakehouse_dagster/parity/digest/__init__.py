"""The digest, pushed down: Postgres computes its side in SQL, DuckDB computes the Iceberg side over the
Parquet files of one pinned snapshot. No row becomes a Python object on the way (only per-segment
aggregates come back, and per-row hashes of small leaf ranges during localisation).

Both sides answer the same three questions about a half-open ``__row_index`` range [lo, hi):
  * ``segment_digests(lo, hi, width)``: {segment: (count, sum of hashes)} with segment = (row_index - lo) // width
    (one segment when width covers the range: the plain digest);
  * ``row_hashes(lo, hi)``: [(row_index, hash)] for a small range (the leaves of localisation);
  * ``bounds()``: (min, max) row_index.
Pinning: the Postgres side runs inside one REPEATABLE READ READ ONLY transaction opened by
``PinnedPostgres`` (the version, the digest and the localisation all see one snapshot); the Iceberg
side reads the data files listed by one snapshot id (``pin_iceberg``), so a commit landing meanwhile
changes nothing it reads.

The package: ``common`` (the digest, its segments, the snapshot keys), ``postgres`` (the Postgres side),
``iceberg`` (the Iceberg side). Callers import from here.
"""

from __future__ import annotations

from lakehouse_dagster.parity.digest.common import (
    EXPECTED_ICEBERG_TYPE,
    SOURCE_VERSION,
    SYNC_ID,
    WRITE_PATH,
    Digest,
    Segments,
    fold,
    full_digest,
    plain_digest,
    segment_plan,
)
from lakehouse_dagster.parity.digest.iceberg import IcebergPin, IcebergSide, local_path, pin_iceberg, schema_problems
from lakehouse_dagster.parity.digest.postgres import PgSide, PgState, PinnedPostgres, idle_autocommit
from lakehouse_dagster.parity.errors import DigestUnavailable

__all__ = [
    "SYNC_ID",
    "SOURCE_VERSION",
    "WRITE_PATH",
    "EXPECTED_ICEBERG_TYPE",
    "Segments",
    "DigestUnavailable",
    "Digest",
    "segment_plan",
    "fold",
    "PgState",
    "idle_autocommit",
    "PinnedPostgres",
    "PgSide",
    "IcebergPin",
    "local_path",
    "pin_iceberg",
    "IcebergSide",
    "schema_problems",
    "full_digest",
    "plain_digest",
]
