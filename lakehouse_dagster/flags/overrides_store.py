"""The owner of ``lakehouse_flag_overrides`` (issue 45): every statement on the runtime flag overrides.

A module of its own, at the bottom of flags/: precedence.py (which the resolver, and through it overrides.py,
imports) reads the table, so its owner must sit below precedence; overrides.py keeps the checks, the audit and the
lifecycle transition around these plain reads and writes. Callers that read the table inside their own statement
take a named SQL fragment (``OF_FLAGS_IN_F``, ``TOUCHES_DATASET``) instead of naming it.
"""

from __future__ import annotations

import uuid

import psycopg

from lakehouse_dagster.core.db import fetch_value
from lakehouse_dagster.tracking.datasets import fragments

# The overrides of the flags listed in a CTE ``f(kind, name, …)``: precedence.py's ``o`` CTE body.
OF_FLAGS_IN_F = """select kind, name, scope, scope_id, mode from lakehouse_flag_overrides
            where (kind, name) in (select kind, name from f)"""

# True when some override may apply to the dataset row in scope (columns ``id``, ``workspace_id``): flipped.py.
TOUCHES_DATASET = """(exists (select 1 from lakehouse_flag_overrides where scope = 'global')
        or id in (select scope_id from lakehouse_flag_overrides where scope = 'dataset')
        or workspace_id in (select scope_id from lakehouse_flag_overrides where scope = 'workspace'))"""

_KEY_MATCH = "kind = %s and name = %s and scope = %s and scope_id is not distinct from %s"
_COLUMNS = "kind, name, scope, scope_id, mode, note, set_by, set_at"


def table_exists(conn: psycopg.Connection) -> bool:
    """Whether the overrides table exists yet (a database before its migration)."""
    return (
        fetch_value(
            conn.execute("select to_regclass('lakehouse_flag_overrides')"), "whether the flag overrides table exists"
        )
        is not None
    )


def current_mode(conn: psycopg.Connection, kind: str, name: str, scope: str, scope_id: uuid.UUID | None) -> str | None:
    """The stored mode of one override key, or None."""
    row = conn.execute(
        "select mode from lakehouse_flag_overrides where " + _KEY_MATCH, (kind, name, scope, scope_id)
    ).fetchone()
    return row[0] if row else None


def upsert(
    conn: psycopg.Connection,
    kind: str,
    name: str,
    scope: str,
    scope_id: uuid.UUID | None,
    mode: str,
    note: str | None,
    actor: str,
) -> None:
    """Set (or replace) one override."""
    conn.execute(
        "insert into lakehouse_flag_overrides (kind, name, scope, scope_id, mode, note, set_by, set_at)"
        " values (%s, %s, %s, %s, %s, %s, %s, now())"
        " on conflict (kind, name, scope, coalesce(scope_id, '00000000-0000-0000-0000-000000000000'::uuid))"
        " do update set mode = excluded.mode, note = excluded.note, set_by = excluded.set_by, set_at = now()",
        (kind, name, scope, scope_id, mode, note, actor),
    )


def delete(conn: psycopg.Connection, kind: str, name: str, scope: str, scope_id: uuid.UUID | None) -> None:
    """Drop one override."""
    conn.execute("delete from lakehouse_flag_overrides where " + _KEY_MATCH, (kind, name, scope, scope_id))


def all_rows(conn: psycopg.Connection, kind: str | None = None) -> list[tuple]:
    """Every override (of one kind, or both) as ``kind, name, scope, scope_id, mode, note, set_by, set_at``,
    by kind, name, global → workspace → dataset, scope id."""
    sql = "select " + _COLUMNS + " from lakehouse_flag_overrides"
    params: tuple = ()
    if kind is not None:
        sql += " where kind = %s"
        params = (kind,)
    sql += " order by kind, name, case scope when 'global' then 0 when 'workspace' then 1 else 2 end, scope_id"
    return conn.execute(sql, params).fetchall()


def narrower_rows(
    conn: psycopg.Connection, kind: str, name: str, scope: str, workspace_id: uuid.UUID | None
) -> list[tuple]:
    """The overrides of one flag narrower than ``scope`` (global: every workspace and dataset override; workspace:
    those of the workspace ``workspace_id``'s datasets), workspace ones first; columns as ``all_rows``."""
    sql = (
        "select o.kind, o.name, o.scope, o.scope_id, o.mode, o.note, o.set_by, o.set_at"
        "  from lakehouse_flag_overrides o where o.kind = %s and o.name = %s"
    )
    params: tuple = (kind, name)
    if scope == "global":
        sql += " and o.scope in ('workspace', 'dataset')"
    elif scope == "workspace":
        sql += " and o.scope = 'dataset' and " + fragments.dataset_exists("o.scope_id", " and d.workspace_id = %s")
        params += (workspace_id,)
    else:
        return []
    sql += " order by case o.scope when 'workspace' then 0 else 1 end, o.scope_id"
    return conn.execute(sql, params).fetchall()


def of_flags(conn: psycopg.Connection, kind: str, names: list[str]) -> list[tuple]:
    """``name, scope, scope_id, mode`` of every override of these flags of one kind."""
    return conn.execute(
        "select name, scope, scope_id, mode from lakehouse_flag_overrides where kind = %s and name = any(%s)",
        (kind, names),
    ).fetchall()
