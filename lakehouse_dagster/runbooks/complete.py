"""`lakehouse write-flags complete`: retire a native dataset's Postgres rows, the end of its writer migration (issue 31).

Refused, naming every missing condition at once with what to do, unless the dataset

  * has been written iceberg-native for at least the soak (flags/soak_setting.py; since when: the writers' flag
    audit replayed, flags/soak.py, as the widening rules read it);
  * has reverse parity ``ok``: the reverse mirror (mirror/reverse.py) is on and caught up (its position is the
    table's current snapshot), and the latest canary verdict is at that snapshot, agrees with Postgres (``ok``, or
    ``native`` with ``agrees_with_postgres``) and was taken at the dataset's current Postgres version;
  * has no Postgres-locked consumer left: not a pipeline input (the step-2b query's BLOCKED), no declared reader
    that reads it from Postgres (flags/reader_datasets.py ``on_postgres``: a reader locked to Postgres, or a compute
    reader — objects.sync, dashboards.aggregate, pipeline.expectations — whose mode for it is below iceberg; once
    flipped for it, after its shadow reads proved it, it holds nothing);
  * has no row holding a key its schema does not declare (tracking/undeclared.py): Iceberg and the export hold the
    declared columns only, so such a key would be deleted for good.

Then, in this order:

  1. **start** (one transaction, under the dataset lock G3, so no reverse apply or native write runs meanwhile):
     the reverse setting off at dataset scope (audited, note ``complete``), the reverse position dropped (dataset_rows
     will no longer hold that snapshot), its maintained Postgres digest unregistered (no batch hashes the rows it
     deletes; a canary fills it again after a restore), the durable mark ``lakehouse_completed`` (migration 034)
     ``in_progress``;
  2. **export** (``--export-to <dir>``): the rows as Parquet, typed as the table, identity columns included, streamed
     (memory bounded by one chunk of ``LAKEHOUSE_COMPLETE_BATCH_ROWS`` rows), before any row is deleted;
  3. **batches**: ``dataset_rows`` deleted by ``row_index`` ranges of the primary key, ``LAKEHOUSE_COMPLETE_BATCH_ROWS``
     rows per batch, each batch its own short transaction with a ``lock_timeout`` (a batch that would wait on the
     live app's row lock gives up and is retried after a pause; no table lock), the mark's cursor and count moved
     in the same transaction; each batch sets the reverse mirror's no-echo switch (``lakehouse.reverse_apply``,
     migration 033), so change tracking, the forward mirror and the recorder see no write of the live app;
  4. **finish**: in the batch that finds no row left, the mark becomes ``complete``.

Every step is in the append-only ``lakehouse_complete_audit`` (``write-flags complete --status``). A crash or a kill
leaves the mark ``in_progress`` with its cursor: re-running ``complete`` continues from there (no check again: the
checks passed when it started, and the rows are partly gone). After complete, a writer rollback to pg is refused
(flags/gates.py, flags/completed.py) and the forward mirror refuses the dataset whatever its flags say.

The way back: ``lakehouse write-flags backfill --dataset <id>`` on a completed dataset (``restore``) turns the reverse
on for it again and re-syncs ``dataset_rows`` in full from the table's current snapshot (mirror/reverse.py's full
apply: identity preserved, one transaction, no echo), then marks it ``restored``; a rollback to pg then needs nothing
more (the rollback report says the dataset is reverse-synced). Plain Python over explicit arguments; no Dagster.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
import uuid
from pathlib import Path

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
from psycopg import sql
from psycopg.types.json import Jsonb
from pyiceberg.catalog import Catalog

from lakehouse_dagster.core.db import connect, fetch_value
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
    Completed,
    completed_mark,
    count_batch,
    export_targets,
    mark_exported,
    mark_finished,
    mark_restored,
    marked_datasets,
    rows_deleted,
    set_status,
    start_mark,
    with_status,
)
from lakehouse_dagster.flags.lifecycle_facts import derive, lifecycle_words
from lakehouse_dagster.flags.native import native_dataset_ids
from lakehouse_dagster.flags.overrides import DATASET, WORKSPACE, parse_scope, require_target
from lakehouse_dagster.flags.reader_datasets import on_postgres
from lakehouse_dagster.flags.registry import FLIPPABLE_WRITERS, PROVEN_READERS, WRITE
from lakehouse_dagster.flags.soak import audit_history, effective_since, until
from lakehouse_dagster.flags.soak_setting import current_soak
from lakehouse_dagster.flags.stored import resolve_for, stored_overrides
from lakehouse_dagster.lake.schema import arrow_schema
from lakehouse_dagster.lifecycle import COMPLETE_VERB, RESTORE, transition
from lakehouse_dagster.lifecycle.lock import lock_dataset
from lakehouse_dagster.mirror.pinned_read import select_query
from lakehouse_dagster.mirror.reverse import GUC, apply_reverse, reverse_states
from lakehouse_dagster.mirror.reverse_lag import forget_position
from lakehouse_dagster.parity.canary import latest_verdicts
from lakehouse_dagster.parity.maintained import forget_pg
from lakehouse_dagster.parity.verdicts import latest_verdict_id
from lakehouse_dagster.runbooks.backfill import backfill
from lakehouse_dagster.tracking import undeclared
from lakehouse_dagster.tracking.datasets import get_dataset, pipeline_input_dataset_ids

_log = logging.getLogger(__name__)
NATIVE = "iceberg_native"
LOCK_TIMEOUT_MS = 100  # a batch waits at most this long for a row lock of the live app, then backs off
LOCK_RETRIES = 50  # lock timeouts in a row before a run gives up (re-running continues)
EXPORT_PREFIX = "lakehouse-complete-"  # the export's own files (a partial one is replaced on resume)
EXPORT_FILE_ROWS = 1_000_000  # rows per Parquet file of an export

PROVEN_NAMES = {r.name for r in PROVEN_READERS}


# ---------------------------------------------------------------------------------------------------------------
# The conditions


@dataclasses.dataclass(frozen=True)
class Checked:
    """What the checks found for one dataset: ``missing`` empty means complete may start."""

    dataset_id: uuid.UUID
    name: str
    missing: tuple[str, ...]
    native_since: dt.datetime | None
    soak_seconds: int
    snapshot_id: int | None
    verdict_id: int | None = None

    def refusal(self, lifecycle: str | None = None) -> FlipRefused:
        """``lifecycle``: the dataset's state in words (flags.lifecycle_words), named in the first line."""
        state = f", {lifecycle}" if lifecycle else ""
        lines = [
            f"refused: complete of dataset {self.name} ({self.dataset_id}){state}: {len(self.missing)} "
            "condition(s) not met; nothing written:"
        ]
        lines += [f"  - {m}" for m in self.missing]
        return FlipRefused("\n".join(lines))


