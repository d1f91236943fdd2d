"""What writes leave on a dataset's row in ``datasets`` (issue 45: the table's one owner): its status, error and
row count after a sync, an ingest or a native write; its version stamps (the change tracking the WAL consumer
writes in place of the triggers: rows_version, rows_xid, the rewrite version, max_row_index); its stored source.
Each is the one statement its callers ran (the mirror's sync and the WAL consumer are hot paths)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb


def mark_errored(conn: psycopg.Connection, dataset_id: uuid.UUID, message: str) -> None:
    """The dataset ``errored`` with ``message`` (fail loud: a refused or failed write, a failed sync)."""
    conn.execute(
        "update datasets set status = 'errored', error = %s, updated_at = now() where id = %s",
        (message, dataset_id),
    )


def mark_ready(conn: psycopg.Connection, dataset_id: uuid.UUID, row_count: int) -> None:
    """Ready, with the row count the dataset holds (a sync's total; an interrupted native write whose commit
    landed: the table's)."""
    conn.execute(
        "update datasets set row_count = %s, status = 'ready', error = null, updated_at = now() where id = %s",
        (row_count, dataset_id),
    )


def mark_ready_after_native_write(
    conn: psycopg.Connection, dataset_id: uuid.UUID, total: int | None, iceberg_mode: str | None, rows: int
) -> None:
    """A native write committed: ready, its row count the table's ``total`` when known, otherwise the ``rows``
    written (a replace) or added to the count (an append)."""
    conn.execute(
        "update datasets set status = 'ready', error = null, updated_at = now(),"
        " row_count = coalesce(%s, case when %s = 'replace' then %s else coalesce(row_count, 0) + %s end)"
        " where id = %s",
        (total, iceberg_mode, rows, rows, dataset_id),
    )


def ready_after_pg_ingest_statement(dataset_id: uuid.UUID, rows: int, *, replace: bool) -> sql.Composed:
    """The pg path's last statement, committed with the rows on the ingest's own session: ready, the row count
    ``rows`` (a replace) or raised by them."""
    count = (
        sql.SQL("{}").format(sql.Literal(rows))
        if replace
        else sql.SQL("coalesce(row_count, 0) + {}").format(sql.Literal(rows))
    )
    return sql.SQL(
        "update datasets set row_count = {}, status = 'ready', error = null, updated_at = now() where id = {}::uuid"
    ).format(count, sql.Literal(str(dataset_id)))


def converge_row_count(conn: psycopg.Connection, dataset_id: uuid.UUID, count: int) -> None:
    """Set datasets.row_count to ``count`` unless it already is (no new row version when nothing changes)."""
    conn.execute(
        "update datasets set row_count = %s, updated_at = now() where id = %s and row_count is distinct from %s",
        (count, dataset_id, count),
    )


def set_row_count(conn: psycopg.Connection, dataset_id: uuid.UUID, count: int) -> None:
    """Set datasets.row_count, nothing else (the demo's seed)."""
    conn.execute("update datasets set row_count = %s where id = %s", (count, dataset_id))


def mark_all_changed(conn: psycopg.Connection, version: int) -> int:
    """Every dataset has changed (a new version, a rewrite, an unknown max), as after a TRUNCATE; how many."""
    return conn.execute(
        "update datasets set rows_version = %s, rows_rewrite_version = %s,"
        " rows_xid = pg_current_xact_id(), max_row_index = null",
        (version, version),
    ).rowcount


def lock_for_tracking(conn: psycopg.Connection, ids: Sequence[uuid.UUID]) -> list[tuple]:
    """(id, max_row_index, rows_rewrite_version) of those datasets, their rows locked in id order with NOWAIT
    (psycopg.errors.LockNotAvailable when another transaction holds one)."""
    return conn.execute(
        "select id, max_row_index, rows_rewrite_version from datasets where id = any(%s::uuid[])"
        " order by id for no key update nowait",
        (ids,),
    ).fetchall()


def write_tracking(conn: psycopg.Connection, updates: Sequence[tuple]) -> None:
    """Each (id, version, rewrote, max_row_index): the new stamps, in one statement."""
    conn.execute(
        "update datasets d set rows_version = u.v, rows_xid = pg_current_xact_id(), max_row_index = u.mx,"
        " rows_rewrite_version = case when u.rw then u.v else d.rows_rewrite_version end"
        " from unnest(%s::uuid[], %s::bigint[], %s::bool[], %s::bigint[]) u(id, v, rw, mx) where d.id = u.id",
        ([u[0] for u in updates], [u[1] for u in updates], [u[2] for u in updates], [u[3] for u in updates]),
    )


def store_source(conn: psycopg.Connection, dataset_id: uuid.UUID, source: dict) -> None:
    """Store a validated source spec (its JSON form)."""
    conn.execute("update datasets set source = %s, updated_at = now() where id = %s", (Jsonb(source), dataset_id))


def seed_source(conn: psycopg.Connection, dataset_id: uuid.UUID, source: dict) -> None:
    """Set the source of a dataset the demo has just created (updated_at left as created)."""
    conn.execute("update datasets set source = %s where id = %s", (Jsonb(source), dataset_id))
