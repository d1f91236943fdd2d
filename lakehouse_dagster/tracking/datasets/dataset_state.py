"""A dataset's status, error and row count in ``datasets`` (issue 45: the table's owner): what a write leaves
there, the pg path's and the native path's alike."""

from __future__ import annotations

import uuid

import psycopg
from psycopg import sql

from lakehouse_dagster.core.db import fetch_value
from lakehouse_dagster.core.errors import LakehouseError


def mark_errored(conn: psycopg.Connection, dataset_id: uuid.UUID, error: str) -> None:
    """The dataset ``errored`` with ``error`` (fail loud: a refused or failed write)."""
    conn.execute(
        "update datasets set status = 'errored', error = %s, updated_at = now() where id = %s", (error, dataset_id)
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


def mark_ready_with_row_count(conn: psycopg.Connection, dataset_id: uuid.UUID, total: int) -> None:
    """Ready, with the row count the table holds (an interrupted native write whose commit landed)."""
    conn.execute(
        "update datasets set status = 'ready', error = null, row_count = %s, updated_at = now() where id = %s",
        (total, dataset_id),
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


def row_count(conn: psycopg.Connection, dataset_id: uuid.UUID, missing: str | LakehouseError) -> int | None:
    """datasets.row_count; ``missing``: what to raise when the dataset is gone."""
    return fetch_value(conn.execute("select row_count from datasets where id = %s", (dataset_id,)), missing)


def converge_row_count(conn: psycopg.Connection, dataset_id: uuid.UUID, count: int) -> None:
    """Set datasets.row_count to ``count`` unless it already is (no new row version when nothing changes)."""
    conn.execute(
        "update datasets set row_count = %s, updated_at = now() where id = %s and row_count is distinct from %s",
        (count, dataset_id, count),
    )


def set_row_count(conn: psycopg.Connection, dataset_id: uuid.UUID, count: int) -> None:
    """Set datasets.row_count, nothing else (the demo's seed)."""
    conn.execute("update datasets set row_count = %s where id = %s", (count, dataset_id))
