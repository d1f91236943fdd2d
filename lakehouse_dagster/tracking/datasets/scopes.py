"""Which datasets a scope covers (issue 45: ``datasets``' one owner): one dataset, a workspace's, every one, the
tabular ones, those a source polls; the listings the CLI, the status pages and the runbooks print; and the dataset
queries the flags' precedence (flags/resolver.py ``effective_sql``) starts from, rows of ``id, workspace_id``."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence

import psycopg

# The base queries of ``effective_sql``: every dataset; those of ``%s`` (a uuid[]); one dataset, even one that does
# not exist (parameters: its id twice).
ALL_IDS_AND_WORKSPACES = "select id, workspace_id from datasets"
IDS_AND_WORKSPACES_OF = "select id, workspace_id from datasets where id = any(%s::uuid[])"
ONE_ID_AND_WORKSPACE = "select %s::uuid, (select workspace_id from datasets where id = %s)"


# The tabular datasets and their workspaces, as a query another statement reads (status/overview.py's effective
# flags: flags.resolver.effective_sql puts it in a CTE). The same rows as ``tabular_ids_and_workspaces_where``'s
# below without a condition, kept as its caller's statement was written.
TABULAR_IDS_AND_WORKSPACES = "select id, workspace_id from datasets where kind = 'tabular'"


def tabular_ids_and_workspaces_where(condition: str) -> str:
    """The tabular datasets meeting ``condition`` (an SQL predicate over the datasets row, the caller's), as a base
    query of ``effective_sql``."""
    return "\nselect id, workspace_id from datasets\n where kind = 'tabular'\n   and " + condition + "\n"


def all_ids(conn: psycopg.Connection) -> list[uuid.UUID]:
    """Every dataset, by id."""
    return [r[0] for r in conn.execute("select id from datasets order by id").fetchall()]


def ids_in_workspace(conn: psycopg.Connection, workspace_id: uuid.UUID | None) -> list[uuid.UUID]:
    """Every dataset of the workspace."""
    return [r[0] for r in conn.execute("select id from datasets where workspace_id = %s", (workspace_id,)).fetchall()]


def ids_and_workspaces(conn: psycopg.Connection, workspace_id: uuid.UUID | None = None, *, every: bool) -> list[tuple]:
    """(id, workspace_id) of every dataset (``every``), or of the workspace's."""
    if every:
        return conn.execute(ALL_IDS_AND_WORKSPACES).fetchall()
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
