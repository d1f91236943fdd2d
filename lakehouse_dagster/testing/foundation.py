"""The app's tables as a live deployment has them (the foundation shape, without any lakehouse column,
default or trigger), for tests and benches that adopt an existing database instead of creating one."""

from __future__ import annotations

import uuid

import psycopg
from psycopg.types.json import Jsonb

FOUNDATION_SQL = """
create table workspaces (id uuid primary key, name text);
create table datasets (id uuid primary key, workspace_id uuid, name text, kind text, schema jsonb,
                       row_count bigint, status text);
create table dataset_rows (dataset_id uuid, row_index bigint, row_id uuid, created_at timestamptz, data jsonb,
                           primary key (dataset_id, row_index));
create table pipelines (id uuid, workspace_id uuid, name text, spec jsonb);
"""

# How the live app writes a row: every foundation column named, nothing else.
APP_INSERT_ROW = (
    "insert into dataset_rows (dataset_id, row_index, row_id, created_at, data)"
    " values (%s, %s, gen_random_uuid(), now(), %s)"
)


def create_foundation(conn: psycopg.Connection) -> None:
    conn.execute(FOUNDATION_SQL)


def app_workspace(conn: psycopg.Connection, name: str) -> uuid.UUID:
    ws = uuid.uuid4()
    conn.execute("insert into workspaces (id, name) values (%s, %s)", (ws, name))
    return ws


def app_dataset(
    conn: psycopg.Connection,
    ws: uuid.UUID,
    name: str,
    schema: list,
    *,
    kind: str = "tabular",
    rows: int | list[int] = 0,
    row=lambda i: {"n": i, "s": f"r{i}"},
) -> uuid.UUID:
    """A dataset as the app creates it, with rows at the given row_index values (or 0..rows-1), inserted
    by one set-based statement per dataset."""
    d = uuid.uuid4()
    indexes = list(range(rows)) if isinstance(rows, int) else list(rows)
    conn.execute(
        "insert into datasets (id, workspace_id, name, kind, schema, row_count, status)"
        " values (%s, %s, %s, %s, %s, %s, 'ready')",
        (d, ws, name, kind, Jsonb(schema), len(indexes)),
    )
    if indexes:
        conn.execute(
            "insert into dataset_rows (dataset_id, row_index, row_id, created_at, data)"
            " select %s, u.i, gen_random_uuid(), now(), u.d from unnest(%s::bigint[], %s::jsonb[]) as u(i, d)",
            (d, indexes, [Jsonb(row(i)) for i in indexes]),
        )
    return d
