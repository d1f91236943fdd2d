"""The mirror: one dataset's Postgres rows → its Iceberg table, full or incremental, committed once.

The CLI (`lakehouse sync`), the Dagster asset and the tests all call ``sync_dataset``.

Kept whole on purpose: one sync from its lock to its record, each failure's description beside the step that raises it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import resource
import time
import uuid
from typing import Any

import psycopg
from pyiceberg.catalog import Catalog

from lakehouse_dagster.core.db import IdlePool, connect, is_idle
from lakehouse_dagster.core.errors import (
    BadInput,
    DiskFull,
    ForeignCommit,
    GuardLost,
    LakehouseError,
    SyncFailed,
    commit_outcome_unknown,
    first_line,
    is_transient,
)
from lakehouse_dagster.core.failpoints import failpoint
from lakehouse_dagster.core.failpoints import validate as validate_failpoints
from lakehouse_dagster.core.guards import admission_slot, dataset_lock, pooled_guard_connection
from lakehouse_dagster.core.ids import parse_uuid
from lakehouse_dagster.core.settings import Settings, SyncSettings
from lakehouse_dagster.flags.completed import completed_mark
from lakehouse_dagster.flags.native import native_dataset_ids
from lakehouse_dagster.lake.catalog import load_table_or_none, table_identifier
from lakehouse_dagster.lake.foreign import foreign_since_project
from lakehouse_dagster.lake.writer import (
    ABSENT,
    WRITE_MODE,
    TableWrite,
    files_left,
    snapshot_source_version,
    sync_snapshot,
    table_state,
)
from lakehouse_dagster.mirror.modes import MODES
from lakehouse_dagster.mirror.native_run import refuse_mirror_over_iceberg_only
from lakehouse_dagster.mirror.pinned_read import PinnedSnapshot, read_batches, reader_parts
from lakehouse_dagster.mirror.reaper import UNSETTLED, reap_abandoned
from lakehouse_dagster.parity.write_digests import write_digested
from lakehouse_dagster.tracking import sync_log, undeclared
from lakehouse_dagster.tracking.datasets import Dataset, get_dataset, lookup, parse_schema, stamps
from lakehouse_dagster.tracking.row_changes import (
    PartialPlan,
    changed_ranges,
    compaction_due,
    file_ranges,
    plan_compaction,
    plan_partial,
    prune,
)

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class SyncResult:
    sync_id: uuid.UUID
    dataset_id: uuid.UUID
    mode: str  # what ran: full | incremental | partial | noop
    reason: str  # why that mode
    rows: int  # rows written by this sync
    total_rows: int  # rows in the table after it
    snapshot_id: int | None
    bytes: int
    files: int
    source_version: int
    seconds: float
    path: str = "mirror"
    location: str | None = None  # the table's location (its files' root), recorded with the sync

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def sync_dataset(
    dsn: str,
    catalog: Catalog,
    settings: Settings,
    dataset_id: uuid.UUID | str,
    *,
    mode: str = "auto",
    sync_id: uuid.UUID | None = None,
    writer: str = "sync.full",
    run_id: str | None = None,
    readers: int = 2,
    lock_timeout_s: float = 1800,
    pool: IdlePool | None = None,
    revert_foreign: bool = False,
) -> SyncResult:
    """Mirror one dataset. Serialised per dataset (G3), admission-bounded (G2), fail-loud: a failure
    records the failed sync, marks the dataset errored, commits nothing and raises SyncFailed (its
    ``transient`` says whether a retry may help: errors.is_transient). An interruption (Ctrl-C,
    SIGTERM, a run termination) is not a data error: the sync is recorded as what the table says
    (succeeded if its commit landed, else failed 'interrupted'), the dataset status is left alone, and
    the interruption propagates. ``lock_timeout_s`` bounds the wait for another sync of the dataset
    (LockTimeout, transient, nothing logged): a batch uses a short one and comes back to the dataset later.
    ``pool``: a batch's idle connections (store.db.IdlePool) the lock session, the pinned read and its readers reuse.
    Another Iceberg engine's data change on the table since the project's last commit (lake/foreign.py) fails the
    sync (ForeignCommit, nothing committed) whatever the mode; ``revert_foreign`` (an operator's decision: a full
    re-sync, mode full or auto) reverts it instead, and the commit names the snapshots it reverted."""
    if mode not in MODES:
        raise BadInput(f"unknown sync mode {mode!r}; use one of {', '.join(MODES)}")
    if revert_foreign and mode == "incremental":
        raise BadInput(
            "--revert-foreign is a full re-sync from Postgres (it replaces every file of the table); "
            "run it with --mode full, not incremental"
        )
    mode = "full" if revert_foreign else mode
    ds_id = parse_uuid(dataset_id, "dataset id")
    validate_failpoints()
    sync_id = sync_id or uuid.uuid4()
    with pooled_guard_connection(dsn, pool) as conn:
        dataset = get_dataset(conn, ds_id)
        if dataset.kind != "tabular":
            raise BadInput(
                f"dataset {ds_id} is a {dataset.kind} dataset (file-backed pointers); only tabular datasets are mirrored"
            )
        with dataset_lock(conn, ds_id, timeout_s=lock_timeout_s), admission_slot(conn, settings.sync.max_concurrent):
            _refuse_unmirrorable(conn, catalog, settings, ds_id)
            reap_abandoned(conn, catalog, settings, ds_id)
            _log_start(conn, ds_id, sync_id, writer, run_id)
            started = time.perf_counter()
            try:
                result = _mirror(dsn, catalog, settings, ds_id, mode, sync_id, readers, started, pool, revert_foreign)
            except BaseException as exc:
                if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit, Dagster's interruption
                    _conclude_interrupted(dsn, conn, catalog, settings, ds_id, sync_id, exc)
                    raise
                message = _describe(exc, ds_id, dsn)
                transient = False if _BAD_VALUE.search(message) or _UNDECLARED_HEAD in message else is_transient(exc)
                unrecorded = _conclude_failed(dsn, conn, ds_id, sync_id, message, exc)
                err = DiskFull(message + unrecorded) if isinstance(exc, DiskFull) else SyncFailed(message + unrecorded)
                err.transient = transient
                raise err from exc
            try:
                failpoint("after-commit-before-log")
                _log_succeeded(conn, result)
            except BaseException as exc:
                # Committed but not recorded. An interruption records what the table says; any other error
                # (the database gone) leaves the row 'running' for the next sync to settle (mirror/reaper.py).
                if not isinstance(exc, Exception):
                    _conclude_interrupted(dsn, conn, catalog, settings, ds_id, sync_id, exc)
                    raise
                err = SyncFailed(
                    f"dataset {ds_id}: snapshot {result.snapshot_id} was committed but could not be recorded "
                    f"({type(exc).__name__}: {first_line(exc)}); the next sync of the dataset records it"
                )
                err.transient = is_transient(exc)
                raise err from exc
            failpoint("after-log")
            return result


def _refuse_unmirrorable(conn, catalog: Catalog, settings: Settings, ds_id: uuid.UUID) -> None:
    """Under the dataset lock: the states in which mirroring Postgres over Iceberg would lose rows."""
    done = completed_mark(conn, ds_id)  # complete (issue 31): whatever its flags say now
    if done is not None and done.holding:
        raise BadInput(
            f"{done.why_not_postgres()}; mirroring the emptied dataset_rows over the Iceberg table would "
            "drop every row, so the mirror refuses it"
        )
    # Checked under the dataset lock: a writer flipped to iceberg_native makes Iceberg the truth and
    # Postgres stale, so mirroring would overwrite rows that exist only in Iceberg (split brain).
    if native_dataset_ids(conn, [ds_id]):
        raise BadInput(
            f"dataset {ds_id} is written iceberg-native (a writer flag resolves to iceberg_native), so "
            "Postgres is stale for it and mirroring would overwrite Iceberg-only rows; roll the writer "
            "back to pg (lakehouse write-flags set <writer> pg --dataset <uuid>) before mirroring"
        )
    refuse_mirror_over_iceberg_only(conn, catalog, settings, ds_id)  # rows written natively, then rolled back


def _mirror(
    dsn, catalog, settings, ds_id, mode, sync_id, readers, started, pool=None, revert_foreign=False
) -> SyncResult:
    """One sync of the dataset from its pinned Postgres snapshot. Long on purpose: each refusal (a completed or native
    dataset, another engine's commit, a key the schema does not declare) sits beside the read it judges."""
    pinned = PinnedSnapshot(dsn, ds_id, pool)
    try:
        head = pinned.state(None)
        dataset = _dataset_at(ds_id, head)
        table = load_table_or_none(catalog, table_identifier(settings, ds_id))
        # Before anything is read or reported: another engine's data change (lake/foreign.py). The commit checks
        # again on its own table state (lake/writer.py), so one landing meanwhile is refused as well.
        chain = foreign_since_project(table) if table is not None else None
        if chain is not None and chain.problem is not None and not revert_foreign:
            raise ForeignCommit(chain.refusal(ds_id))
        current = table_state(table) if table is not None else None
        columns_now = [{"name": c.name, "type": c.type} for c in dataset.columns]
        run_mode, reason, after = _choose_mode(mode, head, current, columns_now)
        if chain is not None and chain.problem is not None:
            ids = ", ".join(str(f.snapshot_id) for f in chain.changes) or "a rollback"
            reason = f"full requested to revert what another Iceberg engine committed ({ids})"
        if run_mode == "noop":
            assert current is not None  # _choose_mode runs "full" when there is no table
            return SyncResult(
                sync_id,
                ds_id,
                "noop",
                reason,
                0,
                current["row_count"],
                current["snapshot_id"],
                0,
                0,
                head.rows_version,
                time.perf_counter() - started,
                location=table.location() if table is not None else None,
            )
        plan: Any = None  # PartialPlan when run_mode becomes "partial"; a reason (str) when it cannot
        if run_mode == "rewrite":
            assert current is not None  # as above
            plan = _plan_rewrite(pinned, table, ds_id, head, current, settings.sync)
            run_mode, reason = ("partial", plan.reason) if isinstance(plan, PartialPlan) else ("full", plan)
        elif (
            run_mode == "incremental"
            and mode == "auto"
            and table is not None  # always (_choose_mode runs "full" without one)
            and current is not None
            and compaction_due(table, settings.sync.chunk_rows)
        ):
            files = file_ranges(table)
            plan = (
                plan_compaction(files, current["max_row_index"], head.max_row_index, settings.sync.chunk_rows)
                if not isinstance(files, str)
                else None
            )
            if plan is not None:
                run_mode, reason, after = "partial", plan.reason, None
        state = pinned.state(after) if after is not None else head
        parts = reader_parts(
            state,
            ranges=plan.read if run_mode == "partial" else None,
            readers=readers,
            min_rows=settings.sync.chunk_rows,
        )
        batches = read_batches(
            dsn, pinned, state, dataset.columns, after_row_index=after, readers=readers, parts=parts, pool=pool
        )
        commit = TableWrite(
            {"full": "replace", "incremental": "append", "partial": "partial"}[run_mode],
            sync_id,
            head.rows_version,
            max_row_index=head.max_row_index
            if head.max_row_index is not None
            else (after if after is not None else -1),
            delete_files=plan.files if run_mode == "partial" else (),
            lanes=[lo for part in parts for lo, _ in part][1:],  # one file per range read: disjoint files
            revert_foreign=revert_foreign,
        )
        written = write_digested(
            catalog,
            settings,
            dataset,
            batches,
            commit,
            table=table if table is not None else ABSENT,  # loaded once above, under the dataset lock
        )
    finally:
        pinned.close()
    return _written_result(sync_id, ds_id, run_mode, reason, written, head.rows_version, started)


def _written_result(sync_id, ds_id, run_mode: str, reason: str, written, head_version: int, started) -> SyncResult:
    """What a mirror sync that reached the writer reports (``written``: lake/writer.WriteResult)."""
    if not written.committed and written.snapshot_id is not None:
        # A retried step whose first attempt committed: that snapshot covers the version attempt 1 read,
        # not the head we see now. Record exactly that; if Postgres moved on, the dataset stays behind
        # and the poller requests it (a new run key for the new version). Syncing the rest here would
        # need a second snapshot under the same sync id, which retries could not tell apart.
        version = written.source_version if written.source_version is not None else -1
        return SyncResult(
            sync_id,
            ds_id,
            "noop",
            f"this sync's snapshot had already landed (a retry); it covers version {version}",
            0,
            written.total_rows,
            written.snapshot_id,
            0,
            0,
            version,
            time.perf_counter() - started,
            location=written.location,
        )
    return SyncResult(
        sync_id,
        ds_id,
        run_mode,
        reason,
        written.rows,
        written.total_rows,
        written.snapshot_id,
        written.bytes,
        written.files,
        head_version,
        time.perf_counter() - started,
        location=written.location,
    )


def _dataset_at(ds_id: uuid.UUID, head) -> Dataset:
    columns = parse_schema(head.schema, f"dataset {ds_id}")
    return Dataset(
        ds_id, None, "", head.kind, columns, None, "", head.rows_version, head.rows_rewrite_version, head.max_row_index
    )


def _choose_mode(mode: str, head, current: dict | None, columns_now: list) -> tuple[str, str, int | None]:
    """(mode to run, why, row_index to append after). Incremental only when the table is exactly the
    last mirrored version plus pure appends above its max row index, with an unchanged schema."""
    if mode == "full":
        return "full", "full requested", None
    if current is None or current["snapshot_id"] is None or current["source_version"] < 0:
        return "full", "first sync of this dataset", None
    if current["columns"] != columns_now:
        return "full", "the dataset's schema changed", None
    if current["source_version"] == head.rows_version:
        return "noop", "already mirrored at this source version", None
    if head.rows_rewrite_version > current["source_version"]:
        return "rewrite", "rows were updated, deleted or inserted below the mirrored max row index", None
    return "incremental", "only appends since the last mirrored version", current["max_row_index"]


def _plan_rewrite(pinned: PinnedSnapshot, table, ds_id, head, current: dict, sync: SyncSettings) -> PartialPlan | str:
    """A partial rewrite when change tracking knows every range rewritten since the mirrored version (read
    in the pinned snapshot, like the rows) and they sit in few data files; else why the sync goes full."""
    full = "rows were updated, deleted or inserted below the mirrored max row index"
    if sync.partial_max_fraction <= 0:
        return f"{full} (partial rewrites are off: LAKEHOUSE_PARTIAL_MAX_FRACTION=0)"
    changed = changed_ranges(pinned.conn, ds_id, head.rows_rewrite_version, current["source_version"])
    if changed is None:
        return f"{full}; which rows is not known (a TRUNCATE, a schema change or older history)"
    files = file_ranges(table)
    if isinstance(files, str):
        return f"{full}; {files}"
    return plan_partial(
        files,
        changed,
        current["max_row_index"],
        head.max_row_index,
        current["row_count"],
        sync.partial_max_fraction,
    )


_BAD_VALUE = re.compile(r"dataset \S+ row_index \d+ column .*?: expected \w+, got a JSON \w+")
_UNDECLARED = re.compile(r"dataset \S+ row_index \d+ holds key\(s\) .* that its schema does not declare")
_UNDECLARED_HEAD = "the mirror refuses it (nothing was committed)"


def _describe(exc: BaseException, ds_id: uuid.UUID, dsn: str) -> str:
    """A one-line reason that names the dataset and, for a bad value, the row, column and JSON type."""
    text = str(exc)
    found = _BAD_VALUE.search(text)
    if found:
        return found.group(0)
    found = _UNDECLARED.search(text)
    if found:  # name every undeclared key (a few, counted), not only the first row's
        return f"{_locate_undeclared(dsn, ds_id) or found.group(0)}; {_UNDECLARED_HEAD}"
    if isinstance(exc, LakehouseError):
        return text if str(ds_id) in text else f"dataset {ds_id}: {text}"
    sqlstate = getattr(exc, "sqlstate", None) or getattr(getattr(exc, "diag", None), "sqlstate", None)
    if (sqlstate and str(sqlstate).startswith("22")) or "invalid input syntax" in text or "out of range" in text:
        located = _locate_bad_value(dsn, ds_id)
        if located:
            return located
    return f"dataset {ds_id}: sync failed: {type(exc).__name__}: {first_line(exc)}"


def _locate_bad_value(dsn: str, ds_id: uuid.UUID) -> str | None:
    try:
        with connect(dsn) as conn:
            cols = lookup.schema_of(conn, ds_id, "the dataset's schema")
            row = conn.execute(
                "select * from lakehouse_find_bad_value(%s, %s::jsonb)", (ds_id, psycopg.types.json.Jsonb(cols))
            ).fetchone()
    except Exception:
        return None
    if row is None:
        return None
    return f"dataset {ds_id} row_index {row[0]} column {row[1]}: expected {row[2]}, got a JSON {row[3]}"


def _locate_undeclared(dsn: str, ds_id: uuid.UUID) -> str | None:
    """After the read refused a row with undeclared keys: all of them, counted (one scan, on failure only)."""
    try:
        with connect(dsn) as conn:
            raw = lookup.schema_of(conn, ds_id, "the schema")
            found = undeclared.find(conn, ds_id, [c.name for c in parse_schema(raw, f"dataset {ds_id}")])
    except Exception:
        return None
    return found.describe() if found is not None else None


def _log_start(conn, ds_id, sync_id, writer, run_id) -> None:
    sync_log.start_mirror(conn, ds_id, sync_id, writer, run_id)


def _bookkeeping_conn(dsn: str, conn: psycopg.Connection):
    """``conn`` when it can still run a statement, else a fresh connection (the lock session may be the
    reason we failed: GuardLost, an interruption in the middle of a query on it)."""
    if is_idle(conn):
        return contextlib.nullcontext(conn)
    return connect(dsn)


def _conclude_failed(dsn, conn, ds_id, sync_id, message, exc: BaseException) -> str:
    """Record a failed sync. The dataset is marked errored, except when the sync lost its lock (another
    sync may own the dataset now, and its outcome is the truth). A commit of unknown outcome kept its
    files: the row is marked unsettled so the next sync settles it (mirror/reaper.py). Returns "" or, when
    the record could not be written, the clause the sync's error ends with (the operator reads one line)."""
    if commit_outcome_unknown(exc) is not None:  # also when a later error (a cleanup's) is the one raised
        message = UNSETTLED + message
    elif left := files_left(exc):  # not committed, but files of it are still stored: the next sync removes them
        message = f"{UNSETTLED}{message}; {left} data file(s) it wrote could not be deleted, the next sync removes them"
    try:
        try:
            with _bookkeeping_conn(dsn, conn) as c:
                _log_failed(c, ds_id, sync_id, message, errored=not isinstance(exc, GuardLost))
        except psycopg.OperationalError:
            if not conn.broken:
                raise
            # The lock session looked idle but had died (a Postgres restart or a dropped connection ended it
            # while another session failed): record on a fresh one. G3 went with the session, so another sync
            # may own the dataset now: its outcome decides the dataset's status, as for GuardLost.
            with connect(dsn) as fresh:
                _log_failed(fresh, ds_id, sync_id, message, errored=False)
    except Exception as log_exc:  # noqa: BLE001 - the sync's own error is the one to raise
        # psycopg's messages run over lines: the first one, inside the sync's own error
        return (
            f"; its failure could not be recorded ({type(log_exc).__name__}: {first_line(log_exc)}): the log "
            "row stays 'running' until the next sync settles it"
        )
    return ""


def _conclude_interrupted(dsn, conn, catalog, settings, ds_id, sync_id, exc: BaseException) -> None:
    """The state after an interruption says what is true: the table decides whether the commit landed."""
    try:
        table = load_table_or_none(catalog, table_identifier(settings, ds_id))
        snap = sync_snapshot(table, sync_id) if table is not None else None
        with _bookkeeping_conn(dsn, conn) as c:
            if table is not None and snap is not None:
                state = table_state(table)
                total = state["row_count"] if state["snapshot_id"] == snap.snapshot_id else None
                _log_succeeded(
                    c,
                    SyncResult(
                        sync_id,
                        ds_id,
                        _snapshot_mode(snap),
                        f"interrupted ({type(exc).__name__}) after its commit landed",
                        0,
                        total if total is not None else int(snap.summary.additional_properties.get("total-records", 0)),
                        snap.snapshot_id,
                        0,
                        0,
                        snapshot_source_version(snap) or -1,
                        0.0,
                        location=table.location(),
                    ),
                )
            else:
                # Files may be left if the interruption hit inside the commit: the next sync settles them.
                _log_failed(
                    c,
                    ds_id,
                    sync_id,
                    f"{UNSETTLED}interrupted ({type(exc).__name__}) before its commit "
                    "was seen to land; the next sync of the dataset settles it",
                    errored=False,
                )
    except Exception as log_exc:  # noqa: BLE001 - the interruption is what propagates
        _log.warning("could not record the interruption of sync %s: %s", sync_id, log_exc)


def _snapshot_mode(snap) -> str:
    written = snap.summary.additional_properties.get(WRITE_MODE)
    if written is not None:
        return {"replace": "full", "append": "incremental"}.get(written, written)
    op = getattr(getattr(snap.summary, "operation", None), "value", None)
    return "incremental" if op == "append" else "full"


def _log_failed(conn, ds_id, sync_id, message, *, errored: bool = True) -> None:
    with conn.transaction():
        sync_log.mark_failed(conn, sync_id, message)
        if errored:
            stamps.mark_errored(conn, ds_id, message)


def _log_succeeded(conn, r: SyncResult) -> None:
    with conn.transaction():
        sync_log.mark_mirror_succeeded(
            conn, r.sync_id, r.mode, r.total_rows, r.bytes, r.snapshot_id, r.source_version, r.location
        )
        stamps.mark_ready(conn, r.dataset_id, r.total_rows)
        prune(conn, r.dataset_id, r.source_version)
