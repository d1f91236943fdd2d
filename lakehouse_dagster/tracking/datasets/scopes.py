"""Which datasets a flag scope covers (one dataset, a workspace's, every one), and the dataset queries the flags'
precedence (flags/precedence.py ``effective_sql``) starts from: rows of ``id, workspace_id``."""

from __future__ import annotations

import uuid

import psycopg

# The base queries of ``effective_sql``: every dataset; those of ``%s`` (a uuid[]); one dataset, even one that does
# not exist (parameters: its id twice).
ALL_IDS_AND_WORKSPACES = "select id, workspace_id from datasets"
IDS_AND_WORKSPACES_OF = "select id, workspace_id from datasets where id = any(%s::uuid[])"
ONE_ID_AND_WORKSPACE = "select %s::uuid, (select workspace_id from datasets where id = %s)"


def tabular_ids_and_workspaces_where(condition: str) -> str:
    """The tabular datasets meeting ``condition`` (an SQL predicate over the datasets row, the caller's), as a base
    query of ``effective_sql``."""
    return "\nselect id, workspace_id from datasets\n where kind = 'tabular'\n   and " + condition + "\n"


def all_ids(conn: psycopg.Connection) -> list[uuid.UUID]:
    return [r[0] for r in conn.execute("select id from datasets").fetchall()]


def ids_in_workspace(conn: psycopg.Connection, workspace_id: uuid.UUID | None) -> list[uuid.UUID]:
    return [r[0] for r in conn.execute("select id from datasets where workspace_id = %s", (workspace_id,)).fetchall()]


def ids_and_workspaces(conn: psycopg.Connection, workspace_id: uuid.UUID | None = None, *, every: bool) -> list[tuple]:
    """(id, workspace_id) of every dataset (``every``), or of the workspace's."""
    if every:
        return conn.execute("select id, workspace_id from datasets").fetchall()
    return conn.execute("select id, workspace_id from datasets where workspace_id = %s", (workspace_id,)).fetchall()


_IN_SCOPE = "select id, name, workspace_id, kind from datasets"


def in_scope(conn: psycopg.Connection, scope: str, scope_id: uuid.UUID | None, *, ordered: bool = False) -> list[tuple]:
    """(id, name, workspace_id, kind) of the datasets a scope covers (``dataset``, ``workspace``, else global),
    by name then id when ``ordered``."""
    order = " order by name, id" if ordered else ""
    if scope == "dataset":
        return conn.execute(_IN_SCOPE + " where id = %s" + order, (scope_id,)).fetchall()
    if scope == "workspace":
        return conn.execute(_IN_SCOPE + " where workspace_id = %s" + order, (scope_id,)).fetchall()
    return conn.execute(_IN_SCOPE + order).fetchall()


def mirrored_tabular_ids(conn: psycopg.Connection) -> list[uuid.UUID]:
    """Tabular datasets with a succeeded sync (datasets.mirrored_version, kept by the sync log's triggers), by id."""
    return [
        r[0]
        for r in conn.execute(
            "select id from datasets where kind = 'tabular' and mirrored_version is not null order by id"
        ).fetchall()
    ]
