"""One complete and a complete at a scope: the resume, the checks and the start under the lifecycle lock, then the
batched no-echo deletes until nothing is left.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from pathlib import Path

import psycopg
from pyiceberg.catalog import Catalog

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.core.errors import BadInput, FlipRefused, LockTimeout
from lakehouse_dagster.core.failpoints import failpoint
from lakehouse_dagster.core.failpoints import validate as validate_failpoints
from lakehouse_dagster.core.guards import dataset_lock
from lakehouse_dagster.core.ids import parse_uuid
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.flags.completed import (
    COMPLETE,
    IN_PROGRESS,
    RESTORED,
    RESTORING,
    completed_mark,
    count_batch,
    mark_finished,
    rows_deleted,
    start_mark,
)
from lakehouse_dagster.flags.lifecycle_facts import derive, lifecycle_words
from lakehouse_dagster.lifecycle import COMPLETE_VERB, transition
from lakehouse_dagster.lifecycle.lock import lock_dataset
from lakehouse_dagster.mirror.reverse import GUC
from lakehouse_dagster.mirror.reverse_lag import forget_position
from lakehouse_dagster.parity.maintained import forget_pg
from lakehouse_dagster.runbooks.complete.checks import Checked, check, scope_datasets
from lakehouse_dagster.runbooks.complete.export import _check_export_dir, _check_scope_export_dir, _export
from lakehouse_dagster.runbooks.complete.status import _audit
from lakehouse_dagster.tracking.datasets import get_dataset
from lakehouse_dagster.tracking.datasets.row_writes import delete_row_range
from lakehouse_dagster.tracking.datasets.rows import count_rows, min_row_index, nth_row_index_from

LOCK_TIMEOUT_MS = 100  # a batch waits at most this long for a row lock of the live app, then backs off
LOCK_RETRIES = 50  # lock timeouts in a row before a run gives up (re-running continues)


@dataclasses.dataclass(frozen=True)
class CompleteResult:
    dataset_id: uuid.UUID
    status: str  # in_progress (stopped early: re-run) | complete
    started: str  # started | resumed | already complete
    rows_deleted: int  # by this run
    total_deleted: int  # since the complete started
    batches: int  # by this run
    exported_to: str | None
    exported_rows: int
    seconds: float

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "dataset_id": str(self.dataset_id)}

    def summary(self) -> str:
        if self.started == "already complete":
            return f"dataset {self.dataset_id}: already complete; nothing to do"
        export = f"; {self.exported_rows} row(s) exported as Parquet to {self.exported_to}" if self.exported_to else ""
        head = f"dataset {self.dataset_id}: {'resumed' if self.started == 'resumed' else 'complete started'}{export}; "
        if self.status == COMPLETE:
            return (
                head
                + f"{self.rows_deleted} Postgres row(s) deleted in {self.batches} batch(es) in {self.seconds:.2f}s "
                f"({self.total_deleted} in all); complete: Iceberg alone holds its rows, the reverse mirror is off for "
                f"it, a rollback to pg needs a backfill first (lakehouse backfill --dataset {self.dataset_id})"
            )
        return (
            head
            + f"{self.rows_deleted} row(s) deleted in {self.batches} batch(es), stopped before the end (a backfill "
            "took it back); see lakehouse complete --status --dataset "
            f"{self.dataset_id}"
        )


def complete(
    dsn: str,
    catalog: Catalog,
    settings: Settings,
    dataset_id,
    *,
    actor: str,
    note: str | None = None,
    export_to: str | None = None,
    soak_seconds: int | None = None,
    batch_rows: int | None = None,
    lock_timeout_ms: int = LOCK_TIMEOUT_MS,
) -> CompleteResult:
    """Complete one dataset (see the module docstring): refused (FlipRefused, nothing written) while a condition is
    missing; a mark in progress resumes. Long on purpose: the resume, the checks under the lifecycle lock and the
    start read top to bottom in the order they happen."""
    ds_id = parse_uuid(dataset_id, "dataset id")
    validate_failpoints()
    if not actor or not actor.strip():
        raise BadInput("no actor: set LAKEHOUSE_ACTOR to who is completing the dataset")
    batch = batch_rows or settings.complete.batch_rows
    started_at = time.perf_counter()
    with connect(dsn) as conn:
        get_dataset(conn, ds_id)  # unknown: NotFound, one line
        with dataset_lock(conn, ds_id, timeout_s=60):
            mark = completed_mark(conn, ds_id)
            if mark is not None and mark.status == COMPLETE:
                return CompleteResult(ds_id, COMPLETE, "already complete", 0, mark.rows_deleted, 0, None, 0, 0.0)
            if mark is not None and mark.status == RESTORING:
                raise BadInput(
                    f"dataset {ds_id}: a backfill from Iceberg is bringing its rows back and has not finished; finish "
                    f"it first (lakehouse backfill --dataset {ds_id}); nothing was written"
                )
            resuming = mark is not None and mark.status == IN_PROGRESS
            if resuming:
                assert mark is not None
                asked = str(_check_export_dir(export_to, mark)) if export_to else None
                if asked is not None and asked != mark.export_to:
                    raise BadInput(
                        f"dataset {ds_id}: the complete in progress was started "
                        + (f"with --export-to {mark.export_to}" if mark.export_to else "without --export-to")
                        + "; re-run it as it was started (its rows are partly deleted already); nothing was written"
                    )
                with conn.transaction():
                    forget_pg(conn, ds_id)  # a canary may have registered it again meanwhile (see _start)
                    _audit(conn, ds_id, "resume", actor, mark.rows_deleted, {"next_row_index": mark.next_row_index})
            else:
                path = _check_export_dir(export_to, None)
                # the checks and the start under the lifecycle lock: a writer rollback (or any verb) on the dataset
                # either committed before the checks read its flags, or waits until the start has committed and
                # then finds the dataset completing
                with transition(
                    conn,
                    COMPLETE_VERB,
                    dataset_ids=[ds_id],
                    derive=derive,
                    actor=actor,
                    what=f"lakehouse complete --dataset {ds_id}",
                ):
                    found = check(conn, catalog, settings, ds_id, soak_seconds=soak_seconds)
                    if found.missing:
                        raise found.refusal(lifecycle_words(conn, [ds_id]).get(ds_id))
                    _start(conn, ds_id, found, path, actor, note)
        mark = completed_mark(conn, ds_id)
        assert mark is not None
        exported = 0
        if mark.export_to and mark.exported_at is None:
            exported = _export(conn, ds_id, Path(mark.export_to), batch, actor)
        deleted, batches, status = _delete_batches(conn, ds_id, batch, lock_timeout_ms, actor)
        total = rows_deleted(conn, ds_id)
    return CompleteResult(
        ds_id,
        status,
        "resumed" if resuming else "started",
        deleted,
        int(total),
        batches,
        mark.export_to,
        exported,
        time.perf_counter() - started_at,
    )


def _start(
    conn: psycopg.Connection, ds_id: uuid.UUID, found: Checked, path: Path | None, actor: str, note: str | None
) -> None:
    """The reverse off (audited), its position dropped, its maintained digest unregistered, the mark in progress,
    the audit's start: one transaction."""
    from lakehouse_dagster.flags.reverse_setting import set_reverse  # lazy: only where a complete starts

    with conn.transaction():
        set_reverse(conn, False, dataset=ds_id, note="complete", actor=actor)
        forget_position(conn, ds_id)
        # the maintained Postgres digest of rows about to go: unregistered, so no batch hashes the rows it deletes
        # (a canary registers and fills it again, as for any dataset: after a restore, over the rows restored)
        forget_pg(conn, ds_id)
        start_mark(conn, ds_id, min_row_index(conn, ds_id), str(path) if path else None, found.snapshot_id, actor, note)
        rows = count_rows(conn, ds_id)
        _audit(
            conn,
            ds_id,
            "start",
            actor,
            rows,
            {
                "snapshot_id": found.snapshot_id,
                "native_since": found.native_since.isoformat() if found.native_since else None,
                "soak_seconds": found.soak_seconds,
                "verdict_id": found.verdict_id,
                "export_to": str(path) if path else None,
                "note": note,
            },
        )