def check(
    conn: psycopg.Connection,
    catalog: Catalog,
    settings: Settings,
    dataset_id: uuid.UUID,
    *,
    soak_seconds: int | None = None,
    now: dt.datetime | None = None,
) -> Checked:
    """Every condition of complete for one dataset, each missing one with what to do (nothing written).
    Long on purpose: the conditions in the order the docstring gives them, each beside its query."""
    ds = get_dataset(conn, dataset_id)
    ws_id = fetch_value(conn.execute("select workspace_id from datasets where id = %s", (dataset_id,)), "workspace")
    if ds.kind != "tabular":
        raise BadInput(f"dataset {dataset_id} is a {ds.kind} dataset; only tabular datasets are written to Iceberg")
    soak = current_soak(conn, settings).seconds if soak_seconds is None else soak_seconds
    now = now or fetch_value(conn.execute("select now()"), "the database clock")
    missing: list[str] = []

    # 1. native for at least the soak
    stored = stored_overrides(conn, WRITE, [w.name for w in FLIPPABLE_WRITERS])
    native = [w for w in FLIPPABLE_WRITERS if resolve_for(w, stored[w.name], dataset_id, ws_id) == NATIVE]
    since = None
    if not native:
        missing.append(
            "not written iceberg-native: no writer resolves to iceberg_native for it, so Postgres is still its "
            f"truth; flip its writers first (lakehouse write-flags flip <writer> --dataset {dataset_id}) and let "
            "them soak"
        )
    else:
        history = audit_history(conn, WRITE, [w.name for w in native])
        starts = [effective_since(history[w.name], w, dataset_id, ws_id, NATIVE) for w in native]
        known = [s for s in starts if s is not None]
        since = min(known) if known else None
        if since is None:
            missing.append(
                f"native by {', '.join(w.name for w in native)}, but no flag audit says since when (written outside "
                "the CLI?): set the writer again with lakehouse write-flags set <writer> iceberg_native "
                f"--dataset {dataset_id} to start its soak"
            )
        elif now < since + dt.timedelta(seconds=soak):
            missing.append(
                f"native since {since:%Y-%m-%d %H:%M:%S} UTC, under the soak of {soak} s: its soak "
                f"{until(since + dt.timedelta(seconds=soak), now)}; run complete again then"
            )

    # 2. reverse parity ok: the reverse on and caught up, the latest verdict at that snapshot agreeing
    state = reverse_states(conn, catalog, settings, [dataset_id])[0]
    snap = state.current_snapshot
    verdict_id = None
    if snap is None:
        missing.append(
            "it has no Iceberg snapshot: nothing would hold its rows once Postgres lets them go; sync it first "
            f"(lakehouse sync --dataset {dataset_id})"
        )
    elif native:
        if not state.enabled:
            missing.append(
                f"the reverse mirror is off for it ({state.source} setting), so Postgres may lack native rows: turn "
                f"it on (lakehouse write-flags reverse on --dataset {dataset_id}) and let it catch up"
            )
        elif not state.caught_up:
            at = state.position.snapshot_id if state.position else "none"
            missing.append(
                f"the reverse mirror is behind (its position is snapshot {at}, the table is at {snap}): apply what "
                f"is new (lakehouse write-flags reverse sync --dataset {dataset_id}), then run the canary"
            )
        else:
            verdict_id, why = _parity(conn, dataset_id, snap)
            if why:
                missing.append(why)

    # 3. no Postgres-locked consumer left
    if dataset_id in pipeline_input_dataset_ids(conn):
        missing.append(
            "BLOCKED (pipeline input): a pipeline reads it from dataset_rows (F3) and would read nothing once its "
            "rows are deleted; wait until the pipeline source reads Iceberg, or take it out of the pipeline"
        )
    locked = on_postgres(conn, {dataset_id: ws_id}).get(dataset_id)  # a compute reader flipped for it: not held
    if locked:
        names = ", ".join(d.describe() for d in locked)
        proven = [d.reader for d in locked if d.reader in PROVEN_NAMES]
        flip = (
            f"flip {', '.join(proven)} for it once its shadow reads prove it (lakehouse flags flip <reader> "
            f"--dataset {dataset_id}), or "
            if proven
            else ""
        )
        missing.append(
            f"read from dataset_rows by {names}, locked to Postgres: it would read nothing once complete; {flip}"
            "remove the declaration (lakehouse flags readers remove <reader> --dataset|--workspace <id>) only once "
            "it no longer reads this dataset"
        )
    # 4. no row holds a key the schema does not declare: Iceberg has no column for it and the export writes the
    # declared columns only, so complete would delete it for good (issue 42 item 5). One scan of the dataset's rows,
    # by the verb that is about to delete every one of them.
    extra = undeclared.find(conn, dataset_id, [c.name for c in ds.columns])
    if extra is not None:
        first = extra.keys[0][0] if extra.keys else "<key>"
        missing.append(
            f"{extra.rows} row(s) of dataset_rows hold {extra.key_count} key(s) its schema does not declare: "
            f"{extra.names()}; Iceberg does not hold them and --export-to would not keep them, so complete would "
            "delete them for good: declare them in datasets.schema and bring their values into the table (roll "
            "the writers back to pg, let the mirror carry them, flip again), or remove them from the rows if they "
            f"are not wanted (update dataset_rows set data = data - '{first}' where dataset_id = '{dataset_id}')"
        )
    return Checked(dataset_id, ds.name, tuple(missing), since, soak, snap, verdict_id)


