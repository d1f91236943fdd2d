"""Tables of the parity area (migration "005_parity"): every canary / asset-check verdict.

Idempotent on its own: every statement can re-run over existing objects.
"""

SQL = """
create table if not exists lakehouse_read_parity (
  id bigserial primary key,
  dataset_id uuid not null,
  checked_at timestamptz not null default now(),
  verdict text not null
    check (verdict in ('ok', 'lagging', 'no-snapshot', 'MISMATCH', 'native', 'error')),
  source text not null default 'canary',      -- canary (CLI) | check (Dagster asset check) | schedule
  pg_count bigint,
  iceberg_count bigint,
  pg_digest numeric,                          -- exact sum of the rows' 64-bit hashes (parity/canonical.py)
  iceberg_digest numeric,
  snapshot_id bigint,                         -- the pinned Iceberg snapshot
  pg_version bigint,                          -- datasets.rows_version read in the pinned Postgres snapshot
  iceberg_version bigint,                     -- the Postgres version the snapshot says it covers
  smoke text,                                 -- value-level check: match | differs | skipped | null (not asked)
  mismatched_row_indexes bigint[],            -- first differing __row_index values (localisation), ascending
  seconds double precision,
  run_id text,                                -- Dagster run id when a check or the schedule wrote it
  detail jsonb not null default '{}'::jsonb
);
create index if not exists lakehouse_read_parity_dataset_idx on lakehouse_read_parity (dataset_id, checked_at desc, id desc);
create index if not exists lakehouse_read_parity_mismatch_idx on lakehouse_read_parity (checked_at desc)
  where verdict = 'MISMATCH';
"""

# Migration "021_file_identity": per-file identity facts (parity/file_identity.py). One row per Iceberg data file
# and table schema: computed the first time identity readiness meets the file (files are immutable), trusted only
# for the same path, size and schema (``fields_key``) and the row count its manifest says.
FILE_IDENTITY = """
create table if not exists lakehouse_file_identity (
  dataset_id uuid not null,
  file_path text not null,
  file_size bigint not null,
  fields_key text not null,
  row_count bigint not null,
  row_index_nonnull bigint not null,
  row_id_nonnull bigint not null,
  created_at_nonnull bigint not null,
  distinct_row_index bigint not null,
  min_row_index bigint,
  max_row_index bigint,
  computed_at timestamptz not null default now(),
  primary key (dataset_id, file_path, file_size, fields_key)
);
"""