def _delete_batches(
    conn: psycopg.Connection, ds_id: uuid.UUID, batch: int, lock_timeout_ms: int, actor: str
) -> tuple[int, int, str]:
    """Delete the dataset's rows batch by batch from the mark's cursor, each batch one short transaction; (rows
    deleted, batches, the mark's status at the end). A batch that hits the lock timeout is rolled back whole and
    retried after a pause (LOCK_RETRIES in a row: LockTimeout, re-run to continue)."""
    deleted = batches = waits = 0
    while True:
        try:
            with conn.transaction():
                conn.execute("select set_config('lock_timeout', %s, true)", (f"{int(lock_timeout_ms)}ms",))
                conn.execute("select set_config(%s, 'on', true)", (GUC,))  # no echo (migration 033's triggers)
                lock_dataset(conn, ds_id)  # the lifecycle's lock before the mark's row lock, as every verb takes them
                mark = completed_mark(conn, ds_id, for_update=True)
                if mark is None or mark.status != IN_PROGRESS:  # a backfill took it back meanwhile
                    return deleted, batches, mark.status if mark else RESTORED
                lo = mark.next_row_index
                if lo is None:
                    lo = min_row_index(conn, ds_id)
                if lo is None:  # nothing left: finish (completing → complete)
                    with transition(
                        conn,
                        COMPLETE_VERB,
                        dataset_ids=[ds_id],
                        derive=derive,
                        actor=actor,
                        what=f"lakehouse complete --dataset {ds_id} (finish)",
                    ):
                        mark_finished(conn, ds_id)
                        # a reverse position written meanwhile (none should be: the reverse is off): none holds
                        forget_position(conn, ds_id)
                        _audit(conn, ds_id, "finish", actor, mark.rows_deleted, {"batches": mark.batches})
                    return deleted, batches, COMPLETE
                hi = nth_row_index_from(conn, ds_id, lo, batch)
                n = delete_row_range(conn, ds_id, lo, hi)
                # the last range: the next batch looks again from the start (a row a writer locked to pg added
                # below the cursor meanwhile is deleted too), and finishes when nothing is left
                nxt = None if hi is None else hi + 1
                count_batch(conn, ds_id, n, nxt)
                if n:
                    _audit(conn, ds_id, "batch", actor, n, {"from": lo, "to": hi})
            deleted += n
            batches += 1 if n else 0
            waits = 0
            failpoint("complete-after-batch")
        except psycopg.errors.LockNotAvailable:
            waits += 1
            if waits >= LOCK_RETRIES:
                raise LockTimeout(
                    f"dataset {ds_id}: {waits} batches in a row waited over {lock_timeout_ms} ms for a row lock of "
                    f"the live app; {deleted} row(s) deleted by this run, the rest kept; re-run lakehouse "
                    f"lakehouse complete --dataset {ds_id} to continue"
                ) from None
            time.sleep(min(2.0, 0.05 * 2 ** min(waits, 6)))


