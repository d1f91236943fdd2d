"""Reads of ``dataset_rows`` (issue 45: the table's one owner): counts and row-index bounds, the Postgres read
path's projection, the structured read's source, the pinned read's query, the undeclared-keys scan. Each is the one
statement its callers ran before the move (hot paths: same text, same round trips)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import psycopg
from psycopg import sql

from lakehouse_dagster.core.db import fetch_one, fetch_value

# The table's name, for what names it as data rather than in a statement: a WAL relation (tracking/capture.py), a
# message to the operator ("copies them back into dataset_rows").
TABLE = "dataset_rows"


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


def max_row_indexes(conn: psycopg.Connection, ids: Sequence[uuid.UUID]) -> dict:
    """{dataset: its greatest row_index} of those of ``ids`` that have rows."""
    return dict(
        conn.execute(
            "select dataset_id, max(row_index) from dataset_rows where dataset_id = any(%s::uuid[])"
            " group by dataset_id",
            (ids,),
        ).fetchall()
    )


def bounds_after(conn: psycopg.Connection, dataset_id: uuid.UUID, after_row_index: int) -> tuple:
    """(min, max) row_index of the dataset's rows above ``after_row_index`` (both None: none)."""
    return fetch_one(
        conn.execute(
            "select min(row_index), max(row_index) from dataset_rows where dataset_id = %s and row_index > %s",
            (dataset_id, after_row_index),
        ),
        "the dataset's row index bounds",
    )


def ordered_rows_query(items: sql.Composable, conditions: sql.Composable) -> sql.Composed:
    """``items`` (select-list expressions over a row) of the rows meeting ``conditions``, by row_index: the pinned
    read's query (mirror/pinned_read.py)."""
    return sql.SQL("select {} from dataset_rows where {} order by row_index").format(items, conditions)


def undeclared_keys_query(extra: sql.Composable, has: sql.Composable, only: sql.Composable) -> sql.Composed:
    """The undeclared keys of one dataset's rows ``r`` in one scan (tracking/undeclared.py ``find``: ``extra`` the
    keys of ``r.data`` not declared, ``has`` whether it holds one, ``only`` more conditions on ``r``): rows holding
    one, keys, and the first keys with their counts. Parameters %(ds)s, %(lim)s and those of the expressions."""
    return sql.SQL(
        "with x as (select r.row_index, k from dataset_rows r, jsonb_object_keys({extra}) k"
        " where r.dataset_id = %(ds)s and {has}{only}),"
        " per_key as (select k, count(*) as n from x group by k)"
        " select (select count(distinct row_index) from x), (select count(*) from per_key),"
        " array(select k from per_key order by n desc, k limit %(lim)s),"
        " array(select n from per_key order by n desc, k limit %(lim)s)"
    ).format(extra=extra, has=has, only=only)


def remove_key_statement(key: str, dataset_id: uuid.UUID | str) -> str:
    """The statement an operator runs to drop ``key`` from a dataset's rows: named in a refusal, never run here."""
    return f"update dataset_rows set data = data - '{key}' where dataset_id = '{dataset_id}'"


def rows_table_missing(conn: psycopg.Connection) -> bool:
    """Whether the database has no app tables yet (``lakehouse db migrate`` not run)."""
    return fetch_value(
        conn.execute("select to_regclass('dataset_rows') is null"), "whether the lakehouse schema exists"
    )