# Migration "015_parity_digests": maintained digests (parity/maintained.py says how they are used).
#
# lakehouse_file_digests: one row per Iceberg data file (files are immutable), computed when written or
# the first time a canary meets the file, under the canonical contract version and the dataset schema
# hash it was computed under (a schema or contract change never reuses it). ``segments`` holds
# {segment: [count, sum]} with segment = __row_index >> 16.
#
# lakehouse_pg_digest_state / _deltas: the Postgres side, per dataset and segment, maintained in the
# writing transaction by statement triggers with transition tables. A statement INSERTs delta rows
# (never UPDATEs a shared row), so writers add no lock of their own: change tracking already holds the
# dataset's row lock until commit. A canary sums the deltas visible to its pinned snapshot (they commit
# with the rows, so they always match that snapshot's rows_version); compaction folds them later.
# A dataset is maintained only once registered (its row hash expression, rendered by parity/canonical.py,
# is stored in ``hash_sql``) and filled; a schema change, or a value the hash cannot type, drops the
# registration (in the writing transaction, never failing the app's write): the canary falls back to
# the full digest and registers it again.
DIGESTS = """
create table if not exists lakehouse_file_digests (
  dataset_id uuid not null,
  file_path text not null,
  contract_version int not null,
  schema_hash text not null,
  row_count bigint not null,
  digest numeric not null,
  min_row_index bigint,
  max_row_index bigint,
  segments jsonb not null,
  computed_at timestamptz not null default now(),
  computed_by text not null,                  -- write | lazy
  primary key (dataset_id, file_path, contract_version, schema_hash)
);

create table if not exists lakehouse_pg_digest_state (
  dataset_id uuid primary key references datasets(id) on delete cascade,
  contract_version int not null,
  schema_hash text not null,
  hash_sql text not null,
  filled boolean not null default false,
  registered_at timestamptz not null default now(),
  filled_at timestamptz
);

create table if not exists lakehouse_pg_digest_deltas (
  dataset_id uuid not null,
  seg bigint not null,
  n bigint not null,
  s numeric not null
);
create index if not exists lakehouse_pg_digest_deltas_idx on lakehouse_pg_digest_deltas (dataset_id, seg);

-- Fires after the change-tracking triggers of the same event (same-event triggers run in name order:
-- lakehouse_rows_ins < lakehouse_rows_ins_digest), which hold the datasets row lock until commit, so the
-- state read here is the one a registration (which takes that lock) committed.
create or replace function lakehouse_digest_rows() returns trigger language plpgsql as $$
declare r record;
begin
  if tg_op = 'TRUNCATE' then
    delete from lakehouse_pg_digest_deltas;  -- every dataset is empty now: (0, 0) is right
    return null;
  end if;
  if tg_op = 'DELETE' then
    for r in select s.dataset_id, s.hash_sql from lakehouse_pg_digest_state s
              where s.dataset_id in (select distinct dataset_id from lakehouse_old_rows) loop
      begin
        execute format('insert into lakehouse_pg_digest_deltas (dataset_id, seg, n, s)'
                       ' select $1, row_index >> 16, -count(*), -sum(%s) from lakehouse_old_rows'
                       ' where dataset_id = $1 group by 2', r.hash_sql) using r.dataset_id;
      exception when data_exception then
        delete from lakehouse_pg_digest_state where dataset_id = r.dataset_id;
      end;
    end loop;
  elsif tg_op = 'INSERT' then
    for r in select s.dataset_id, s.hash_sql from lakehouse_pg_digest_state s
              where s.dataset_id in (select distinct dataset_id from lakehouse_new_rows) loop
      begin
        execute format('insert into lakehouse_pg_digest_deltas (dataset_id, seg, n, s)'
                       ' select $1, row_index >> 16, count(*), sum(%s) from lakehouse_new_rows'
                       ' where dataset_id = $1 group by 2', r.hash_sql) using r.dataset_id;
      exception when data_exception then
        delete from lakehouse_pg_digest_state where dataset_id = r.dataset_id;
      end;
    end loop;
  else
    for r in select s.dataset_id, s.hash_sql from lakehouse_pg_digest_state s
              where s.dataset_id in (select dataset_id from lakehouse_new_rows
                                     union select dataset_id from lakehouse_old_rows) loop
      begin
        execute format('insert into lakehouse_pg_digest_deltas (dataset_id, seg, n, s)'
                       ' select $1, seg, sum(n), sum(s) from ('
                       '   select row_index >> 16 as seg, 1 as n, (%1$s)::numeric as s from lakehouse_new_rows'
                       '    where dataset_id = $1'
                       '   union all'
                       '   select row_index >> 16, -1, -(%1$s)::numeric from lakehouse_old_rows where dataset_id = $1) d'
                       ' group by seg having sum(n) <> 0 or sum(s) <> 0', r.hash_sql) using r.dataset_id;
      exception when data_exception then
        delete from lakehouse_pg_digest_state where dataset_id = r.dataset_id;
      end;
    end loop;
  end if;
  return null;
end $$;

drop trigger if exists lakehouse_rows_ins_digest on dataset_rows;
create trigger lakehouse_rows_ins_digest after insert on dataset_rows
  referencing new table as lakehouse_new_rows
  for each statement execute function lakehouse_digest_rows();

drop trigger if exists lakehouse_rows_upd_digest on dataset_rows;
create trigger lakehouse_rows_upd_digest after update on dataset_rows
  referencing old table as lakehouse_old_rows new table as lakehouse_new_rows
  for each statement execute function lakehouse_digest_rows();

drop trigger if exists lakehouse_rows_del_digest on dataset_rows;
create trigger lakehouse_rows_del_digest after delete on dataset_rows
  referencing old table as lakehouse_old_rows
  for each statement execute function lakehouse_digest_rows();

drop trigger if exists lakehouse_rows_trunc_digest on dataset_rows;
create trigger lakehouse_rows_trunc_digest after truncate on dataset_rows
  for each statement execute function lakehouse_digest_rows();

-- ALWAYS: the digest follows the rows even under session_replication_role = replica (logical replication
-- apply, restore tools), which silences change tracking; only ALTER TABLE ... DISABLE TRIGGER (the table
-- owner's DDL) silences it, and the full cross-check catches that.
alter table dataset_rows enable always trigger lakehouse_rows_ins_digest;
alter table dataset_rows enable always trigger lakehouse_rows_upd_digest;
alter table dataset_rows enable always trigger lakehouse_rows_del_digest;
alter table dataset_rows enable always trigger lakehouse_rows_trunc_digest;

-- The row hash is per schema: a schema change drops the registration in the same transaction.
create or replace function lakehouse_digest_schema_changed() returns trigger language plpgsql as $$
begin
  delete from lakehouse_pg_digest_state where dataset_id = new.id;
  return null;
end $$;
drop trigger if exists lakehouse_digest_schema_upd on datasets;
create trigger lakehouse_digest_schema_upd after update of schema on datasets
  for each row when (old.schema is distinct from new.schema) execute function lakehouse_digest_schema_changed();
"""
