"""The reverse mirror: Iceberg → ``dataset_rows`` for a dataset written iceberg-native (issue 31, first slice).

A native write lands in Iceberg only, so Postgres goes stale for the dataset, and rolling the writer back needs a
backfill (runbooks/backfill.py). With the reverse on (flags/reverse_setting.py: the default), each native commit
is applied to ``dataset_rows`` as well, and a rollback needs nothing: Postgres already holds every row.

  * Position: ``lakehouse_reverse_position`` holds the last snapshot applied, written in the SAME transaction as
    the rows, together with a ``lakehouse_pg_reconciled`` row (how ``reverse``) that ends the native marker's walk
    (mirror/native_run.py) there, so the mirror's refusal lifts once the reverse is caught up. A crash leaves
    Postgres as of a whole snapshot and the position saying which; the next apply starts from there.
  * What is copied: after native appends only, the data files those snapshots added (the native marker's walk
    from the current snapshot back to the position, ``iceberg_only``), rows whose ``row_index`` Postgres already
    holds skipped; anything else (an overwrite, a compaction, a position no longer in the table's history, a
    copy that does not reproduce the snapshot's row count) is a full reverse re-sync: the dataset's rows become
    the current snapshot's. Identity is preserved (``__row_id``, ``__row_index``, ``__created_at``).
  * No echo: the transaction sets ``lakehouse.reverse_apply`` (``set local``), which the change-tracking triggers
    honour (migration 033): no rows_version, rows_xid or row ranges move, so the forward poller, the sweep and the
    recorder see no write of the live app. The digest triggers still run. In capture mode after-commit, where a
    WAL consumer writes change tracking after the commit (tracking/capture/) and cannot see the setting, the
    transaction also emits a transactional logical message (prefix ``capture.REVERSE_PREFIX``) that the
    consumer's stream carries inside it: the consumer writes no tracking for it and keeps its digest deltas. The
    mode is read under the table lock the capture switch waits for, so it cannot change before the commit.
  * Under the dataset lock (G3): no mirror, backfill or native write of the dataset runs meanwhile.

Plain Python; nothing here knows who calls it. The mirror stream (mirror/stream.py) drives it for its shard
(``native_commits`` each poll, ``due_datasets`` each sweep), the mirror_poller sensor for the datasets no live
stream covers (a reverse_mirror_job run per due dataset, dagster/defs/mirror/reverse_job.py).
"""

from __future__ import annotations

import logging
import time
import uuid

import psycopg
import pyarrow as pa
from psycopg import sql
from pyiceberg.catalog import Catalog

from lakehouse_dagster.core.db import adbc_uri, connect, fetch_value
from lakehouse_dagster.core.errors import BadInput, LakehouseError, first_line, postgres_unreachable
from lakehouse_dagster.core.failpoints import failpoint
from lakehouse_dagster.core.failpoints import validate as validate_failpoints
from lakehouse_dagster.core.guards import check_held, dataset_lock, first_native_hold
from lakehouse_dagster.core.ids import parse_uuid
from lakehouse_dagster.core.settings import ReverseSettings, Settings
from lakehouse_dagster.lake.catalog import load_table_or_none, table_identifier
from lakehouse_dagster.lake.copy_back import (
    IDENTITY,
    ROWS_SCHEMA,
    Prefetched,
    client_jsonb_supported,
    counted,
    data_expr,
    paced,
    rows_batches,
    snapshot_batches,
)
from lakehouse_dagster.lake.errors import ClientJsonbUnsupported
from lakehouse_dagster.lake.foreign import live_rows
from lakehouse_dagster.mirror import reverse_lag
from lakehouse_dagster.mirror.errors import PostgresWritten
from lakehouse_dagster.mirror.native_run import iceberg_only
from lakehouse_dagster.mirror.reverse_refusals import _refusal, _refuse, _refuse_postgres_written, shared_row_index
from lakehouse_dagster.mirror.reverse_state import (
    _TMP,
    ACTOR,
    APPEND,
    FULL,
    GUC,
    NOOP,
    CommitCursor,
    ReverseBatch,
    ReversePosition,
    ReverseResult,
    ReverseState,
    due_datasets,
    latest_snapshots,
    native_commits,
    position,
    positions,
    reverse_states,
)
from lakehouse_dagster.parity.maintained import FILL_LOCK
from lakehouse_dagster.tracking import capture, digest_sums, sync_log
from lakehouse_dagster.tracking.datasets import Column, get_dataset, reverse_apply
from lakehouse_dagster.tracking.datasets import rows as dataset_rows
from lakehouse_dagster.tracking.undeclared import has_undeclared

