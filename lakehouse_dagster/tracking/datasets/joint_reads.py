"""Statements on ``datasets`` that read another owner's table in the same statement (issue 45): the other owner's
expression comes in as an argument (its module builds the statement once, at import), and the fragments other
owners' statements join ``datasets`` with. Split in two round trips, these would read two snapshots."""

from __future__ import annotations

from lakehouse_dagster.tracking.datasets import JOIN_WORKSPACE_W

# The dataset of each row ``p`` of another table, as ``d`` (status/alerts/outbox.py: a verdict's dataset name, the
# verdict kept when its dataset is gone; status/overview.py: only the datasets that still exist).
LEFT_JOIN_DATASET_D_OF_P = "left join datasets d on d.id = p.dataset_id"
JOIN_DATASET_D_OF_P = "join datasets d on d.id = p.dataset_id"


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
