-- `complete` (runbooks/complete.py): a native dataset's Postgres rows retired once nothing needs them.
--
-- lakehouse_completed: one row per dataset that was ever completed, its current state: in_progress (the batches are
-- deleting its dataset_rows; re-running `write-flags complete` continues), complete (no row left), restoring /
-- restored (a backfill from Iceberg is bringing its rows back, or did: the way back to Postgres). A rollback of its
-- writers to pg is refused while it is in_progress, complete or restoring (flags/completed.py), and the forward
-- mirror refuses it whatever its flags say. lakehouse_complete_audit: every start, batch, export, finish and
-- restore, append-only.
create table if not exists lakehouse_completed (
  dataset_id uuid primary key,
  status text not null check (status in ('in_progress', 'complete', 'restoring', 'restored')),
  started_at timestamptz not null default now(),
  finished_at timestamptz,
  rows_deleted bigint not null default 0,
  batches bigint not null default 0,
  next_row_index bigint,            -- where the next batch starts (its rows below are gone)
  export_to text,                   -- --export-to asked for (the directory), null: no export
  exported_at timestamptz,          -- the export finished (before any row was deleted)
  snapshot_id bigint,               -- the table's snapshot the checks passed at
  actor text not null,
  note text,
  restored_at timestamptz
);

create table if not exists lakehouse_complete_audit (
  id bigserial primary key,
  at timestamptz not null default now(),
  dataset_id uuid not null,
  event text not null check (event in ('start', 'resume', 'export', 'batch', 'finish', 'restore', 'restored')),
  rows bigint,
  detail jsonb,
  actor text not null,
  xid xid8 default pg_current_xact_id()
);
create index if not exists lakehouse_complete_audit_dataset_idx on lakehouse_complete_audit (dataset_id, id desc);

create or replace function lakehouse_complete_audit_append_only() returns trigger language plpgsql as $$
begin
  raise exception 'lakehouse_complete_audit is append-only (% refused)', tg_op;
end $$;

drop trigger if exists lakehouse_complete_audit_no_change on lakehouse_complete_audit;
create trigger lakehouse_complete_audit_no_change before update or delete on lakehouse_complete_audit
  for each statement execute function lakehouse_complete_audit_append_only();

drop trigger if exists lakehouse_complete_audit_no_truncate on lakehouse_complete_audit;
create trigger lakehouse_complete_audit_no_truncate before truncate on lakehouse_complete_audit
  for each statement execute function lakehouse_complete_audit_append_only();
