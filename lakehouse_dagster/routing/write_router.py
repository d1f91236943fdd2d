"""The write router: a writer's mode for a dataset (clamped), and fail-loud native writes.

``pg``: the caller's Postgres write runs (the mirror copies it to Iceberg later).
``iceberg_native``: refused (FlipRefused, recorded, nothing written) when the dataset fails the write-flip
gates that still apply to it (native_guard.py); otherwise the Iceberg write — a callable, so the CLI, the
ops and the tests inject the real chunked writer — runs under an ``iceberg_sync_log`` row (path native).
If it fails, the sync is recorded failed, the dataset is marked errored and SyncFailed is raised: dataset_rows is
never written after an Iceberg attempt (no silent split-brain), and the sync retries.

Failure paths follow the mirror's (mirror/sync.py): SyncFailed carries ``transient`` (errors.is_transient);
a commit of unknown outcome is recorded as unsettled and its files kept; an interruption (Ctrl-C,
SIGTERM, a run termination) is not a data error — the row says what the table says (succeeded if the
commit landed) and the dataset is not marked errored; the next native write of the dataset, under the
dataset lock, settles what a killed one left (mirror/reaper.py) when it knows the catalog.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

import psycopg

from lakehouse_dagster.core.errors import (
    BadInput,
    DiskFull,
    GuardLost,
    NotFound,
    SyncFailed,
    commit_outcome_unknown,
    first_line,
    is_transient,
)
from lakehouse_dagster.core.failpoints import failpoint
from lakehouse_dagster.core.failpoints import validate as validate_failpoints
from lakehouse_dagster.core.guards import admission_slot, dataset_lock
from lakehouse_dagster.core.ids import parse_uuid
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.flags.lifecycle_facts import lifecycle_of
from lakehouse_dagster.flags.registry import WRITE, get_flag
from lakehouse_dagster.flags.resolver import FlagResolver, Resolution
from lakehouse_dagster.lake.catalog import load_table_or_none, table_identifier
from lakehouse_dagster.lake.writer import (
    TableWrite,
    files_left,
    snapshot_source_version,
    sync_snapshot,
    table_state,
)
from lakehouse_dagster.lifecycle import ICEBERG, check_authority, write_hold
from lakehouse_dagster.mirror.reaper import UNSETTLED, reap_abandoned
from lakehouse_dagster.parity.write_digests import write_digested
from lakehouse_dagster.routing.native_guard import refuse_unsafe_native_write
from lakehouse_dagster.routing.native_table import write_native_table
from lakehouse_dagster.tracking import barrier, sync_log
from lakehouse_dagster.tracking.datasets import stamps

log = logging.getLogger("lakehouse_dagster.write_router")

T = TypeVar("T")


class NativeWriteResult(Protocol):
    """What lake/writer.py's WriteResult provides."""

    @property
    def snapshot_id(self) -> int | None: ...

    @property
    def rows(self) -> int: ...


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
    catalog: Any = None,
    sync_id: uuid.UUID | None = None,
    run_id: str | None = None,
) -> WriteOutcome:
    """Run ``pg_write()`` or ``iceberg_write(sync_id, source_version)`` as the writer's mode says.

    ``conn`` must be autocommit (store.db.connect): the failure bookkeeping must persist while the error
    propagates. ``settings`` gives the G2 bound (default: from the environment). ``catalog`` (default:
    the one ``native_write`` carries) lets the write settle abandoned syncs and interruptions. ``sync_id``: a
    retry passes its first attempt's id, so the native writer finds its own commit instead of appending twice.
    ``run_id``: the Dagster run writing, kept on the sync log row (the recorder leaves a run's own
    materialization to it: status/recording.py).
    """
    lg = logger or log
    validate_failpoints()
    decision = resolve_write_path(flags, writer, dataset_id)
    lg.info(decision.log_line())
    if not decision.native:
        return WriteOutcome(decision, pg_write())
    catalog = catalog if catalog is not None else getattr(iceberg_write, "catalog", None)
    return route_native(
        conn, decision, iceberg_write, settings=settings, logger=lg, catalog=catalog, sync_id=sync_id, run_id=run_id
    )


