"""A dataset's source in ``datasets.source`` (issue 45: the table's owner): the spec its ingest reads, as stored."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from lakehouse_dagster.core.db import fetch_value
from lakehouse_dagster.core.errors import LakehouseError


def stored_source(conn: psycopg.Connection, dataset_id: uuid.UUID, missing: str | LakehouseError) -> Any:
    """datasets.source as stored (None: none); ``missing``: what to raise when the dataset is gone."""
    return fetch_value(conn.execute("select source from datasets where id = %s", (dataset_id,)), missing)


def store_source(conn: psycopg.Connection, dataset_id: uuid.UUID, source: dict) -> None:
    """Store a validated source spec (its JSON form)."""
    conn.execute("update datasets set source = %s, updated_at = now() where id = %s", (Jsonb(source), dataset_id))


def seed_source(conn: psycopg.Connection, dataset_id: uuid.UUID, source: dict) -> None:
    """Set the source of a dataset the demo has just created (updated_at left as created)."""
    conn.execute("update datasets set source = %s where id = %s", (Jsonb(source), dataset_id))


def ids_with_source_page(
    conn: psycopg.Connection, types: Sequence[str], after: uuid.UUID, size: int
) -> list[uuid.UUID]:
    """The next ``size`` tabular datasets after ``after`` (by id) whose source type is one of ``types``."""
    return [
        r[0]
        for r in conn.execute(
            "select id from datasets where kind = 'tabular' and source->>'type' = any(%s) and id > %s order by id limit %s",
            (list(types), after, size),
        ).fetchall()
    ]