def _parity(conn: psycopg.Connection, dataset_id: uuid.UUID, snapshot_id: int) -> tuple[int | None, str | None]:
    """(the verdict's id, why reverse parity is not ok or None): the newest recorded verdict must be at the table's
    current snapshot, say Postgres and Iceberg agree, and be taken at the dataset's Postgres version."""
    found = latest_verdicts(conn, [dataset_id]).get(dataset_id)
    run = f"run the canary (lakehouse canary --smoke --dataset {dataset_id}) until it says they agree"
    if found is None:
        return None, f"reverse parity unknown: no canary verdict is recorded; {run}"
    verdict_id = latest_verdict_id(conn, dataset_id)
    detail = found["detail"] or {}
    agrees = found["verdict"] == "ok" or (found["verdict"] == "native" and detail.get("agrees_with_postgres") is True)
    at = f"{found['checked_at']:%Y-%m-%d %H:%M:%S} UTC"
    if not agrees:
        return verdict_id, (
            f"reverse parity not ok: the latest canary verdict is {found['verdict']} ({at})"
            f"{'' if found['verdict'] != 'native' else ', Postgres differs from Iceberg'}; {run}"
        )
    if found["snapshot_id"] != snapshot_id:
        return verdict_id, (
            f"reverse parity not checked at the current snapshot: the latest verdict ({found['verdict']}, {at}) is "
            f"at snapshot {found['snapshot_id']}, the table is at {snapshot_id}; {run}"
        )
    version = fetch_value(conn.execute("select rows_version from datasets where id = %s", (dataset_id,)), "version")
    if found["pg_version"] is None or (version is not None and found["pg_version"] < version):
        return verdict_id, (
            f"Postgres was written since the canary checked it (version {found['pg_version']}, now {version}): "
            f"rows only Postgres holds would be lost; {run}"
        )
    return verdict_id, None