def route_native(
    conn: psycopg.Connection,
    decision: WriteDecision,
    iceberg_write: Callable[[uuid.UUID, int], NativeWriteResult],
    *,
    settings: Settings | None = None,
    logger: logging.Logger | logging.LoggerAdapter | None = None,
    catalog: Any = None,
    sync_id: uuid.UUID | None = None,
    run_id: str | None = None,
) -> WriteOutcome:
    """route_write's native half, for a caller that resolved (and logged) ``decision`` itself and planned its
    write on it (sources/writers.py): the flip gates, then ``iceberg_write(sync_id, source_version)`` under
    G3 + G2 and its ``iceberg_sync_log`` row, fail-loud. Arguments as route_write's (``catalog``: None does
    not default to the one ``iceberg_write`` carries)."""
    lg = logger or log
    # The flip gates that still apply to the dataset (native_guard.py): a dataset covered natively after the
    # flip (a new or moved dataset, a new pipeline input, a reader lowered by hand) is refused, loud.
    refuse_unsafe_native_write(
        conn,
        decision.writer,
        decision.dataset_id,
        iceberg_mode=get_flag(WRITE, decision.writer).iceberg_mode,
        sync_id=sync_id,
        logger=lg,
    )
    settings = settings or Settings.from_env()
    return _write_native(conn, decision, iceberg_write, settings, catalog, lg, sync_id, run_id)


def _write_native(
    conn, decision: WriteDecision, iceberg_write, settings: Settings, catalog, lg, sync_id=None, run_id=None
) -> WriteOutcome:
    # G3 then G2 on this session (advisory locks are re-entrant per session, so a caller that already
    # holds them on the same connection is fine): a concurrent mirror sync of the dataset neither runs
    # beside us nor reaps our 'running' row. Backpressure is raised before anything is recorded.
    with (
        dataset_lock(conn, decision.dataset_id),
        admission_slot(conn, settings.sync.max_concurrent),
        write_hold(conn, decision.dataset_id),
    ):
        # Iceberg must be the dataset's truth, under the lifecycle lock held until the commit is recorded: a flag
        # read from a cache that lags a rollback would write rows the forward mirror then overwrites
        facts = lifecycle_of(conn, [decision.dataset_id]).get(decision.dataset_id)
        check_authority(facts, decision.dataset_id, target=ICEBERG, writer=decision.writer)
        if catalog is not None:
            reap_abandoned(conn, catalog, settings, decision.dataset_id)
        return _write_native_locked(conn, decision, iceberg_write, settings, catalog, lg, sync_id, run_id)


def _write_native_locked(
    conn, decision: WriteDecision, iceberg_write, settings, catalog, lg, sync_id=None, run_id=None
) -> WriteOutcome:
    ds, sync_id = decision.dataset_id, sync_id or uuid.uuid4()
    flag = get_flag(WRITE, decision.writer)
    # PG is not written on this path, so the snapshot covers the dataset's current rows_version (in capture
    # mode after-commit once the consumer has applied every write committed before now). The insert below may
    # write the datasets row (the sync log's triggers): never behind the barrier, so it lets go first.
    with barrier.read_tracking_consistently(conn, [ds]) as tracking:
        tracking.let_go()
    row = sync_log.start_native(conn, ds, sync_id, decision.writer, flag.iceberg_mode, run_id)
    if row is None:
        raise NotFound(f"dataset {ds} does not exist (check the id); nothing was written")
    source_version = row[0]
    try:
        result = iceberg_write(sync_id, source_version)
    except BaseException as exc:
        if not isinstance(exc, Exception):
            _settle_interrupted(conn, ds, sync_id, catalog, settings, exc, lg)
            raise
        error = " ".join(f"{type(exc).__name__}: {exc}".split())
        if commit_outcome_unknown(exc) is not None:  # also when a later error (a cleanup's) is the one raised
            error = UNSETTLED + error
        elif left := files_left(exc):  # not committed, files of it still stored: the next write removes them
            error = (
                f"{UNSETTLED}{error}; {left} data file(s) it wrote could not be deleted (the next write removes them)"
            )
        _record_failure(conn, ds, sync_id, error, errored=not isinstance(exc, GuardLost), lg=lg)
        lg.error(f"iceberg_native write failed: {ds} ({decision.writer}, sync {sync_id}): {error}")
        err = (DiskFull if isinstance(exc, DiskFull) else SyncFailed)(
            f"{decision.writer} ds={ds}: iceberg_native write failed ({error}); the dataset is marked errored and "
            f"nothing was written to dataset_rows — fix the cause and re-run the sync"
        )
        err.transient = is_transient(exc)
        raise err from exc
    try:
        failpoint("after-commit-before-log")
        _record_success(conn, ds, sync_id, flag, result)
    except BaseException as exc:
        if not isinstance(exc, Exception):  # committed; record what the table says, then go
            _settle_interrupted(conn, ds, sync_id, catalog, settings, exc, lg)
        raise  # any other error leaves the row 'running': the next native write settles it
    failpoint("after-log")
    new_rows = int(getattr(result, "rows", 0) or 0) - int(getattr(result, "rewritten", 0) or 0)
    lg.info(f"iceberg_native: {ds} ({new_rows} rows → snapshot {getattr(result, 'snapshot_id', None)})")
    return WriteOutcome(decision, result, sync_id)


