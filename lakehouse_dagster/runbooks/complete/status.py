"""The complete's audit and status: each step appended to ``lakehouse_complete_audit`` (its owner: every statement on it
is here), and the marks with that audit, newest first (``lakehouse complete --status``).
"""

from __future__ import annotations

import uuid

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from lakehouse_dagster.core.ids import parse_uuid
from lakehouse_dagster.flags.completed import (
    completed_mark,
    marked_datasets,
)
from lakehouse_dagster.tracking.datasets import get_dataset


def _audit(conn: psycopg.Connection, ds_id: uuid.UUID, event: str, actor: str, rows=None, detail=None) -> None:
    conn.execute(
        "insert into lakehouse_complete_audit (dataset_id, event, rows, detail, actor) values (%s, %s, %s, %s, %s)",
        (ds_id, event, rows, Jsonb(detail) if detail is not None else None, actor),
    )


def complete_status(conn: psycopg.Connection, dataset_id=None, *, limit: int = 50) -> dict:
    """The marks (one dataset's, or every one) and the audit, newest first."""
    ds_id = parse_uuid(dataset_id, "dataset id") if dataset_id not in (None, "") else None
    if ds_id is not None:
        get_dataset(conn, ds_id)
    where = sql.SQL("where dataset_id = %s" if ds_id else "")
    params: tuple = (ds_id,) if ds_id else ()
    marks = [completed_mark(conn, d) for d in marked_datasets(conn, ds_id)]
    audit = conn.execute(
        sql.SQL(
            "select id, at, dataset_id, event, rows, detail, actor from lakehouse_complete_audit {}"
            " order by id desc limit %s"
        ).format(where),
        (*params, limit),
    ).fetchall()
    keys = ("id", "at", "dataset_id", "event", "rows", "detail", "actor")
    return {"marks": [m for m in marks if m is not None], "audit": [dict(zip(keys, r)) for r in audit]}