# ---------------------------------------------------------------------------------------------------------------
# Complete


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
                f"it, a rollback to pg needs a backfill first (lakehouse write-flags backfill --dataset {self.dataset_id})"
            )
        return (
            head
            + f"{self.rows_deleted} row(s) deleted in {self.batches} batch(es), stopped before the end (a backfill "
            "took it back); see lakehouse write-flags complete --status --dataset "
            f"{self.dataset_id}"
        )


def _audit(conn: psycopg.Connection, ds_id: uuid.UUID, event: str, actor: str, rows=None, detail=None) -> None:
    conn.execute(
        "insert into lakehouse_complete_audit (dataset_id, event, rows, detail, actor) values (%s, %s, %s, %s, %s)",
        (ds_id, event, rows, Jsonb(detail) if detail is not None else None, actor),
    )


def _check_export_dir(export_to: str | None, mark: Completed | None) -> Path | None:
    """The export directory: absent, or empty, or (resuming an export that did not finish) holding only the
    export's own files. Anything else is refused before anything is written."""
    if export_to in (None, ""):
        return None
    path = Path(str(export_to)).expanduser().resolve()
    if path.exists() and not path.is_dir():
        raise BadInput(f"--export-to {path} exists and is not a directory; give a new or empty directory")
    if path.is_dir():
        others = [p.name for p in path.iterdir() if not (mark is not None and p.name.startswith(EXPORT_PREFIX))]
        if others:
            raise BadInput(
                f"--export-to {path} is not empty ({len(others)} entr{'y' if len(others) == 1 else 'ies'}, e.g. "
                f"{sorted(others)[0]}); give a new or empty directory, nothing was written"
            )
    return path


