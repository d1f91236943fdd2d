
-- One row per reconciliation of Postgres with Iceberg after native writes (rollback/iceberg_only.py):
--   backfill      rows of snapshot `snapshot_id` copied into dataset_rows (rollback/backfill.py);
--   pg-full-sync  a sync.full on the pg path repopulated dataset_rows from the source (ingest state `seq`),
--                 recorded by the trigger below in the same transaction as its rows.
-- The mirror may overwrite the table again once the native writes are covered by such a row.
create table if not exists lakehouse_pg_reconciled (
  id bigserial primary key,
  dataset_id uuid not null,
  how text not null check (how in ('backfill', 'pg-full-sync')),
  snapshot_id bigint,                      -- backfill: the Iceberg snapshot Postgres now holds every row of
  seq bigint,                              -- pg-full-sync: its ingest state's seq (sources/state.py)
  rows_copied bigint not null default 0,
  rows_removed bigint not null default 0,  -- stale Postgres rows a native replace had superseded
  rows_moved bigint not null default 0,    -- pg-path rows written after the rollback, moved above Iceberg's
  actor text not null,
  at timestamptz not null default now()
);
create index if not exists lakehouse_pg_reconciled_dataset_idx on lakehouse_pg_reconciled (dataset_id, id desc);

create or replace function lakehouse_note_pg_full_sync() returns trigger language plpgsql as $$
begin
  if new.path = 'pg' and new.writer = 'sync.full' then
    insert into lakehouse_pg_reconciled (dataset_id, how, seq, actor)
    values (new.dataset_id, 'pg-full-sync', new.seq, 'sync.full on the pg path');
  end if;
  return null;
end $$;
drop trigger if exists lakehouse_source_state_full_sync on lakehouse_source_state;
create trigger lakehouse_source_state_full_sync after insert or update on lakehouse_source_state
  for each row execute function lakehouse_note_pg_full_sync();
