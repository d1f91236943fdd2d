"""The Postgres side of the pinned digest (parity/digest/postgres.py ``PgSide``, ``PinnedPostgres.state``): the
dataset's state and the sums over its rows, each ``h`` the caller's row-hash expression. Hot path: the statements
are the ones the digest ran, same text, one round trip each."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
from psycopg import sql

from lakehouse_dagster.core.db import fetch_one


def state(conn: psycopg.Connection, dataset_id: uuid.UUID) -> tuple | None:
    """(id, name, kind, schema, rows_version) of the dataset; None when it does not exist."""
    return conn.execute(
        "select id, name, kind, schema, rows_version from datasets where id = %s", (dataset_id,)
    ).fetchone()


def bounds(conn: psycopg.Connection, dataset_id: uuid.UUID) -> tuple:
    return fetch_one(
        conn.execute("select min(row_index), max(row_index) from dataset_rows where dataset_id = %s", (dataset_id,)),
        "the dataset's row index bounds",
    )


def segment_sums_query(h: sql.Composable, everything: bool) -> sql.Composed:
    """(segment, count, sum of ``h``) per segment of width %(w)s from %(lo)s; ``everything``: no range predicate
    ([%(lo)s, %(hi)s) holds every row). Parameters %(lo)s, %(hi)s, %(w)s, %(ds)s."""
    return sql.SQL(
        "select (row_index - %(lo)s) / %(w)s as seg, count(*), coalesce(sum({h}), 0) from dataset_rows"
        " where dataset_id = %(ds)s{rng} group by 1"
    ).format(h=h, rng=sql.SQL("" if everything else " and row_index >= %(lo)s and row_index < %(hi)s"))


def count_and_sum(conn: psycopg.Connection, dataset_id: uuid.UUID, h: sql.Composable) -> tuple:
    """(count, sum of ``h``) over every row of the dataset."""
    query = sql.SQL("select count(*), coalesce(sum({h}), 0) from dataset_rows where dataset_id = %s").format(h=h)
    return fetch_one(conn.execute(query, (dataset_id,)), "the digest of the dataset's rows")


def row_hashes(conn: psycopg.Connection, dataset_id: uuid.UUID, h: sql.Composable, lo: int, hi: int) -> list[tuple]:
    """(row_index, ``h``) of the rows in [lo, hi)."""
    query = sql.SQL(
        "select row_index, {h} from dataset_rows where dataset_id = %s and row_index >= %s and row_index < %s"
    ).format(h=h)
    return conn.execute(query, (dataset_id, lo, hi)).fetchall()


def typed_rows(conn: psycopg.Connection, dataset_id: uuid.UUID, items: list[sql.Composable]) -> Iterator[tuple]:
    """``items`` of every row of the dataset, streamed from a cursor."""
    query = sql.SQL("select {} from dataset_rows where dataset_id = %s").format(sql.SQL(", ").join(items))
    with conn.cursor() as cur:
        cur.execute(query, (dataset_id,))
        yield from cur