def _record_success(conn, ds, sync_id, flag, result) -> None:
    rows = int(getattr(result, "rows", 0) or 0)
    total = getattr(result, "total_rows", None)  # rows in the table after the commit, when the writer knows
    snapshot_id = getattr(result, "snapshot_id", None)
    with conn.transaction():
        # rows = rows in the table after the commit, as the mirror records it
        sync_log.mark_native_succeeded(
            conn, sync_id, total, rows, getattr(result, "bytes", None), snapshot_id, getattr(result, "location", None)
        )
        stamps.mark_ready_after_native_write(conn, ds, total, flag.iceberg_mode, rows)


def _record_failure(
    conn: psycopg.Connection, dataset_id: uuid.UUID, sync_id: uuid.UUID, error: str, *, errored: bool = True, lg=log
) -> None:
    """Mark the sync failed (and the dataset errored, unless the write lost its lock: another writer may
    own the dataset now). A dead session cannot record anything: the next write settles the row."""
    try:
        with conn.transaction():
            sync_log.mark_failed(conn, sync_id, error)
            if errored:
                stamps.mark_errored(conn, dataset_id, error)
    except psycopg.Error as exc:
        lg.warning(f"could not record the failure of native sync {sync_id}: {type(exc).__name__}: {first_line(exc)}")


def _settle_interrupted(conn, ds, sync_id, catalog, settings, exc: BaseException, lg) -> None:
    """An interruption is not a data error: the row says what the table says, the dataset keeps its status."""
    try:
        table = load_table_or_none(catalog, table_identifier(settings, ds)) if catalog is not None else None
        snap = sync_snapshot(table, sync_id) if table is not None else None
        with conn.transaction():
            if table is not None and snap is not None:
                state = table_state(table)
                total = state["row_count"] if state["snapshot_id"] == snap.snapshot_id else None
                sync_log.settle_interrupted_landed(
                    conn,
                    sync_id,
                    snap.snapshot_id,
                    total,
                    snapshot_source_version(snap),
                    f"interrupted ({type(exc).__name__}) after its commit landed",
                    table.location(),
                )
                if total is not None:
                    stamps.mark_ready(conn, ds, total)
            else:
                sync_log.settle_interrupted_unseen(
                    conn,
                    sync_id,
                    f"{UNSETTLED}interrupted ({type(exc).__name__}) before its commit was seen to land; the next "
                    "native write of the dataset settles it",
                )
    except Exception as log_exc:  # noqa: BLE001 - the interruption is what propagates
        lg.warning(f"could not record the interruption of native sync {sync_id}: {log_exc}")


@dataclasses.dataclass(frozen=True)
class NativeWrite:
    """The real native write for ``route_write`` (``iceberg_write``): ``batches`` through lake/writer.py's chunked
    writer in ``mode``. With ``conn`` (route_write's) the commit carries its native run's totals and may expire
    old snapshots, and an append compacts the run's small files (routing/native_table.py). ``catalog``: what
    route_write settles abandoned and interrupted writes against."""

    catalog: Any
    settings: Settings
    dataset: Any
    batches: Iterable
    mode: str
    conn: psycopg.Connection | None = None

    def __call__(self, sync_id: uuid.UUID, source_version: int) -> NativeWriteResult:
        plan = TableWrite(self.mode, sync_id, source_version, path="native")
        if self.conn is None:
            return write_digested(self.catalog, self.settings, self.dataset, self.batches, plan)
        return write_native_table(self.catalog, self.settings, self.dataset, self.batches, plan, conn=self.conn)


def native_write(
    catalog, settings, dataset, batches: Iterable, *, writer: str, conn: psycopg.Connection | None = None
) -> NativeWrite:
    """The real native write for ``route_write`` in the writer's registry mode (sync.full replaces the table,
    the others append): NativeWrite."""
    mode = get_flag(WRITE, writer).iceberg_mode
    if mode is None:
        raise BadInput(f"writer {writer} is locked to pg; it has no native write")
    return NativeWrite(catalog, settings, dataset, batches, mode, conn)
