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

# Migration "020_app_write_cost": what the live app pays for a write to a registered dataset.
#
# Measured (bench/bench_app_writes.py), the 015 trigger spent most of a small statement planning its
# dynamic ``execute format(...)`` of the row hash expression (parse + plan of every typed field, on every
# statement; the UPDATE form holds the expression twice) and in an exception block whose subtransaction
# wrote the delta rows. Now the row hash lives in one plpgsql function per hash expression, created at
# registration (``lakehouse_digest_fn``, named by the md5 of the expression, so a name always means one
# body): its one query holds the expression once and is planned once per session (a plpgsql function,
# not SQL: a SQL function would be inlined into the caller and planned again). The trigger hands it the
# statement's rows of the dataset as one array of signed rows (+1 inserted, -1 deleted) and gets the
# deltas back as an array (a dynamic call, but of ``select fn($1)``: nothing to plan), inside an exception
# block that only reads (no subtransaction XID); the delta rows are written after it by a static insert. A statement of more than DIGEST_ARRAY_ROWS rows of one dataset
# keeps the 015 set-based path (planning is negligible there, and an array would hold the statement's
# rows in memory again). What is recorded is unchanged: the same per-segment (count, sum) deltas; a
# value the hash cannot type (or a missing function) drops the registration in the writing transaction,
# never fails the app's write.
DIGEST_ARRAY_ROWS = 1000


def _signed_rows(table: str, sign: int) -> str:
    return (
        f"select t.row_index, t.row_id, t.created_at, t.data, {sign} from {table} t where t.dataset_id = r.dataset_id"
    )


def _digest_event(ids: str, rows: str, set_sql: str) -> str:
    """The trigger's loop over the registered datasets of one statement (one event's transition tables)."""
    return f"""
    for r in select s.dataset_id, s.hash_sql, s.hash_fn from lakehouse_pg_digest_state s
              where s.dataset_id in ({ids}) loop
      deltas := null;
      select array_agg(row(t.*)::lakehouse_digest_row) into signed
        from ({rows} limit {DIGEST_ARRAY_ROWS + 1}) t;
      if r.hash_fn is null or cardinality(signed) > {DIGEST_ARRAY_ROWS} then
        begin  -- the 015 set-based path
          execute format({set_sql}, r.hash_sql) using r.dataset_id;
        exception when data_exception then
          delete from lakehouse_pg_digest_state where dataset_id = r.dataset_id;
        end;
        continue;
      end if;
      begin
        execute format('select %I($1)', r.hash_fn) into deltas using signed;
      exception when data_exception or undefined_function then
        delete from lakehouse_pg_digest_state where dataset_id = r.dataset_id;
        continue;
      end;
      insert into lakehouse_pg_digest_deltas (dataset_id, seg, n, s)
        select r.dataset_id, d.seg, d.n, d.s from unnest(deltas) d;
    end loop;"""


_SET_INSERT = (
    "'insert into lakehouse_pg_digest_deltas (dataset_id, seg, n, s)"
    " select $1, row_index >> 16, count(*), sum(%s) from lakehouse_new_rows where dataset_id = $1 group by 2'"
)
_SET_DELETE = (
    "'insert into lakehouse_pg_digest_deltas (dataset_id, seg, n, s)"
    " select $1, row_index >> 16, -count(*), -sum(%s) from lakehouse_old_rows where dataset_id = $1 group by 2'"
)
_SET_UPDATE = (
    "'insert into lakehouse_pg_digest_deltas (dataset_id, seg, n, s) select $1, seg, sum(n), sum(s) from ("
    " select row_index >> 16 as seg, 1 as n, (%1$s)::numeric as s from lakehouse_new_rows where dataset_id = $1"
    " union all"
    " select row_index >> 16, -1, -(%1$s)::numeric from lakehouse_old_rows where dataset_id = $1) d"
    " group by seg having sum(n) <> 0 or sum(s) <> 0'"
)

