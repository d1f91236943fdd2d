"""A dataset's own columns, read by id: whether it exists, its workspace, name, kind."""

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
    return dict(conn.execute("select id, name from datasets where id = any(%s::uuid[])", (ids,)).fetchall())


def infos_of(conn: psycopg.Connection, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, tuple]:
    """{id: (id, name, workspace_id, kind)} of those of ``ids`` that exist."""
    return {
        r[0]: r
        for r in conn.execute(
            "select id, name, workspace_id, kind from datasets where id = any(%s::uuid[])", (ids,)
        ).fetchall()
    }