# The reverse mirror's face: every name callers import from mirror.reverse, wherever it lives now.
__all__ = [
    "ACTOR",
    "APPEND",
    "FULL",
    "GUC",
    "NOOP",
    "CommitCursor",
    "PostgresWritten",
    "ReverseBatch",
    "ReversePosition",
    "ReverseResult",
    "ReverseState",
    "_refuse_postgres_written",  # the lifecycle model checks it on its own (testing/lifecycle_model.py)
    "apply_due",
    "apply_reverse",
    "due_datasets",
    "latest_snapshots",
    "native_commits",
    "position",
    "positions",
    "reverse_states",
]


_log = logging.getLogger(__name__)


def _count(conn: psycopg.Connection, ds_id: uuid.UUID) -> int:
    return dataset_rows.count_rows(conn, ds_id)


def _total_records(snap) -> int | None:
    """The rows the snapshot holds: its total records less its position deletes (another engine's DELETE/UPDATE
    writes delete files, DuckDB's among them: counted with total-records alone, every later append looked short of
    rows and became a full re-sync). Equality deletes are not subtracted: such a table is re-synced in full."""
    return live_rows(snap)


def apply_reverse(
    dsn: str,
    catalog: Catalog,
    settings: Settings,
    dataset_id,
    *,
    actor: str = ACTOR,
    full: bool = False,
    lock_timeout_s: float = 1800,
) -> ReverseResult:
    """Bring ``dataset_rows`` to the table's current snapshot (see the module docstring); ``full``: re-sync in
    full even when only appends are new. Refused (BadInput, nothing written) for a dataset that is not written
    natively, whose reverse is off, or in capture mode after-commit on a server older than PostgreSQL 14
    (``capture.reverse_blocked``)."""
    ds_id = parse_uuid(dataset_id, "dataset id")
    validate_failpoints()
    started = time.perf_counter()
    with connect(dsn) as conn:
        dataset = get_dataset(conn, ds_id)
        if dataset.kind != "tabular":
            raise BadInput(f"dataset {ds_id} is a {dataset.kind} dataset; only tabular datasets have Iceberg rows")
        # a write flip's first native snapshot waits for its canary's verdict (core/guards.py first_native_hold)
        with (
            first_native_hold(conn, ds_id, waiting=True, timeout_s=lock_timeout_s),
            dataset_lock(conn, ds_id, timeout_s=lock_timeout_s),
        ):
            locked = time.perf_counter()
            _refuse(conn, ds_id)
            at = position(conn, ds_id)
            if not full:  # O(1), before any NOOP answer: a raw write into a caught-up dataset is reported now
                _refuse_postgres_written(conn, ds_id, at)
            checked = time.perf_counter()
            table = load_table_or_none(catalog, table_identifier(settings, ds_id))
            current = table.current_snapshot() if table is not None else None
            if table is None or current is None:
                return ReverseResult(
                    ds_id, NOOP, None, 0, 0, _count(conn, ds_id), 0.0, "the dataset has no Iceberg table yet"
                )
            if at is not None and at.snapshot_id == current.snapshot_id and not full:
                return ReverseResult(
                    ds_id,
                    NOOP,
                    current.snapshot_id,
                    0,
                    0,
                    _count(conn, ds_id),
                    time.perf_counter() - started,
                    f"already at snapshot {current.snapshot_id}",
                )
            loaded = time.perf_counter()
            how, files, reason = _plan(conn, catalog, settings, ds_id, table, full)
            _log.debug(
                "reverse prepare phases: lock %.3fs, checks %.3fs, table load %.3fs, plan %.3fs",
                locked - started,
                checked - locked,
                loaded - checked,
                time.perf_counter() - loaded,
            )
            present = {f.name for f in table.schema().fields}
            columns = [c for c in dataset.columns if c.name in present]
            names = [*(n for n in IDENTITY if n in present), *(c.name for c in columns)]
            how, copied, removed, n, reason = _apply_or_refuse(
                conn, dsn, table, current, ds_id, columns, names, how, files, reason, actor, settings.reverse
            )
            failpoint("reverse-after-commit")
    return ReverseResult(ds_id, how, current.snapshot_id, copied, removed, n, time.perf_counter() - started, reason)


