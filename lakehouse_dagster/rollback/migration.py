"""Tables of the rollback area (migration "011_rollback"): when Postgres caught up with Iceberg again.

Idempotent on its own: every statement can re-run over existing objects.
"""

SQL = """
-- One row per reconciliation of Postgres with an Iceberg snapshot that held rows Postgres lacked
-- (rollback/iceberg_only.py): a backfill copied them into dataset_rows, or a sync.full on the pg path
-- repopulated Postgres from the source. The mirror may overwrite the table again once the table's
-- current snapshot is covered by such a row.
create table if not exists lakehouse_pg_reconciled (
  id bigserial primary key,
  dataset_id uuid not null,
  snapshot_id bigint not null,          -- the Iceberg snapshot Postgres now holds every row of
  how text not null check (how in ('backfill', 'pg-full-sync')),
  rows_copied bigint not null default 0,
  rows_removed bigint not null default 0,  -- stale Postgres rows a native replace had superseded
  rows_moved bigint not null default 0,    -- rows written on the pg path after the rollback, moved above Iceberg's
  actor text not null,
  at timestamptz not null default now()
);
create index if not exists lakehouse_pg_reconciled_dataset_idx on lakehouse_pg_reconciled (dataset_id, snapshot_id);
"""