@dataclasses.dataclass(frozen=True)
class CompleteScope:
    completed: list[CompleteResult]
    refused: list[tuple[uuid.UUID, str]]  # (dataset, the refusal)

    def as_dict(self) -> dict:
        return {
            "completed": [c.as_dict() for c in self.completed],
            "refused": [{"dataset_id": str(d), "refusal": r} for d, r in self.refused],
        }


def complete_scope(
    dsn: str,
    catalog: Catalog,
    settings: Settings,
    *,
    dataset=None,
    workspace=None,
    datasets: list | None = None,
    export_to=None,
    **kw,
) -> CompleteScope:
    """``complete`` at a scope: one dataset (its refusal raised as is), or each native dataset of a workspace / all of
    them, or each of a list (``datasets``: a rollout plan's complete stage, the datasets it moved); each refusal kept,
    the others completed; an export goes to ``<export_to>/<dataset id>``."""
    if datasets is not None:
        if dataset not in (None, "") or workspace not in (None, ""):
            raise BadInput("give a list of datasets, or one dataset, or a workspace; not several")
        ids = [parse_uuid(d, "dataset id") for d in datasets]
    else:
        with connect(dsn) as conn:
            ids = scope_datasets(conn, dataset=dataset, workspace=workspace)
    if dataset not in (None, ""):
        return CompleteScope([complete(dsn, catalog, settings, ids[0], export_to=export_to, **kw)], [])
    if export_to:
        with connect(dsn) as conn:
            _check_scope_export_dir(conn, export_to)
    done, refused = [], []
    for ds_id in ids:
        sub = str(Path(str(export_to)).expanduser().resolve() / str(ds_id)) if export_to else None
        try:
            done.append(complete(dsn, catalog, settings, ds_id, export_to=sub, **kw))
        except (FlipRefused, BadInput) as exc:
            refused.append((ds_id, str(exc)))
    return CompleteScope(done, refused)
