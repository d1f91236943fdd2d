"""Reads of ``dataset_rows`` by the mirror, the reverse mirror, the WAL consumer and the undeclared-keys check:
counts, row-index bounds, the pinned read's query. The statements are kept as they were where they moved from (hot
paths: same text, same round trips)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import psycopg
from psycopg import sql

from lakehouse_dagster.core.db import fetch_one, fetch_value

# The table's name, for what names it as data rather than in a statement: a WAL relation (tracking/capture.py), a
# message to the operator ("copies them back into dataset_rows").
TABLE = "dataset_rows"


def count(conn: psycopg.Connection, dataset_id: uuid.UUID) -> int:
    return int(
        fetch_value(
            conn.execute("select count(*) from dataset_rows where dataset_id = %s", (dataset_id,)),
            "the count of the dataset's rows",
        )
    )


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
