"""What the capture modes (tracking/capture.py) do to the app tables: the lock the switch takes on ``dataset_rows``,
its replica identity, its triggers enabled or disabled, the app tables a publication covers."""

from __future__ import annotations

import psycopg
from psycopg import sql

from lakehouse_dagster.core.db import fetch_value

# The app tables the WAL consumer's publication covers, for its ``create publication ... for table``.
PUBLISHED = sql.SQL("dataset_rows, datasets")

# The digest triggers not disabled on dataset_rows (an array of names; parameter: the names asked about).
ROWS_TRIGGERS_ENABLED = (
    "array(select tgname from pg_trigger where tgrelid = 'dataset_rows'::regclass"
    " and tgname = any(%s) and tgenabled <> 'D' order by 1)"
)


def lock_rows_for_switch(conn: psycopg.Connection) -> None:
    """SHARE ROW EXCLUSIVE on dataset_rows (what ALTER TABLE ... TRIGGER takes): waits for every writing
    transaction and holds new ones until the caller's transaction ends."""
    conn.execute("lock table dataset_rows in share row exclusive mode")


def replica_identity_full(conn: psycopg.Connection) -> None:
    """REPLICA IDENTITY FULL on dataset_rows (the WAL then holds every old row), altered only when not yet."""
    if (
        fetch_value(
            conn.execute("select relreplident from pg_class where oid = 'dataset_rows'::regclass"),
            "the replica identity of dataset_rows",
        )
        != "f"
    ):
        conn.execute("alter table dataset_rows replica identity full")


def set_trigger(conn: psycopg.Connection, how: str, trigger: str) -> None:
    """``how``: ``enable trigger``, ``enable always trigger`` or ``disable trigger`` (a constant of the caller's)."""
    conn.execute(sql.SQL("alter table dataset_rows {} {}").format(sql.SQL(how), sql.Identifier(trigger)))