def _check_scope_export_dir(conn: psycopg.Connection, export_to: str) -> Path:
    """The parent of a scope's exports (``<export_to>/<dataset id>`` each): absent, empty, or holding only the
    directories an earlier run of a complete made, so that a re-run resumes (item 8 of issue 42): a directory
    named by a dataset whose complete mark records it as its export. Each dataset then resumes (an export cut short
    is started over), is skipped (complete: its export finished before any row was deleted) or is refused alone.
    Anything else in the parent is refused before anything is written."""
    path = Path(str(export_to)).expanduser().resolve()
    if path.exists() and not path.is_dir():
        raise BadInput(f"--export-to {path} exists and is not a directory; give a new or empty directory")
    if not path.is_dir():
        return path
    entries = list(path.iterdir())
    ours = _exports_of_marks(conn, [p for p in entries if p.is_dir()])
    others = sorted(p.name for p in entries if p not in ours)
    if others:
        raise BadInput(
            f"--export-to {path} is not empty ({len(others)} entr{'y' if len(others) == 1 else 'ies'} that no earlier "
            f"complete exported, e.g. {others[0]}); give a new or empty directory, or the one an earlier run of this "
            "complete used (it holds only the datasets' export directories); nothing was written"
        )
    return path


def _exports_of_marks(conn: psycopg.Connection, dirs: list[Path]) -> set[Path]:
    """Of ``dirs``, those named by a dataset id whose complete mark (any status) records that directory as its
    export: an earlier run's own (one query)."""
    named: dict[uuid.UUID, Path] = {}
    for p in dirs:
        try:
            named[uuid.UUID(p.name)] = p
        except ValueError:
            continue
    if not named:
        return set()
    rows = export_targets(conn, list(named))
    return {named[d] for d, to in rows if to is not None and to == str(named[d])}


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
    batch = batch_rows or settings.complete_batch_rows
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
                    f"it first (lakehouse write-flags backfill --dataset {ds_id}); nothing was written"
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
                    what=f"write-flags complete --dataset {ds_id}",
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
        first = conn.execute("select min(row_index) from dataset_rows where dataset_id = %s", (ds_id,)).fetchone()
        start_mark(
            conn, ds_id, first[0] if first else None, str(path) if path else None, found.snapshot_id, actor, note
        )
        rows = fetch_value(conn.execute("select count(*) from dataset_rows where dataset_id = %s", (ds_id,)), "count")
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


def _export(conn: psycopg.Connection, ds_id: uuid.UUID, path: Path, chunk: int, actor: str) -> int:
    """The dataset's rows as Parquet into ``path`` (typed as its table, identity columns first, in row_index order),
    streamed: one chunk of rows in memory at a time, files of up to EXPORT_FILE_ROWS rows, each written as
    ``.partial`` and renamed when whole. Before any row is deleted; the mark records it done."""
    dataset = get_dataset(conn, ds_id)
    schema = arrow_schema(dataset.columns)
    path.mkdir(parents=True, exist_ok=True)
    for old in path.glob(EXPORT_PREFIX + "*"):  # an export a crash cut short: start it over
        old.unlink()
    n, part = 0, 0
    writer: pq.ParquetWriter | None = None
    current: Path | None = None

    def close() -> None:
        nonlocal writer
        if writer is not None and current is not None:
            writer.close()
            current.rename(current.with_suffix(""))
        writer = None

    with conn.transaction(), conn.cursor(name=f"lakehouse_complete_export_{ds_id.hex}") as cur:
        cur.itersize = chunk
        cur.execute(select_query(ds_id, dataset.columns, None, None))
        in_file = 0
        while rows := cur.fetchmany(chunk):
            columns = list(zip(*rows))
            table = pa.Table.from_arrays([pa.array(c, type=f.type) for c, f in zip(columns, schema)], schema=schema)
            if writer is None or in_file >= EXPORT_FILE_ROWS:
                close()
                current = path / f"{EXPORT_PREFIX}{ds_id}-{part:05d}.parquet.partial"
                writer, in_file, part = pq.ParquetWriter(current, schema), 0, part + 1
            writer.write_table(table)
            in_file += len(rows)
            n += len(rows)
            failpoint("complete-export-after-chunk")
    close()
    with conn.transaction():
        mark_exported(conn, ds_id)
        _audit(conn, ds_id, "export", actor, n, {"export_to": str(path), "files": part})
    return n


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
                    lo = fetch_value(
                        conn.execute("select min(row_index) from dataset_rows where dataset_id = %s", (ds_id,)),
                        "the dataset's lowest row_index",
                    )
                if lo is None:  # nothing left: finish (completing → complete)
                    with transition(
                        conn,
                        COMPLETE_VERB,
                        dataset_ids=[ds_id],
                        derive=derive,
                        actor=actor,
                        what=f"write-flags complete --dataset {ds_id} (finish)",
                    ):
                        mark_finished(conn, ds_id)
                        # a reverse position written meanwhile (none should be: the reverse is off): none holds
                        forget_position(conn, ds_id)
                        _audit(conn, ds_id, "finish", actor, mark.rows_deleted, {"batches": mark.batches})
                    return deleted, batches, COMPLETE
                hi_row = conn.execute(
                    "select row_index from dataset_rows where dataset_id = %s and row_index >= %s"
                    " order by row_index offset %s limit 1",
                    (ds_id, lo, batch - 1),
                ).fetchone()
                hi = hi_row[0] if hi_row else None
                cur = conn.execute(
                    "delete from dataset_rows where dataset_id = %s and row_index >= %s"
                    + ("" if hi is None else " and row_index <= %s"),
                    (ds_id, lo) if hi is None else (ds_id, lo, hi),
                )
                n = cur.rowcount
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
                    f"write-flags complete --dataset {ds_id} to continue"
                ) from None
            time.sleep(min(2.0, 0.05 * 2 ** min(waits, 6)))


