"""Concurrency guards that hold across processes (Dagster runs are processes), built on Postgres
advisory locks held by a session: a killed process's locks vanish with its connection.

G1 (catalog commits serialised) is the SqlCatalog's compare-and-swap; G4 (commit conflicts retry)
lives in iceberg/writer.py. Here: G3, one ingest per dataset at a time (blocking, queued), and G2, at
most ``max_concurrent_ingest`` ingests at once (non-blocking: a caller past the bound gets
Backpressure and retries later — the runbook's healthy 503).
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Iterator

import psycopg

from ..errors import Backpressure, SyncFailed

_NS_DATASET = 0x1A4E_0100  # G3: (namespace, hash of dataset id)
_NS_ADMISSION = 0x1A4E_0200  # G2: (namespace, slot number)


def _dataset_key(dataset_id: uuid.UUID) -> int:
    # 32-bit signed int from the uuid (advisory lock keys are int4 pairs)
    return int.from_bytes(dataset_id.bytes[:4], "big", signed=True)


@contextlib.contextmanager
def dataset_lock(conn: psycopg.Connection, dataset_id: uuid.UUID, *, timeout_s: float = 1800) -> Iterator[None]:
    """G3: same-dataset ingests serialise (a second waits for the first)."""
    key = _dataset_key(dataset_id)
    conn.execute("select set_config('lock_timeout', %s, false)", (f"{int(timeout_s * 1000)}ms",))
    try:
        conn.execute("select pg_advisory_lock(%s, %s)", (_NS_DATASET, key))
    except psycopg.errors.LockNotAvailable:
        raise SyncFailed(
            f"dataset {dataset_id}: another sync of this dataset held the lock for over {timeout_s:.0f}s; "
            "check iceberg_sync_log for a wedged run"
        ) from None
    finally:
        conn.execute("select set_config('lock_timeout', '0', false)")
    try:
        yield
    finally:
        conn.execute("select pg_advisory_unlock(%s, %s)", (_NS_DATASET, key))


@contextlib.contextmanager
def admission_slot(conn: psycopg.Connection, max_concurrent: int) -> Iterator[int]:
    """G2: take one of ``max_concurrent`` slots or raise Backpressure at once."""
    for slot in range(max_concurrent):
        if conn.execute("select pg_try_advisory_lock(%s, %s)", (_NS_ADMISSION, slot)).fetchone()[0]:
            try:
                yield slot
            finally:
                conn.execute("select pg_advisory_unlock(%s, %s)", (_NS_ADMISSION, slot))
            return
    raise Backpressure(
        f"all {max_concurrent} ingest slots are busy (LAKEHOUSE_MAX_CONCURRENT_INGEST); retry later or raise the bound"
    )
