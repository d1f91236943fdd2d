"""The sync log's one definition of "the latest succeeded sync" of a dataset, and what hangs off it.

``lakehouse_latest_succeeded_sync(dataset_id)`` is a SQL function (inlined by the planner, so it uses
the partial index below): SQL callers join it laterally, Python callers go through
``latest_succeeded``. ``datasets.mirrored_version`` is that sync's source version, kept by triggers on
iceberg_sync_log, so "which datasets are behind Postgres" is one partial-index scan over the few that
are (see ingest/poller.py), not a probe of the log per dataset.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid

import psycopg

# SQL callers: ``left join lateral lakehouse_latest_succeeded_sync(d.id) s on true``.
LATEST_SUCCEEDED_FN = "lakehouse_latest_succeeded_sync"

MIGRATION_LATEST = """
create index if not exists iceberg_sync_log_succeeded_idx
  on iceberg_sync_log (dataset_id, finished_at desc nulls last, id desc) where status = 'succeeded';

-- The one definition: the succeeded sync that finished last (ties: the later row).
create or replace function lakehouse_latest_succeeded_sync(ds uuid) returns setof iceberg_sync_log
language sql stable as $$
  select * from iceberg_sync_log l
   where l.dataset_id = ds and l.status = 'succeeded'
   order by l.finished_at desc nulls last, l.id desc
   limit 1
$$;
"""

# datasets.mirrored_version: lakehouse-owned, NULL = never mirrored. Kept by the sync log's own triggers,
# so every writer of the log (mirror, native path, the reaper, other branches' code) keeps it true.
# The partial index holds exactly the tabular datasets behind Postgres: the poller's sweep reads it.
MIGRATION_MIRRORED = """
alter table datasets add column if not exists mirrored_version bigint;

create or replace function lakehouse_sync_log_mirrored() returns trigger language plpgsql as $$
declare ds uuid := case when tg_op = 'DELETE' then old.dataset_id else new.dataset_id end;
begin
  update datasets d
     set mirrored_version = l.v
    from (select (select s.source_version from lakehouse_latest_succeeded_sync(ds) s) as v) l
   where d.id = ds and d.mirrored_version is distinct from l.v;
  return null;
end $$;

drop trigger if exists lakehouse_sync_log_mirrored_ins on iceberg_sync_log;
create trigger lakehouse_sync_log_mirrored_ins after insert on iceberg_sync_log
  for each row when (new.status = 'succeeded') execute function lakehouse_sync_log_mirrored();
drop trigger if exists lakehouse_sync_log_mirrored_upd on iceberg_sync_log;
create trigger lakehouse_sync_log_mirrored_upd after update of status, source_version, finished_at on iceberg_sync_log
  for each row when (old.status = 'succeeded' or new.status = 'succeeded') execute function lakehouse_sync_log_mirrored();
drop trigger if exists lakehouse_sync_log_mirrored_del on iceberg_sync_log;
create trigger lakehouse_sync_log_mirrored_del after delete on iceberg_sync_log
  for each row when (old.status = 'succeeded') execute function lakehouse_sync_log_mirrored();

create index if not exists datasets_mirror_behind_idx on datasets (rows_version, id)
  where kind = 'tabular' and coalesce(mirrored_version, -1) < rows_version;

-- The poller's memory of what it asked for: one row per dataset, the version and how many times.
create table if not exists lakehouse_mirror_requests (
  dataset_id uuid primary key,
  rows_version bigint not null,
  attempts int not null,
  last_at timestamptz not null default now()
);
"""


@dataclasses.dataclass(frozen=True)
class SucceededSync:
    sync_id: uuid.UUID
    path: str
    snapshot_id: int | None
    source_version: int | None
    has_identity: bool
    rows: int | None
    finished_at: dt.datetime | None


def latest_succeeded(conn: psycopg.Connection, dataset_id: uuid.UUID) -> SucceededSync | None:
    row = conn.execute(
        "select sync_id, path, snapshot_id, source_version, has_identity, rows, finished_at"
        " from lakehouse_latest_succeeded_sync(%s)",
        (dataset_id,),
    ).fetchone()
    return SucceededSync(*row) if row else None