APP_WRITE_COST = (
    """
alter table lakehouse_pg_digest_state add column if not exists hash_fn text;

-- What the hash reads of a row (not dataset_rows' row type: a live table may have more columns), and
-- whether the statement added (+1) or removed (-1) it.
do $$ begin
  create type lakehouse_digest_row as (row_index bigint, row_id uuid, created_at timestamptz, data jsonb, sign int);
exception when duplicate_object then null;
end $$;
do $$ begin
  create type lakehouse_digest_delta as (seg bigint, n bigint, s numeric);
exception when duplicate_object then null;
end $$;

-- The function giving the per-segment (count, sum) deltas of an array of signed rows under one row hash
-- expression; created once per expression (under an advisory lock: concurrent registrations of datasets
-- of one schema), returns its name.
create or replace function lakehouse_digest_fn(p_hash_sql text) returns text language plpgsql as $$
declare fn text := 'lakehouse_rowdigest_' || md5(p_hash_sql);
begin
  if to_regproc(fn) is null then
    perform pg_advisory_xact_lock(441319456, hashtext(fn));  -- class 0x1A4E_0020, beside the fill's 0x1A4E_0015
    if to_regproc(fn) is null then
      execute format(
        'create function %I(signed lakehouse_digest_row[]) returns lakehouse_digest_delta[]'
        ' language plpgsql stable set plan_cache_mode = force_generic_plan as %L', fn,
        'begin return (select array_agg(row(d.seg, d.n, d.s)::lakehouse_digest_delta) from ('
        ' select row_index >> 16 as seg, sum(sign)::bigint as n, sum(sign * (' || p_hash_sql || ')::numeric) as s'
        ' from unnest(signed) group by 1) d where d.n <> 0 or d.s <> 0); end');
    end if;
  end if;
  return fn;
end $$;

update lakehouse_pg_digest_state set hash_fn = lakehouse_digest_fn(hash_sql) where hash_fn is null;

-- Fires after the change-tracking triggers of the same event (name order), which hold the datasets row
-- lock until commit, so the state read here is the one a registration (which takes that lock) committed.
create or replace function lakehouse_digest_rows() returns trigger language plpgsql as $$
declare
  r record;
  signed lakehouse_digest_row[];
  deltas lakehouse_digest_delta[];
begin
  if tg_op = 'TRUNCATE' then
    delete from lakehouse_pg_digest_deltas;  -- every dataset is empty now: (0, 0) is right
    return null;
  end if;
  if tg_op = 'INSERT' then"""
    + _digest_event("select dataset_id from lakehouse_new_rows", _signed_rows("lakehouse_new_rows", 1), _SET_INSERT)
    + """
  elsif tg_op = 'DELETE' then"""
    + _digest_event("select dataset_id from lakehouse_old_rows", _signed_rows("lakehouse_old_rows", -1), _SET_DELETE)
    + """
  else"""
    + _digest_event(
        "select dataset_id from lakehouse_new_rows union all select dataset_id from lakehouse_old_rows",
        _signed_rows("lakehouse_new_rows", 1) + " union all " + _signed_rows("lakehouse_old_rows", -1),
        _SET_UPDATE,
    )
    + """
  end if;
  return null;
end $$;
"""
)

# The maintained digest out of the app's transaction (tracking/capture.py): with capture mode "wal" the digest
# triggers are disabled and a consumer of a logical replication slot (pgoutput, read through the SQL
# interface) adds and subtracts the row hashes after the app has committed. Change tracking stays in the
# app's transaction, so a dataset's rows_version still moves with its rows; the consumer records, per
# registered dataset, the version its sums include (applied_version), and a maintained comparison is made
# only when that equals the rows_version of the same snapshot. ``fill_version``: the rows_version the fill's
# snapshot saw — a transaction that stamped a version at or below it is already in the filled sums.
DIGEST_CAPTURE = """
alter table lakehouse_pg_digest_state add column if not exists fill_version bigint;
alter table lakehouse_pg_digest_state add column if not exists applied_version bigint;

create table if not exists lakehouse_digest_capture (
  one boolean primary key default true check (one),
  mode text not null default 'triggers' check (mode in ('triggers', 'wal')),
  slot text,                                  -- the logical replication slot (pgoutput) while mode is wal
  applied_lsn pg_lsn,                         -- end of the last transaction the consumer has applied or skipped
  applying boolean not null default false,    -- the consumer has passed the switch to wal (see the switch table)
  changed_at timestamptz not null default now()
);
insert into lakehouse_digest_capture default values on conflict do nothing;

-- One row per switch, written in the switching transaction: in the slot's stream it marks exactly where
-- the triggers stopped (or started again) adding the hashes.
create table if not exists lakehouse_digest_capture_switch (
  id bigserial primary key,
  mode text not null check (mode in ('triggers', 'wal')),
  at timestamptz not null default now()
);
"""

