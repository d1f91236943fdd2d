"""A dataset's Postgres version in ``datasets`` (issue 45: the table's owner): ``rows_version`` (moved by every
write of its rows or its schema) and ``mirrored_version`` (what the mirror last covered), as the read router, the
shadow reads, the canaries and the lag read them."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import psycopg

from lakehouse_dagster.core.db import fetch_value

# A tabular dataset behind the mirror: Postgres moved past the version its latest succeeded sync covers (one
# partial-index scan over the few that are); never-synced first, then the oldest view first.
_BEHIND = """
select d.id, d.name, d.workspace_id, d.rows_version, d.mirrored_version, s.finished_at,
       extract(epoch from now() - s.finished_at)::float8 as lag
  from datasets d
  left join lateral lakehouse_latest_succeeded_sync(d.id) s on true
 where d.kind = 'tabular' and coalesce(d.mirrored_version, -1) < d.rows_version
 order by s.finished_at nulls first, d.id
"""


def rows_version(conn: psycopg.Connection, dataset_id: uuid.UUID) -> int | None:
    """datasets.rows_version (raises when the dataset is gone)."""
    return fetch_value(conn.execute("select rows_version from datasets where id = %s", (dataset_id,)), "version")


def rows_versions(conn: psycopg.Connection, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int]:
    """{id: rows_version} of those of ``ids`` that exist."""
    return dict(conn.execute("select id, rows_version from datasets where id = any(%s::uuid[])", (ids,)).fetchall())


def version_and_schema_digest(conn: psycopg.Connection, dataset_id: uuid.UUID) -> tuple[int, str] | None:
    """(rows_version, md5 of the schema) now, None when the dataset is gone."""
    return conn.execute("select rows_version, md5(schema::text) from datasets where id = %s", (dataset_id,)).fetchone()


def freshness_query(mode_is_after_commit: str) -> str:
    """The read router's one query: (rows_version, the latest succeeded sync's snapshot and the version it covers,
    ``mode_is_after_commit``: the capture mode's expression, tracking/capture.py) of dataset ``%s``."""
    return f"""
select d.rows_version, s.snapshot_id, s.source_version, {mode_is_after_commit}
  from datasets d
  left join lateral lakehouse_latest_succeeded_sync(d.id) s on true  -- tracking/sync_log.py
 where d.id = %s
"""


def behind_rows(conn: psycopg.Connection) -> list[tuple]:
    """(id, name, workspace id, rows_version, mirrored_version, last synced at, lag seconds) of every tabular
    dataset behind the mirror (``_BEHIND``)."""
    return conn.execute(_BEHIND).fetchall()