def _apply_or_refuse(
    conn, dsn, table, current, ds_id, columns, names, how, files, reason, actor, reverse: ReverseSettings
):
    """``_apply``, its unique violation on ``dataset_rows`` (two of the snapshot's rows at one row_index: another
    engine's append reusing an index) refused in one line; its transaction was never committed."""
    try:
        return _apply(conn, dsn, table, current, ds_id, columns, names, how, files, reason, actor, reverse.resync_share)
    except Exception as exc:
        if "dataset_rows_pkey" not in str(exc):  # not ours
            raise
        raise shared_row_index(ds_id, current.snapshot_id, exc) from None


def _plan(conn, catalog, settings, ds_id, table, full: bool) -> tuple[str, tuple[str, ...], str]:
    """(append | full, the data files an append copies, why)."""
    if full:
        return FULL, (), "a full re-sync was asked for"
    try:
        found = iceberg_only(conn, catalog, settings, ds_id, table=table, native=True)  # _refuse: it is native
    except BadInput as exc:  # the walk cannot tell which snapshots are new (an expired parent)
        return FULL, (), f"which snapshots are new cannot be told ({first_line(exc)[:120]})"
    if found is None:
        return APPEND, (), "Postgres already holds every row of the current snapshot"
    if found.replaced:
        return (
            FULL,
            (),
            f"{found.snapshots} native snapshot(s) since the position, one rewrote the table{found.foreign_clause()}",
        )
    if found.added_files is None:
        return FULL, (), "which data files the new snapshots added cannot be told (unreadable manifests, or files "
        "another Iceberg engine rewrote since)"
    return (
        APPEND,
        found.added_files,
        f"{found.snapshots} native append snapshot(s) since the position{found.foreign_clause()}",
    )