# Capture mode "wal-tracking" (tracking/capture.py, tracking/barrier.py): change tracking leaves the app's
# transaction too. The app's statement then only takes a shared transaction-level advisory lock per dataset
# it wrote (the barrier: a reader that pairs the tracking with rows takes it exclusive, waits for those
# writers, catches the WAL consumer up and pins); the consumer writes rows_version, rows_xid, max_row_index,
# rows_rewrite_version and the row-range records after the commit. The barrier triggers ship disabled and
# ENABLE ALWAYS when on (a write under session_replication_role = replica is decoded too, so it must wait
# as well). ``tracking``: the consumer has passed a switch to wal-tracking in the stream.
TRACKING_CAPTURE = """
alter table lakehouse_digest_capture add column if not exists tracking boolean not null default false;
alter table lakehouse_digest_capture drop constraint if exists lakehouse_digest_capture_mode_check;
alter table lakehouse_digest_capture add constraint lakehouse_digest_capture_mode_check
  check (mode in ('triggers', 'wal', 'wal-tracking'));
alter table lakehouse_digest_capture_switch drop constraint if exists lakehouse_digest_capture_switch_mode_check;
alter table lakehouse_digest_capture_switch add constraint lakehouse_digest_capture_switch_mode_check
  check (mode in ('triggers', 'wal', 'wal-tracking'));

create or replace function lakehouse_rows_barrier_ins() returns trigger language plpgsql as $$
begin
  perform pg_advisory_xact_lock_shared(uuid_hash_extended(d, 0))
     from (select distinct dataset_id as d from lakehouse_new_rows order by 1) s;
  return null;
end $$;
create or replace function lakehouse_rows_barrier_upd() returns trigger language plpgsql as $$
begin
  perform pg_advisory_xact_lock_shared(uuid_hash_extended(d, 0))
     from (select distinct dataset_id as d from (select dataset_id from lakehouse_new_rows
                                                 union all select dataset_id from lakehouse_old_rows) t
           order by 1) s;
  return null;
end $$;
create or replace function lakehouse_rows_barrier_del() returns trigger language plpgsql as $$
begin
  perform pg_advisory_xact_lock_shared(uuid_hash_extended(d, 0))
     from (select distinct dataset_id as d from lakehouse_old_rows order by 1) s;
  return null;
end $$;
drop trigger if exists lakehouse_rows_barrier_ins on dataset_rows;
drop trigger if exists lakehouse_rows_barrier_upd on dataset_rows;
drop trigger if exists lakehouse_rows_barrier_del on dataset_rows;
create trigger lakehouse_rows_barrier_ins after insert on dataset_rows
  referencing new table as lakehouse_new_rows for each statement execute function lakehouse_rows_barrier_ins();
create trigger lakehouse_rows_barrier_upd after update on dataset_rows
  referencing old table as lakehouse_old_rows new table as lakehouse_new_rows
  for each statement execute function lakehouse_rows_barrier_upd();
create trigger lakehouse_rows_barrier_del after delete on dataset_rows
  referencing old table as lakehouse_old_rows for each statement execute function lakehouse_rows_barrier_del();
alter table dataset_rows disable trigger lakehouse_rows_barrier_ins;
alter table dataset_rows disable trigger lakehouse_rows_barrier_upd;
alter table dataset_rows disable trigger lakehouse_rows_barrier_del;
"""
