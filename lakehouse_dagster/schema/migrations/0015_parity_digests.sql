
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