def _apply(  # noqa: C901
    pg: psycopg.Connection,
    dsn: str,
    table,
    current,
    ds_id: uuid.UUID,
    columns: list[Column],
    names: list[str],
    how: str,
    files: tuple[str, ...],
    reason: str,
    actor: str,
    share: float,
) -> tuple[str, int, int, int, str]:
    """The rows, the position and the reconciliation in ONE transaction on an ADBC session (binary COPY from
    Arrow), marked with ``lakehouse.reverse_apply`` (no echo). An append that does not reproduce the snapshot
    (Postgres holds another row at an appended row_index, or its count is not the snapshot's: rows the table does
    not hold, or some lacking below the position) is rolled back and becomes a full re-sync, in a transaction of
    its own (REPEATABLE READ: the delete's digest shortcut needs one snapshot). Returns (how, copied, removed, pg
    rows, why). Long on purpose: everything that must commit together is in this one
    transaction, in order (as the backfill's); split, the transaction boundary would hide between functions."""
    import adbc_driver_postgresql.dbapi as adbc  # lazy: the ADBC driver (native) only where a reverse apply runs

    tmp, ds = sql.Identifier(_TMP), sql.Literal(str(ds_id))
    expected = _total_records(current)
    phases: dict[str, float] = {}
    mark = [time.perf_counter()]

    def took(what: str) -> None:  # the phases' seconds, for the debug line (bench/bench_reverse.py reads it)
        now = time.perf_counter()
        phases[what] = phases.get(what, 0.0) + now - mark[0]
        mark[0] = now

    with adbc.connect(adbc_uri(dsn)) as conn:  # not autocommit: everything below commits together
        cur = conn.cursor()

        def one(stmt: sql.Composable) -> int:
            cur.execute(stmt.as_string(pg))
            return int(fetch_value(cur, "the result of a reverse apply statement"))

        def run(stmt: sql.Composable) -> None:
            cur.execute(stmt.as_string(pg))

        def stage(only: tuple[str, ...] | None) -> None:
            run(sql.SQL("drop table if exists {t}").format(t=tmp))
            cur.adbc_ingest(
                _TMP, snapshot_batches(table, current.snapshot_id, names, only), mode="create", temporary=True
            )
            if only is not None:  # an append joins the staged rows with dataset_rows: the planner needs their count
                run(sql.SQL("analyze {t}").format(t=tmp))
            took("stage")

        def begin(full: bool) -> str:
            """Start the transaction, marked as the reverse's (no echo); returns the capture mode it runs in."""
            if full:  # one snapshot for the whole re-sync: what its digest shortcut relies on (below)
                run(sql.SQL("set transaction isolation level repeatable read"))
            run(sql.SQL("set local timezone to 'UTC'"))
            run(sql.SQL("set local {} = 'on'").format(sql.Identifier(*GUC.split("."))))
            # The capture switch takes SHARE ROW EXCLUSIVE on dataset_rows: under this lock (which every write of
            # ours takes anyway) the mode read next holds until the commit. Before any query, so that a re-sync's
            # REPEATABLE READ snapshot is taken after it (LOCK takes none) and sees the mode it runs in.
            run(reverse_apply.LOCK_ROWS)
            run(capture.MODE_AND_MESSAGES)
            row = cur.fetchone()
            mode, messages = (row[0], bool(row[1])) if row else (capture.TRIGGERS, True)
            if mode == capture.AFTER_COMMIT:
                if not messages:  # a switch since _refuse looked
                    raise BadInput(
                        f"dataset {ds_id}: the reverse mirror cannot run: capture mode is after-commit on "
                        "PostgreSQL < 14 (capture.reverse_blocked); nothing was written"
                    )
                # no echo for the WAL consumer, which cannot see the setting: it skips this transaction's tracking
                run(
                    sql.SQL("select pg_logical_emit_message(true, {}, {})").format(
                        sql.Literal(capture.REVERSE_PREFIX), ds
                    )
                )
            return str(mode)

        insert = reverse_apply.insert_staged(ds, data_expr(columns), tmp)

        copied = removed = 0
        mode = begin(how == FULL)
        took("connect")
        if how == APPEND:
            if files:
                stage(files)
                # few staged rows: index probes of the primary key (a nested loop), not a scan of the dataset's rows
                copied = one(counted(reverse_apply.insert_staged_missing(insert, ds)))
                took("insert")
                # a row Postgres holds at one of those row_index values under another identity: not the table's row
                clash = one(reverse_apply.staged_clashes(tmp, ds))
                took("clash")
                if clash:
                    how, reason = FULL, f"{reason}, but Postgres holds {clash} other row(s) at their row_index"
            if how == APPEND:
                # counted: datasets.row_count is the reverse's own figure (the live app's writes do not keep it),
                # and the datasets row moves with every native commit (the write router's status), so it cannot
                # tell that nothing wrote the dataset since the position either; an index-only scan of the key
                n = one(reverse_apply.count_rows(ds))
                took("count")
                if expected is not None and n != expected:
                    how = FULL
                    reason = f"{reason}, but Postgres would hold {n} row(s) where the snapshot has {expected}"
            if how == FULL:  # nothing of the append is kept: the re-sync runs in a transaction of its own
                conn.rollback()
                mode = begin(True)

        def resync(fast: bool) -> tuple[int, int]:
            """The full re-sync's rows: (removed, copied). ``fast``: the rows COPYed straight into dataset_rows, their
            jsonb built client-side (``rows_batches``), no staging table and no insert; else staged and inserted."""
            if not fast:
                stage(None)
            # the snapshot's rows read and built on a thread from here: the first batches are ready when the delete ends
            pre = (
                Prefetched(rows_batches(snapshot_batches(table, current.snapshot_id, names), ds_id, columns))
                if fast
                else None
            )
            try:
                return _resync_rows(pre)
            finally:
                if pre is not None:
                    pre.close()

        def _resync_rows(pre: Prefetched | None) -> tuple[int, int]:
            # The digest shortcut: deleting every row of the dataset cancels its maintained sums exactly, so when
            # they are filled the delete is not hashed row by row (lakehouse_digest_rows skips the dataset named
            # in lakehouse.reverse_resync) and the sums this snapshot sees go instead. Exact under REPEATABLE READ:
            # the delete removes just the rows this snapshot sees (one changed meanwhile: a serialization failure,
            # the apply is retried), the deltas it sees are theirs; fills and compactions hold FILL_LOCK. Capture
            # mode triggers only: in after-commit the digest triggers are off and the WAL consumer hashes the delete
            # from the stream after the commit (exact: REPLICA IDENTITY FULL gives it every old row), and the
            # deltas this snapshot sees may lack writes it has not applied yet.
            shortcut = mode == capture.TRIGGERS and one(digest_sums.filled_under_fill_lock(FILL_LOCK, ds))
            if shortcut:
                run(sql.SQL("select set_config('lakehouse.reverse_resync', {ds}, true)").format(ds=ds))
            # In the same pass, the deleted rows holding keys the table has no column for: the re-sync would erase
            # them from Postgres (issue 42 item 5), so it is refused and rolled back, naming them.
            cur.execute(reverse_apply.delete_rows_counting(ds, has_undeclared([c.name for c in columns])).as_string(pg))
            removed, erasing = (int(x) for x in cur.fetchone())
            if erasing:
                raise _refusal(pg, ds_id, columns, erasing)
            if shortcut:
                run(digest_sums.delete_deltas(ds))
                run(sql.SQL("select set_config('lakehouse.reverse_resync', '', true)"))
            took("delete")
            if pre is None:
                copied = one(counted(insert))
                took("insert")
                return removed, copied
            rows = [0]

            def batches():
                try:
                    for b in paced(iter(pre), share):  # LAKEHOUSE_REVERSE_RESYNC_SHARE: room for the live app
                        rows[0] += b.num_rows
                        yield b
                except ClientJsonbUnsupported as exc:
                    unsupported.append(str(exc))
                    raise

            reverse_apply.ingest(cur, pa.RecordBatchReader.from_batches(ROWS_SCHEMA, batches()))
            took("copy")
            return removed, rows[0]

        if how == FULL:
            unsupported: list[str] = []
            fast = client_jsonb_supported(columns, names)
            try:
                removed, copied = resync(fast)
            except Exception:
                if not unsupported:
                    raise
                # a value the client cannot write as Postgres would: the same re-sync through the staging table
                _log.info("reverse of dataset %s: staged, not built client-side (%s)", ds_id, unsupported[0])
                conn.rollback()
                mode = begin(True)
                removed, copied = resync(False)
            n = copied
        failpoint("reverse-after-copy")
        run(reverse_apply.set_totals(n, ds))
        run(reverse_lag.position_statement(ds, current.snapshot_id, how, copied, removed, n))
        # one reverse record per dataset: the native marker's walk stops at the newest reconciled snapshot anyway
        for statement in sync_log.reconciled_by_reverse(ds, current.snapshot_id, copied, removed, actor):
            run(statement)
        took("bookkeeping")
        failpoint("reverse-before-commit")
        # a process frozen here whose lock session died stands down: another apply may own it now
        check_held("nothing of this apply is committed; the next apply starts again from the position", "reverse apply")
        conn.commit()
        took("commit")
    _log.debug("reverse %s phases: %s", how, ", ".join(f"{k} {v:.3f}s" for k, v in phases.items()))
    _log.info("reverse %s: dataset %s at snapshot %s, %d row(s) copied", how, ds_id, current.snapshot_id, copied)
    return how, copied, removed, n, reason


def apply_due(
    dsn: str, catalog: Catalog, settings: Settings, *, actor: str = ACTOR, lock_timeout_s: float = 5
) -> ReverseBatch:
    """Apply every dataset ``due_datasets`` names (the no-ops left out of ``applied``). One dataset's failure
    does not stop the others (each is its own transaction); a dataset whose lock is held (a native write in
    flight) fails with LockTimeout and is found again by the next call."""
    applied, failed = [], []
    with connect(dsn) as conn:
        due = due_datasets(conn)
    for ds_id in due:
        try:
            r = apply_reverse(dsn, catalog, settings, ds_id, actor=actor, lock_timeout_s=lock_timeout_s)
        except Exception as exc:  # noqa: BLE001 - ours, psycopg's, I/O, or the ADBC session lost: one line each
            if not isinstance(exc, (LakehouseError, psycopg.Error, OSError)) and postgres_unreachable(exc) is None:
                raise
            failed.append((ds_id, f"{type(exc).__name__}: {first_line(exc)}"))
            continue
        if r.how != NOOP:
            applied.append(r)
    return ReverseBatch(applied, failed)
