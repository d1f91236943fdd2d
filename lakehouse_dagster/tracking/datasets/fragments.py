"""Where ``datasets``/``dataset_rows`` meet another owner's table in one statement (issue 45): the fragments other
owners' statements compose in (a keyset scan, a lateral probe per dataset, an atomic update, an insert ... select),
and this owner's statements that take the other owner's expression as an argument (its module builds the
statement once, at import: tracking/sync_log.py imports this package, so the owner cannot import it back). Split
in two round trips, these would read two snapshots. ``d`` aliases the datasets row; the column expressions passed
in are the caller's own (``p.dataset_id``), never a value."""

from __future__ import annotations

import psycopg
from psycopg import sql

from lakehouse_dagster.tracking.datasets import JOIN_WORKSPACE_W

# The datasets as the driving table of a statement, one row per dataset (``d``).
FROM_DATASETS = "from datasets d"

# One dataset's row, unaliased (its id: the next parameter), for an ``insert ... select`` of its columns.
FROM_ONE_DATASET = "from datasets where id = %s"

# One dataset's rows (its id: the next parameter), for an ``insert ... select`` or an aggregate over them.
FROM_ROWS_OF_DATASET = "from dataset_rows where dataset_id = %s"

# The dataset of each row ``p`` of another table, as ``d`` (status/alerts/outbox.py: a verdict's dataset name, the
# verdict kept when its dataset is gone; status/overview.py: only the datasets that still exist).
LEFT_JOIN_DATASET_D_OF_P = "left join datasets d on d.id = p.dataset_id"
JOIN_DATASET_D_OF_P = "join datasets d on d.id = p.dataset_id"


def join_datasets_on(dataset_id: str) -> str:
    """``join datasets d`` on the caller's column holding a dataset's id."""
    return "join datasets d on d.id = " + dataset_id


def dataset_exists(dataset_id: str, also: str = "") -> str:
    """``exists (...)``: a dataset row has the caller's id column (and ``also``, a condition on ``d``)."""
    return "exists (select 1 from datasets d where d.id = " + dataset_id + also + ")"


def rows_version_of(ds: sql.Composable) -> sql.Composed:
    """The dataset's rows_version as a scalar subquery (``ds``: its id, a literal)."""
    return sql.SQL("(select rows_version from datasets where id = {ds}::uuid)").format(ds=ds)


def classify_query(mirrored_once: str) -> str:
    """routing/native_guard.py's classification of datasets ``%s`` for a native write: (id, name, workspace, kind,
    'already native' | 'new and empty' | 'first native write'); ``mirrored_once``: the sync log's expression of
    ``d`` (tracking/sync_log.py MIRRORED_ONCE)."""
    return (
        """
select d.id, d.name, d.workspace_id, d.kind,
       case when s.path = 'native' then 'already native'
            when not exists (select 1 from dataset_rows r where r.dataset_id = d.id)
             and not """
        + mirrored_once
        + """
            then 'new and empty'
            else 'first native write' end
  from datasets d
  left join lateral lakehouse_latest_succeeded_sync(d.id) s on true  -- tracking/sync_log.py
 where d.id = any(%s::uuid[])
"""
    )


def partition_query(last_table_location: str) -> str:
    """status/partition_state.py's one query of datasets ``%s``: the dataset, its workspace, its latest succeeded
    sync (the one definition) and ``last_table_location`` (the sync log's expression of ``d``)."""
    return (
        """
select d.id, d.name, d.workspace_id, w.name, d.kind, d.schema, d.rows_version, d.row_count,
       s.sync_id, s.writer, s.path, s.mode, s.rows, s.bytes, s.snapshot_id, s.source_version, s.run_id,
       s.started_at, s.finished_at,
       coalesce(s.table_location, """
        + last_table_location
        + """)
  from datasets d
  """
        + JOIN_WORKSPACE_W
        + """
  left join lateral lakehouse_latest_succeeded_sync(d.id) s on true
 where d.id = any(%s::uuid[])
"""
    )


def mirrored_and_blocked(ever_succeeded: str) -> str:
    """status/overview.py's ``m`` CTE: each tabular dataset, whether it was ever synced (``ever_succeeded``: the
    sync log's expression of ``d``) and whether it is among ``%(blocked)s``."""
    return f"""select d.id, {ever_succeeded}
                        as mirrored, b.id is not null as blocked
             from datasets d left join unnest(%(blocked)s::uuid[]) b(id) on b.id = d.id
            where d.kind = 'tabular'"""


def freshness_query(mode_is_after_commit: str) -> str:
    """The read router's one query: (rows_version, the latest succeeded sync's snapshot and the version it covers,
    ``mode_is_after_commit``: the capture mode's expression, tracking/capture.py) of dataset ``%s``."""
    return f"""
select d.rows_version, s.snapshot_id, s.source_version, {mode_is_after_commit}
  from datasets d
  left join lateral lakehouse_latest_succeeded_sync(d.id) s on true  -- tracking/sync_log.py
 where d.id = %s
"""


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


def behind_rows(conn: psycopg.Connection) -> list[tuple]:
    """(id, name, workspace id, rows_version, mirrored_version, last synced at, lag seconds) of every tabular
    dataset behind the mirror (``_BEHIND``)."""
    return conn.execute(_BEHIND).fetchall()
