"""The write router: a writer's mode for a dataset (clamped), and fail-loud native writes.

``pg``: the caller's Postgres write runs (the mirror copies it to Iceberg later).
``iceberg_native``: the Iceberg write — a callable, so the CLI, the ops and the tests inject the
real chunked writer — runs under an ``iceberg_sync_log`` row (path native). If it fails, the
sync is recorded failed, the dataset is marked errored and SyncFailed is raised: dataset_rows is
never written after an Iceberg attempt (no silent split-brain), and the sync retries.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from typing import Any, Callable, Iterable, Protocol, TypeVar

import psycopg

from ..errors import BadInput, NotFound, SyncFailed
from ..flags.registry import WRITE, get_flag
from ..flags.resolver import FlagResolver, Resolution
from ..ids import parse_uuid
from ..ingest.guards import admission_slot, dataset_lock
from ..settings import Settings

log = logging.getLogger("lakehouse_dagster.write_router")

T = TypeVar("T")


class NativeWriteResult(Protocol):
    """What iceberg/writer.py's WriteResult provides."""

    snapshot_id: int | None
    rows: int


@dataclasses.dataclass(frozen=True)
class WriteDecision:
    writer: str
    dataset_id: uuid.UUID
    flag: Resolution

    @property
    def native(self) -> bool:
        return self.flag.mode == "iceberg_native"

    def log_line(self) -> str:
        return f"[write-router] {self.writer} ds={self.dataset_id} mode={self.flag.describe()}"


@dataclasses.dataclass(frozen=True)
class WriteOutcome:
    decision: WriteDecision
    value: Any  # the pg write's return value, or the native WriteResult
    sync_id: uuid.UUID | None = None  # native path only


def resolve_write_path(flags: FlagResolver, writer: str, dataset_id: uuid.UUID | str) -> WriteDecision:
    dataset_id = parse_uuid(dataset_id, "dataset id")
    return WriteDecision(writer, dataset_id, flags.resolve(WRITE, writer, dataset_id))


def route_write(
    conn: psycopg.Connection,
    flags: FlagResolver,
    writer: str,
    dataset_id: uuid.UUID | str,
    *,
    pg_write: Callable[[], T],
    iceberg_write: Callable[[uuid.UUID, int], NativeWriteResult],
    settings: Settings | None = None,
    logger: logging.Logger | logging.LoggerAdapter | None = None,
    sync_id: uuid.UUID | None = None,
) -> WriteOutcome:
    """Run ``pg_write()`` or ``iceberg_write(sync_id, source_version)`` as the writer's mode says.

    ``conn`` must be autocommit (store.db.connect): the failure bookkeeping must persist while the error
    propagates. ``settings`` gives the G2 bound (default: from the environment). ``sync_id``: a retry
    passes its first attempt's id, so the native writer finds its own commit instead of appending twice.
    """
    lg = logger or log
    decision = resolve_write_path(flags, writer, dataset_id)
    lg.info(decision.log_line())
    if not decision.native:
        return WriteOutcome(decision, pg_write())
    settings = settings or Settings.from_env()
    return _write_native(conn, decision, iceberg_write, settings.max_concurrent_ingest, lg, sync_id)


def _write_native(conn, decision: WriteDecision, iceberg_write, max_concurrent: int, lg, sync_id=None) -> WriteOutcome:
    # G3 then G2 on this session (advisory locks are re-entrant per session, so a caller that already
    # holds them on the same connection is fine): a concurrent mirror sync of the dataset neither runs
    # beside us nor reaps our 'running' row. Backpressure is raised before anything is recorded.
    with dataset_lock(conn, decision.dataset_id), admission_slot(conn, max_concurrent):
        return _write_native_locked(conn, decision, iceberg_write, lg, sync_id)


def _write_native_locked(conn, decision: WriteDecision, iceberg_write, lg, sync_id=None) -> WriteOutcome:
    ds, sync_id = decision.dataset_id, sync_id or uuid.uuid4()
    flag = get_flag(WRITE, decision.writer)
    # PG is not written on this path, so the snapshot covers the dataset's current rows_version.
    row = conn.execute(
        "insert into iceberg_sync_log (dataset_id, sync_id, writer, path, mode, status, source_version)"
        " select id, %s, %s, 'native', %s, 'running', rows_version from datasets where id = %s"
        " on conflict (sync_id) do update set status = 'running', error = null, finished_at = null,"
        " started_at = now() returning source_version",
        (sync_id, decision.writer, flag.iceberg_mode, ds),
    ).fetchone()
    if row is None:
        raise NotFound(f"dataset {ds} does not exist (check the id); nothing was written")
    source_version = row[0]
    try:
        result = iceberg_write(sync_id, source_version)
    except BaseException as exc:
        error = " ".join(f"{type(exc).__name__}: {exc}".split())
        _record_failure(conn, ds, sync_id, error)
        lg.error(f"iceberg_native write failed: {ds} ({decision.writer}, sync {sync_id}): {error}")
        if not isinstance(exc, Exception):
            raise
        raise SyncFailed(
            f"{decision.writer} ds={ds}: iceberg_native write failed ({error}); the dataset is marked errored and "
            f"nothing was written to dataset_rows — fix the cause and re-run the sync"
        ) from exc
    rows = int(getattr(result, "rows", 0) or 0)
    total = getattr(result, "total_rows", None)  # rows in the table after the commit, when the writer knows
    snapshot_id = getattr(result, "snapshot_id", None)
    with conn.transaction():
        # rows = rows in the table after the commit, as the mirror records it
        conn.execute(
            "update iceberg_sync_log set status = 'succeeded', rows = coalesce(%s, %s), bytes = %s,"
            " snapshot_id = %s, has_identity = true, finished_at = now() where sync_id = %s",
            (total, rows, getattr(result, "bytes", None), snapshot_id, sync_id),
        )
        conn.execute(
            "update datasets set status = 'ready', error = null, updated_at = now(),"
            " row_count = coalesce(%s, case when %s = 'replace' then %s else coalesce(row_count, 0) + %s end)"
            " where id = %s",
            (total, flag.iceberg_mode, rows, rows, ds),
        )
    lg.info(f"iceberg_native: {ds} ({rows} rows → snapshot {snapshot_id})")
    return WriteOutcome(decision, result, sync_id)


def _record_failure(conn: psycopg.Connection, dataset_id: uuid.UUID, sync_id: uuid.UUID, error: str) -> None:
    with conn.transaction():
        conn.execute(
            "update iceberg_sync_log set status = 'failed', error = %s, finished_at = now() where sync_id = %s",
            (error, sync_id),
        )
        conn.execute(
            "update datasets set status = 'errored', error = %s, updated_at = now() where id = %s",
            (error, dataset_id),
        )


def native_write(
    catalog, settings, dataset, batches: Iterable, *, writer: str
) -> Callable[[uuid.UUID, int], NativeWriteResult]:
    """The real native write for ``route_write``: iceberg/writer.py's chunked ``write_arrow``, in the
    writer's registry mode (sync.full replaces the table, the others append)."""
    mode = get_flag(WRITE, writer).iceberg_mode
    if mode is None:
        raise BadInput(f"writer {writer} is locked to pg; it has no native write")
    from ..iceberg.writer import write_arrow  # the mirror's chunked writer (owned by the ingest area)

    def _write(sync_id: uuid.UUID, source_version: int):
        return write_arrow(
            catalog, settings, dataset, batches, mode=mode, sync_id=sync_id, source_version=source_version,
            path="native",
        )

    return _write
