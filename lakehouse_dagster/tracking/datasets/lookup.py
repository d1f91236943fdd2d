"""A dataset's own columns in ``datasets``, read by id (issue 45: the table's one owner): whether it exists, its
workspace, name, kind, schema, row count, source, and its Postgres version (``rows_version``, moved by every write
of its rows or its schema). Each is one statement, as its callers ran it."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import psycopg

from lakehouse_dagster.core.db import fetch_value
from lakehouse_dagster.core.errors import LakehouseError


def dataset_exists(conn: psycopg.Connection, dataset_id: uuid.UUID | None) -> bool:
    return conn.execute("select 1 from datasets where id = %s", (dataset_id,)).fetchone() is not None


def existing_ids(conn: psycopg.Connection, ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
    """Those of ``ids`` whose dataset exists."""
    return {r[0] for r in conn.execute("select id from datasets where id = any(%s::uuid[])", (ids,)).fetchall()}


def workspace_id_of(conn: psycopg.Connection, dataset_id: uuid.UUID | None, missing: str | LakehouseError) -> Any:
    """The dataset's workspace id (None: in no workspace); ``missing`` is raised when it does not exist."""
    return fetch_value(conn.execute("select workspace_id from datasets where id = %s", (dataset_id,)), missing)


def names_of(conn: psycopg.Connection, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, str]:
    """{id: name} of those of ``ids`` that exist."""
    return dict(conn.execute("select id, name from datasets where id = any(%s::uuid[])", (list(ids),)).fetchall())


def name_of(conn: psycopg.Connection, dataset_id: uuid.UUID, missing: str) -> str:
    """The dataset's name (``not null`` in the app's schema), ``missing`` when there is no such dataset."""
    row = conn.execute("select name from datasets where id = %s", (dataset_id,)).fetchone()
    return row[0] if row else missing


def infos_of(conn: psycopg.Connection, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, tuple]:
    """{id: (id, name, workspace_id, kind)} of those of ``ids`` that exist."""
    return {
        r[0]: r
        for r in conn.execute(
            "select id, name, workspace_id, kind from datasets where id = any(%s::uuid[])", (ids,)
        ).fetchall()
    }


def kinds_of(conn: psycopg.Connection, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, str]:
    """{id: kind} of those of ``ids`` that exist."""
    return dict(conn.execute("select id, kind from datasets where id = any(%s::uuid[])", (ids,)).fetchall())


def tabular_names_of(conn: psycopg.Connection, ids: Sequence[uuid.UUID]) -> list[tuple[uuid.UUID, str]]:
    """(id, name) of the tabular ones of ``ids``, by name then id."""
    return conn.execute(
        "select id, name from datasets where id = any(%s::uuid[]) and kind = 'tabular' order by name, id", (ids,)
    ).fetchall()


def rows_version(conn: psycopg.Connection, dataset_id: uuid.UUID, missing: str | LakehouseError | None = None) -> Any:
    """The dataset's rows_version; when it does not exist, None, or ``missing`` raised when given."""
    cur = conn.execute("select rows_version from datasets where id = %s", (dataset_id,))
    if missing is not None:
        return fetch_value(cur, missing)
    row = cur.fetchone()
    return row[0] if row else None


def rows_versions(conn: psycopg.Connection, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int]:
    """{id: rows_version} of those of ``ids`` that exist."""
    return dict(conn.execute("select id, rows_version from datasets where id = any(%s::uuid[])", (ids,)).fetchall())


def version_and_schema_digest(conn: psycopg.Connection, dataset_id: uuid.UUID) -> tuple[int, str] | None:
    """(rows_version, md5 of the schema) now, None when the dataset is gone."""
    return conn.execute("select rows_version, md5(schema::text) from datasets where id = %s", (dataset_id,)).fetchone()


def schema_of(conn: psycopg.Connection, dataset_id: uuid.UUID, missing: str | LakehouseError) -> Any:
    """The dataset's schema as stored (JSON); ``missing`` is raised when it does not exist."""
    return fetch_value(conn.execute("select schema from datasets where id = %s", (dataset_id,)), missing)


def lock_schema(conn: psycopg.Connection, dataset_id: uuid.UUID) -> tuple | None:
    """(schema,) of the dataset, its row locked FOR NO KEY UPDATE until the caller's transaction ends; None when it
    does not exist."""
    return conn.execute("select schema from datasets where id = %s for no key update", (dataset_id,)).fetchone()


def kind_schema_version(conn: psycopg.Connection, dataset_id: uuid.UUID) -> tuple | None:
    """(kind, schema, rows_version) of the dataset; None when it does not exist."""
    return conn.execute("select kind, schema, rows_version from datasets where id = %s", (dataset_id,)).fetchone()


def row_count(conn: psycopg.Connection, dataset_id: uuid.UUID, missing: str | LakehouseError) -> int | None:
    """datasets.row_count; ``missing``: what to raise when the dataset is gone."""
    return fetch_value(conn.execute("select row_count from datasets where id = %s", (dataset_id,)), missing)


def stored_source(conn: psycopg.Connection, dataset_id: uuid.UUID, missing: str | LakehouseError) -> Any:
    """datasets.source as stored (None: none); ``missing``: what to raise when the dataset is gone."""
    return fetch_value(conn.execute("select source from datasets where id = %s", (dataset_id,)), missing)
