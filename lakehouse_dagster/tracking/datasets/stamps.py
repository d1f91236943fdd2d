"""What the mirror and the WAL consumer write on a dataset's row: its status after a sync, its version stamps (the
change tracking the triggers would write: rows_version, rows_xid, the rewrite version, max_row_index)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import psycopg


def mark_errored(conn: psycopg.Connection, dataset_id: uuid.UUID, message: str) -> None:
    conn.execute(
        "update datasets set status = 'errored', error = %s, updated_at = now() where id = %s",
        (message, dataset_id),
    )


def mark_ready(conn: psycopg.Connection, dataset_id: uuid.UUID, row_count: int) -> None:
    conn.execute(
        "update datasets set row_count = %s, status = 'ready', error = null, updated_at = now() where id = %s",
        (row_count, dataset_id),
    )


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