# ---------------------------------------------------------------------------------------------------------------
# Wider scopes, the status, the way back


@dataclasses.dataclass(frozen=True)
class CompleteScope:
    completed: list[CompleteResult]
    refused: list[tuple[uuid.UUID, str]]  # (dataset, the refusal)

    def as_dict(self) -> dict:
        return {
            "completed": [c.as_dict() for c in self.completed],
            "refused": [{"dataset_id": str(d), "refusal": r} for d, r in self.refused],
        }


def scope_datasets(conn: psycopg.Connection, *, dataset=None, workspace=None) -> list[uuid.UUID]:
    """The datasets a complete at a scope takes: the one named, or the native tabular datasets of the workspace (or
    of every workspace) that are not complete yet."""
    scope = parse_scope(dataset, workspace)
    require_target(conn, scope)
    if scope.scope == DATASET:
        assert scope.scope_id is not None
        return [scope.scope_id]
    query = "select id from datasets where kind = 'tabular'" + (
        " and workspace_id = %s" if scope.scope == WORKSPACE else ""
    )
    ids = [r[0] for r in conn.execute(query, (scope.scope_id,) if scope.scope == WORKSPACE else ()).fetchall()]
    done = with_status(conn, COMPLETE, ids)
    return sorted((native_dataset_ids(conn, ids) - done), key=str)


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


def complete_status(conn: psycopg.Connection, dataset_id=None, *, limit: int = 50) -> dict:
    """The marks (one dataset's, or every one) and the audit, newest first."""
    ds_id = parse_uuid(dataset_id, "dataset id") if dataset_id not in (None, "") else None
    if ds_id is not None:
        get_dataset(conn, ds_id)
    where = sql.SQL("where dataset_id = %s" if ds_id else "")
    params: tuple = (ds_id,) if ds_id else ()
    marks = [completed_mark(conn, d) for d in marked_datasets(conn, ds_id)]
    audit = conn.execute(
        sql.SQL(
            "select id, at, dataset_id, event, rows, detail, actor from lakehouse_complete_audit {}"
            " order by id desc limit %s"
        ).format(where),
        (*params, limit),
    ).fetchall()
    keys = ("id", "at", "dataset_id", "event", "rows", "detail", "actor")
    return {"marks": [m for m in marks if m is not None], "audit": [dict(zip(keys, r)) for r in audit]}


