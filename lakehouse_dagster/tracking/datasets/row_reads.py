"""Reads of ``dataset_rows`` (issue 45: the table's owner): the Postgres read path's statement, the structured
read's source, counts and row_index bounds. Each is one statement, as its callers ran it before."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import psycopg
from psycopg import sql

from lakehouse_dagster.core.db import fetch_value

# The table's name where a message names it to the operator (a summary, a refusal, the statement it may run).
ROWS_TABLE = "dataset_rows"

# The source of a structured read's typed subquery (routing/pg_compute.py): the projection before it, the
# addressing conditions after it.
FROM_ROWS_WHERE = sql.SQL(" from dataset_rows where ")


def projected_rows_query(
    exprs: Sequence[sql.Composable], dataset_id: uuid.UUID, *, order_by_row_index: bool, limit: int | None
) -> tuple[sql.Composed, list]:
    """A dataset's rows as the typed expressions ``exprs`` (routing/pg_reader.py's projection) and its parameters."""
    query = sql.SQL("select {} from dataset_rows where dataset_id = %s").format(sql.SQL(", ").join(exprs))
    params: list = [dataset_id]
    if order_by_row_index:
        query += sql.SQL(" order by row_index")
    if limit is not None:
        query += sql.SQL(" limit %s")
        params.append(limit)
    return query, params


def count_rows(conn: psycopg.Connection, dataset_id: uuid.UUID) -> int:
    """The dataset's rows in dataset_rows, exactly (an index-only scan of its primary key range)."""
    return fetch_value(
        conn.execute("select count(*) from dataset_rows where dataset_id = %s", (dataset_id,)),
        "the count of the dataset's rows",
    )


def min_row_index(conn: psycopg.Connection, dataset_id: uuid.UUID) -> int | None:
    """The dataset's lowest row_index (None: no rows)."""
    return fetch_value(
        conn.execute("select min(row_index) from dataset_rows where dataset_id = %s", (dataset_id,)),
        "the dataset's lowest row_index",
    )


def max_row_index(conn: psycopg.Connection, dataset_id: uuid.UUID) -> int:
    """The dataset's highest row_index, -1 when it has no rows."""
    return fetch_value(
        conn.execute("select coalesce(max(row_index), -1) from dataset_rows where dataset_id = %s", (dataset_id,)),
        "the dataset's max row index",
    )


def nth_row_index_from(conn: psycopg.Connection, dataset_id: uuid.UUID, lo: int, n: int) -> int | None:
    """The row_index of the dataset's ``n``-th row (1-based) at or above ``lo``, None when it has fewer: the end of
    a batch of ``n`` rows (complete's batched delete)."""
    row = conn.execute(
        "select row_index from dataset_rows where dataset_id = %s and row_index >= %s"
        " order by row_index offset %s limit 1",
        (dataset_id, lo, n - 1),
    ).fetchone()
    return row[0] if row else None


def rows_table_missing(conn: psycopg.Connection) -> bool:
    """Whether the database has no app tables yet (``lakehouse db migrate`` not run)."""
    return fetch_value(
        conn.execute("select to_regclass('dataset_rows') is null"), "whether the lakehouse schema exists"
    )
