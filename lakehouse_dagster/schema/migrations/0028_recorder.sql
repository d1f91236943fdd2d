-- The recorder (status/recording.py, the lakehouse_recorder sensor): every change the Dagster instance must show,
-- found by the id of the transaction that made it, so a row that commits late is never skipped (a bigserial id
-- is drawn before commit; the mirror poller's cursor, mirror/poller.py, works the same way).

-- Sync log rows are written twice (running, then succeeded or failed): each write stamps its transaction.
alter table iceberg_sync_log add column if not exists changed_xid xid8;
-- Where the table lives (pyiceberg's Table.location()), written with every succeeded sync: the materialization's
-- dagster/uri without loading the table.
alter table iceberg_sync_log add column if not exists table_location text;

create or replace function lakehouse_stamp_changed_xid() returns trigger language plpgsql as $$
begin
  new.changed_xid := pg_current_xact_id();
  return new;
end $$;

drop trigger if exists lakehouse_sync_log_changed_xid on iceberg_sync_log;
create trigger lakehouse_sync_log_changed_xid before insert or update on iceberg_sync_log
  for each row execute function lakehouse_stamp_changed_xid();
create index if not exists iceberg_sync_log_changed_xid_idx on iceberg_sync_log (changed_xid, id)
  where status = 'succeeded';

-- Append-only tables stamp the inserting transaction by default. Rows from before this migration keep NULL
-- (the column is added without a default first, so no rewrite and no replay of history).
alter table lakehouse_flag_audit add column if not exists xid xid8;
alter table lakehouse_flag_audit alter column xid set default pg_current_xact_id();
create index if not exists lakehouse_flag_audit_xid_idx on lakehouse_flag_audit (xid, id);

alter table lakehouse_pg_reconciled add column if not exists xid xid8;
alter table lakehouse_pg_reconciled alter column xid set default pg_current_xact_id();
create index if not exists lakehouse_pg_reconciled_xid_idx on lakehouse_pg_reconciled (xid, id);

-- One row per dataset whose orphan files a sweep removed (mirror/sweep.py): the table's storage changed.
create table if not exists lakehouse_orphan_sweeps (
  id bigserial primary key,
  dataset_id uuid not null,
  files_removed int not null,
  bytes_removed bigint not null,
  grace_seconds double precision not null,
  actor text not null,
  at timestamptz not null default now(),
  xid xid8 not null default pg_current_xact_id()
);
create index if not exists lakehouse_orphan_sweeps_xid_idx on lakehouse_orphan_sweeps (xid, id);