@dataclasses.dataclass(frozen=True)
class RestoreResult:
    dataset_id: uuid.UUID
    snapshot_id: int | None
    copied: int
    pg_rows: int
    seconds: float

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "dataset_id": str(self.dataset_id), "restored": True}

    def summary(self) -> str:
        return (
            f"dataset {self.dataset_id}: was completed; backfilled from Iceberg snapshot {self.snapshot_id} in "
            f"{self.seconds:.2f}s — {self.copied} row(s) copied into dataset_rows (identity preserved), the reverse "
            "mirror on again for it, the complete mark lifted (restored); a rollback to pg needs nothing more now "
            f"(lakehouse write-flags set <writer> pg --dataset {self.dataset_id})"
        )


def restore(dsn: str, catalog: Catalog, settings: Settings, dataset_id, *, actor: str) -> RestoreResult | None:
    """The way back from complete: None when the dataset is not completed (the ordinary backfill applies). Otherwise
    the mark ``restoring`` (a complete still deleting stops at its next batch), the reverse on at dataset scope
    (audited), a full reverse re-sync from the table's current snapshot (one transaction, identity preserved, no
    echo), then the mark ``restored``. Resumable: re-running after a crash does what is left."""

    ds_id = parse_uuid(dataset_id, "dataset id")
    started = time.perf_counter()
    with connect(dsn) as conn:
        get_dataset(conn, ds_id)
        mark = completed_mark(conn, ds_id)
        if mark is None or not mark.holding:
            return None
        if not native_dataset_ids(conn, [ds_id]):
            raise BadInput(
                f"dataset {ds_id} was completed, and no writer resolves to iceberg_native for it any more (a flag "
                "changed outside the flip gates): set its writer back (lakehouse write-flags set <writer> "
                f"iceberg_native --dataset {ds_id}), then backfill; nothing was written"
            )
        start_restore(conn, ds_id, actor)
    r = apply_reverse(dsn, catalog, settings, ds_id, actor=actor, full=True)
    with connect(dsn) as conn:
        finish_restore(conn, ds_id, actor, r.copied, r.snapshot_id)
    return RestoreResult(ds_id, r.snapshot_id, r.copied, r.pg_rows, time.perf_counter() - started)


def start_restore(conn: psycopg.Connection, ds_id: uuid.UUID, actor: str) -> None:
    """complete / completing → restoring, the reverse on with it: one transition (a batch in flight finishes first)."""
    from lakehouse_dagster.flags.reverse_setting import set_reverse  # lazy: only where a restore runs

    what = f"write-flags backfill --dataset {ds_id}"
    with transition(conn, RESTORE, dataset_ids=[ds_id], derive=derive, actor=actor, what=what):
        mark = completed_mark(conn, ds_id, for_update=True)  # waits for a batch in flight
        assert mark is not None
        if mark.status != RESTORING:
            set_status(conn, ds_id, RESTORING)
            _audit(conn, ds_id, "restore", actor, None, {"was": mark.status, "rows_deleted": mark.rows_deleted})
        set_reverse(conn, True, dataset=ds_id, note="backfill after complete", actor=actor)


def finish_restore(conn: psycopg.Connection, ds_id: uuid.UUID, actor: str, copied: int, snapshot_id) -> None:
    """restoring → native, once the full re-sync has landed every row in dataset_rows."""
    what = f"write-flags backfill --dataset {ds_id}"
    with transition(conn, RESTORE, dataset_ids=[ds_id], derive=derive, actor=actor, what=what):
        mark_restored(conn, ds_id)
        _audit(conn, ds_id, "restored", actor, copied, {"snapshot_id": snapshot_id})


def backfill_or_restore(dsn: str, catalog: Catalog, settings: Settings, dataset_id, *, actor: str):
    """`lakehouse write-flags backfill` and the backfill job: a completed dataset is restored (``restore``), any other
    backfilled as after a rollback (runbooks/backfill.py)."""
    restored = restore(dsn, catalog, settings, dataset_id, actor=actor)
    if restored is not None:
        return restored
    return backfill(dsn, catalog, settings, dataset_id, actor=actor)
