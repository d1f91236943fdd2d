"""Listings of ``datasets`` (issue 45: the table's owner): ids, names and summaries by scope, each one statement."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence

import psycopg

from lakehouse_dagster.core.db import fetch_value

# The tabular datasets and their workspaces, as a query another statement reads (status/overview.py's effective
# flags: flags.resolver.effective_sql puts it in a CTE).
TABULAR_IDS_AND_WORKSPACES = "select id, workspace_id from datasets where kind = 'tabular'"


def names_of(conn: psycopg.Connection, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, str]:
    """{id: name} of those of ``ids`` that exist."""
    return dict(conn.execute("select id, name from datasets where id = any(%s::uuid[])", (list(ids),)).fetchall())


def name_of(conn: psycopg.Connection, dataset_id: uuid.UUID, missing: str) -> str:
    """The dataset's name (``not null`` in the app's schema), ``missing`` when there is no such dataset."""
    row = conn.execute("select name from datasets where id = %s", (dataset_id,)).fetchone()
    return row[0] if row else missing


def workspace_of(conn: psycopg.Connection, dataset_id: uuid.UUID) -> uuid.UUID | None:
    """The dataset's workspace (raises when the dataset is gone)."""
    return fetch_value(conn.execute("select workspace_id from datasets where id = %s", (dataset_id,)), "workspace")


def ids_in_workspace(conn: psycopg.Connection, workspace_id: uuid.UUID) -> list[uuid.UUID]:
    """Every dataset of the workspace."""
    return [r[0] for r in conn.execute("select id from datasets where workspace_id = %s", (workspace_id,)).fetchall()]


def all_ids(conn: psycopg.Connection) -> list[uuid.UUID]:
    """Every dataset, by id."""
    return [r[0] for r in conn.execute("select id from datasets order by id").fetchall()]


def tabular_ids(conn: psycopg.Connection, workspace_id: uuid.UUID | None = None) -> list[uuid.UUID]:
    """The tabular datasets of the workspace (None: of every workspace)."""
    query = "select id from datasets where kind = 'tabular'" + (
        "" if workspace_id is None else " and workspace_id = %s"
    )
    return [r[0] for r in conn.execute(query, () if workspace_id is None else (workspace_id,)).fetchall()]


def tabular_among(conn: psycopg.Connection, ids: Iterable[uuid.UUID]) -> set[uuid.UUID]:
    """Those of ``ids`` that are tabular datasets."""
    return {
        r[0]
        for r in conn.execute(
            "select id from datasets where id = any(%s::uuid[]) and kind = 'tabular'", (list(ids),)
        ).fetchall()
    }


def tabular_names(conn: psycopg.Connection) -> dict[uuid.UUID, tuple]:
    """{id: (name, workspace id)} of every tabular dataset."""
    return {r[0]: r[1:] for r in conn.execute("select id, name, workspace_id from datasets where kind = 'tabular'")}


def summaries(conn: psycopg.Connection) -> list[tuple]:
    """(id, name, workspace id, kind, row count) of every dataset."""
    return conn.execute("select id, name, workspace_id, kind, row_count from datasets").fetchall()


def workspace_summaries(conn: psycopg.Connection, workspace_id: uuid.UUID) -> list[tuple]:
    """(id, name, kind, row count) of the workspace's datasets, the largest first, then by name."""
    return conn.execute(
        "select id, name, kind, row_count from datasets where workspace_id = %s order by row_count desc nulls last, name",
        (workspace_id,),
    ).fetchall()
