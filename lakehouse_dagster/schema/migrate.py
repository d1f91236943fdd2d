"""Idempotent migrations: the reference app schema and the lakehouse control tables.

Each migration has a stable name and runs once, under an advisory lock, recorded in
``lakehouse_migrations``; every statement is also written to be re-runnable on its own.
They run over app tables that may already exist, hold rows and take the live app's writes (a real
deployment has them before we arrive): after the DDL, ``migrate`` fills change tracking for the rows
that predate our triggers, in batches (``fill_change_tracking``).
"""

from __future__ import annotations

import psycopg

from lakehouse_dagster.schema import (
    flags_sql,
    mirror_sql,
    parity_sql,
    rollback_sql,
    row_changes_sql,
    sources_sql,
    sync_log_sql,
)

APP_SCHEMA = """

create table if not exists workspaces (
  id uuid primary key default gen_random_uuid(),
  name text not null,
  created_at timestamptz not null default now()
);

create table if not exists datasets (
  id uuid primary key default gen_random_uuid(),
  workspace_id uuid references workspaces(id),
  name text not null,
  kind text not null default 'tabular' check (kind in ('tabular', 'manifest')),
  schema jsonb not null default '[]'::jsonb,
  row_count bigint,
  status text not null default 'ready',
  source jsonb,
  error text,
  created_at timestamptz not null default now(),
  updated_at timestamptz not null default now()
);

create table if not exists dataset_rows (
  dataset_id uuid not null references datasets(id) on delete cascade,
  row_index bigint not null,
  row_id uuid not null default gen_random_uuid(),
  created_at timestamptz not null default now(),
  data jsonb not null,
  primary key (dataset_id, row_index)
);

create table if not exists pipelines (
  id uuid primary key default gen_random_uuid(),
  workspace_id uuid references workspaces(id),
  name text not null,
  spec jsonb not null default '{}'::jsonb
);
"""

# Change tracking, O(changed datasets): every write statement on dataset_rows bumps its datasets'
# rows_version from one global sequence and stamps rows_xid with the writing transaction, so a poller
# can ask "which datasets changed since snapshot xmin X" through an index instead of scanning rows.
# rows_rewrite_version moves only when a statement is not a pure append above max_row_index, which is
# what lets a sync append incrementally when appends are all that happened.
CHANGE_TRACKING = """
create sequence if not exists lakehouse_rows_version_seq;

alter table datasets add column if not exists rows_version bigint not null default 0;
alter table datasets add column if not exists rows_rewrite_version bigint not null default 0;
alter table datasets add column if not exists rows_xid xid8;
alter table datasets add column if not exists max_row_index bigint;
create index if not exists datasets_rows_xid_idx on datasets (rows_xid, id);

-- The version is drawn only after the datasets rows are locked: a concurrent writer to the same dataset
-- either committed before (and drew a smaller number) or waits for us (and draws a larger one), so a
-- dataset's rows_version never moves backwards.
create or replace function lakehouse_rows_inserted() returns trigger language plpgsql as $$
declare v bigint;
begin
  perform 1 from datasets where id in (select dataset_id from lakehouse_new_rows) order by id for update;
  v := nextval('lakehouse_rows_version_seq');
  update datasets d
     set rows_version = v,
         rows_xid = pg_current_xact_id(),
         rows_rewrite_version = case when d.max_row_index is not null and c.min_idx <= d.max_row_index
                                     then v else d.rows_rewrite_version end,
         max_row_index = greatest(coalesce(d.max_row_index, -1), c.max_idx),
         updated_at = now()
    from (select dataset_id, min(row_index) as min_idx, max(row_index) as max_idx
            from lakehouse_new_rows group by dataset_id) c
   where d.id = c.dataset_id;
  return null;
end $$;

create or replace function lakehouse_rows_rewritten() returns trigger language plpgsql as $$
declare v bigint;
begin
  if tg_op = 'UPDATE' then
    perform 1 from datasets where id in (select dataset_id from lakehouse_new_rows
                                         union select dataset_id from lakehouse_old_rows) order by id for update;
  elsif tg_op = 'DELETE' then
    perform 1 from datasets where id in (select dataset_id from lakehouse_old_rows) order by id for update;
  else
    perform 1 from datasets order by id for update;
  end if;
  v := nextval('lakehouse_rows_version_seq');
  if tg_op = 'UPDATE' then
    update datasets d
       set rows_version = v, rows_rewrite_version = v, rows_xid = pg_current_xact_id(), updated_at = now(),
           max_row_index = greatest(coalesce(d.max_row_index, -1), c.max_idx)
      from (select dataset_id, max(row_index) as max_idx from lakehouse_new_rows group by dataset_id
            union all
            select distinct dataset_id, null::bigint from lakehouse_old_rows) c
     where d.id = c.dataset_id;
  elsif tg_op = 'DELETE' then
    update datasets d
       set rows_version = v, rows_rewrite_version = v, rows_xid = pg_current_xact_id(), updated_at = now()
     where d.id in (select distinct dataset_id from lakehouse_old_rows);
  else  -- TRUNCATE: every dataset may have changed
    update datasets
       set rows_version = v, rows_rewrite_version = v, rows_xid = pg_current_xact_id(), updated_at = now();
  end if;
  return null;
end $$;

drop trigger if exists lakehouse_rows_ins on dataset_rows;
create trigger lakehouse_rows_ins after insert on dataset_rows
  referencing new table as lakehouse_new_rows
  for each statement execute function lakehouse_rows_inserted();

drop trigger if exists lakehouse_rows_upd on dataset_rows;
create trigger lakehouse_rows_upd after update on dataset_rows
  referencing old table as lakehouse_old_rows new table as lakehouse_new_rows
  for each statement execute function lakehouse_rows_rewritten();

drop trigger if exists lakehouse_rows_del on dataset_rows;
create trigger lakehouse_rows_del after delete on dataset_rows
  referencing old table as lakehouse_old_rows
  for each statement execute function lakehouse_rows_rewritten();

-- A schema change needs a re-sync even when no row changed.
create or replace function lakehouse_schema_changed() returns trigger language plpgsql as $$
declare v bigint := nextval('lakehouse_rows_version_seq');  -- the row is already locked in a BEFORE trigger
begin
  new.rows_version := v; new.rows_rewrite_version := v; new.rows_xid := pg_current_xact_id();
  return new;
end $$;
drop trigger if exists lakehouse_schema_upd on datasets;
create trigger lakehouse_schema_upd before update of schema on datasets
  for each row when (old.schema is distinct from new.schema) execute function lakehouse_schema_changed();

drop trigger if exists lakehouse_rows_trunc on dataset_rows;
create trigger lakehouse_rows_trunc after truncate on dataset_rows
  for each statement execute function lakehouse_rows_rewritten();
"""

SYNC_LOG = """
create table if not exists iceberg_sync_log (
  id bigserial primary key,
  dataset_id uuid not null,
  sync_id uuid not null unique,
  writer text not null default 'sync.full',
  path text not null default 'mirror' check (path in ('mirror', 'native')),
  mode text,
  status text not null check (status in ('running', 'succeeded', 'failed')),
  rows bigint,
  bytes bigint,
  snapshot_id bigint,
  has_identity boolean not null default false,
  source_version bigint,
  max_row_index bigint,
  run_id text,
  error text,
  started_at timestamptz not null default now(),
  finished_at timestamptz
);
create index if not exists iceberg_sync_log_dataset_idx on iceberg_sync_log (dataset_id, finished_at desc nulls last);
create index if not exists iceberg_sync_log_running_idx on iceberg_sync_log (status) where status = 'running';
"""


# Adopting a live database. The app's tables may have only the foundation columns, and their writes
# must never fail because of us: the change-tracking triggers now write lakehouse-owned columns only
# (no updated_at), and the columns the project itself reads or writes on app tables are added when
# missing (nullable or defaulted: an app insert that does not name them still works). Those are, by a
# grep of the package: datasets.source, .error, .updated_at; everything else it touches on workspaces,
# datasets, dataset_rows and pipelines is in the foundation shape.
# max_row_index NULL now means "unknown" (a dataset that had rows before the triggers existed): an
# insert into such a dataset is never taken for an append, and the max is read from dataset_rows (one
# backward index probe). New datasets start at -1, known empty. fill_change_tracking() fills the rest.
ADOPT_APP_TABLES = """
alter table datasets add column if not exists source jsonb;  -- the demo's seed marker
alter table datasets add column if not exists error text;  -- why a sync or native write failed
alter table datasets add column if not exists updated_at timestamptz default now();  -- set by our writes
alter table datasets alter column max_row_index set default -1;

create or replace function lakehouse_rows_inserted() returns trigger language plpgsql as $$
declare v bigint;
begin
  perform 1 from datasets where id in (select dataset_id from lakehouse_new_rows) order by id for update;
  v := nextval('lakehouse_rows_version_seq');
  update datasets d
     set rows_version = v,
         rows_xid = pg_current_xact_id(),
         rows_rewrite_version = case when d.max_row_index is null or c.min_idx <= d.max_row_index
                                     then v else d.rows_rewrite_version end,
         max_row_index = case when d.max_row_index is null
                              then (select max(r.row_index) from dataset_rows r where r.dataset_id = d.id)
                              else greatest(d.max_row_index, c.max_idx) end
    from (select dataset_id, min(row_index) as min_idx, max(row_index) as max_idx
            from lakehouse_new_rows group by dataset_id) c
   where d.id = c.dataset_id;
  return null;
end $$;

create or replace function lakehouse_rows_rewritten() returns trigger language plpgsql as $$
declare v bigint;
begin
  if tg_op = 'UPDATE' then
    perform 1 from datasets where id in (select dataset_id from lakehouse_new_rows
                                         union select dataset_id from lakehouse_old_rows) order by id for update;
  elsif tg_op = 'DELETE' then
    perform 1 from datasets where id in (select dataset_id from lakehouse_old_rows) order by id for update;
  else
    perform 1 from datasets order by id for update;
  end if;
  v := nextval('lakehouse_rows_version_seq');
  if tg_op = 'UPDATE' then
    update datasets d
       set rows_version = v, rows_rewrite_version = v, rows_xid = pg_current_xact_id(),
           max_row_index = case when d.max_row_index is null
                                then (select max(r.row_index) from dataset_rows r where r.dataset_id = d.id)
                                else greatest(d.max_row_index, c.max_idx) end
      from (select dataset_id, max(max_idx) as max_idx
              from (select dataset_id, row_index as max_idx from lakehouse_new_rows
                    union all
                    select dataset_id, null::bigint from lakehouse_old_rows) t
             group by dataset_id) c
     where d.id = c.dataset_id;
  elsif tg_op = 'DELETE' then
    update datasets d
       set rows_version = v, rows_rewrite_version = v, rows_xid = pg_current_xact_id()
     where d.id in (select distinct dataset_id from lakehouse_old_rows);
  else  -- TRUNCATE: every dataset may have changed
    update datasets set rows_version = v, rows_rewrite_version = v, rows_xid = pg_current_xact_id();
  end if;
  return null;
end $$;
"""

# Two app statements inserting into one dataset at once deadlocked: each statement's foreign-key check
# takes KEY SHARE on the datasets row, then the change-tracking trigger asked FOR UPDATE, which conflicts
# with the other's KEY SHARE. FOR NO KEY UPDATE (what the trigger's own UPDATE takes anyway) does not
# conflict with KEY SHARE and still serialises the writers of one dataset (a version never moves back).
NO_KEY_ROW_LOCKS = ADOPT_APP_TABLES[
    ADOPT_APP_TABLES.index("create or replace function lakehouse_rows_inserted") :
].replace("for update;", "for no key update;")


# Migration 020 (what the live app pays for its writes). Almost every app statement writes one dataset.
# For it the triggers now read the statement's rows once (its dataset, its row_index range, and whether
# it is the only dataset) and lock, draw the version and update through the primary key with cached
# plans, instead of joining the transition table into two more statements. The order is the 018 one —
# lock the datasets row (FOR NO KEY UPDATE), then draw the version, then update — so a version never
# moves back and the writers of one dataset serialise, deadlock-free; the values written are the 018
# ones. A statement over several datasets (k > 1), an empty one and TRUNCATE take the 018 body,
# unchanged below the fast path. Both paths carry migration 019's row-range records (blocks marked
# "019: row ranges", schema/row_changes_sql.py), written before the datasets update so that prev_version is
# the dataset's rows_rewrite_version before this statement; a pure append records nothing.
ONE_DATASET_TRACKING = """
create or replace function lakehouse_rows_inserted() returns trigger language plpgsql as $$
declare v bigint; one uuid; lo bigint; hi bigint; k bigint; mx bigint; prev bigint;
begin
  select dataset_id, min(row_index), max(row_index), count(*) over ()
    into one, lo, hi, k from lakehouse_new_rows group by dataset_id limit 1;
  if k = 1 then  -- 020 fast path: one dataset
    select d.max_row_index, d.rows_rewrite_version into mx, prev from datasets d where d.id = one for no key update;
    v := nextval('lakehouse_rows_version_seq');
    -- 019: row ranges (rows at or below the known max; a pure append, or an unknown max, records nothing).
    if lo <= mx then
      insert into lakehouse_row_changes (dataset_id, version, bucket, prev_version, min_idx, max_idx)
      select one, v, n.row_index >> 12, prev, min(n.row_index), max(n.row_index)
        from lakehouse_new_rows n where n.row_index <= mx group by n.row_index >> 12;
    end if;
    update datasets d
       set rows_version = v,
           rows_xid = pg_current_xact_id(),
           rows_rewrite_version = case when d.max_row_index is null or lo <= d.max_row_index
                                       then v else d.rows_rewrite_version end,
           max_row_index = case when d.max_row_index is null
                                then (select max(r.row_index) from dataset_rows r where r.dataset_id = d.id)
                                else greatest(d.max_row_index, hi) end
     where d.id = one;
    return null;
  end if;
  -- 018 path
  perform 1 from datasets where id in (select dataset_id from lakehouse_new_rows) order by id for no key update;
  v := nextval('lakehouse_rows_version_seq');
  -- 019: row ranges
  insert into lakehouse_row_changes (dataset_id, version, bucket, prev_version, min_idx, max_idx)
  select n.dataset_id, v, n.row_index >> 12, d.rows_rewrite_version, min(n.row_index), max(n.row_index)
    from lakehouse_new_rows n join datasets d on d.id = n.dataset_id
   where n.row_index <= d.max_row_index
   group by n.dataset_id, n.row_index >> 12, d.rows_rewrite_version;
  update datasets d
     set rows_version = v,
         rows_xid = pg_current_xact_id(),
         rows_rewrite_version = case when d.max_row_index is null or c.min_idx <= d.max_row_index
                                     then v else d.rows_rewrite_version end,
         max_row_index = case when d.max_row_index is null
                              then (select max(r.row_index) from dataset_rows r where r.dataset_id = d.id)
                              else greatest(d.max_row_index, c.max_idx) end
    from (select dataset_id, min(row_index) as min_idx, max(row_index) as max_idx
            from lakehouse_new_rows group by dataset_id) c
   where d.id = c.dataset_id;
  return null;
end $$;

create or replace function lakehouse_rows_rewritten() returns trigger language plpgsql as $$
declare v bigint; one uuid; hi bigint; k bigint; prev bigint;
begin
  if tg_op = 'UPDATE' then
    select dataset_id, max(idx), count(*) over () into one, hi, k
      from (select dataset_id, row_index as idx from lakehouse_new_rows
            union all
            select dataset_id, null::bigint from lakehouse_old_rows) t
     group by dataset_id limit 1;
  elsif tg_op = 'DELETE' then
    select dataset_id, count(*) over () into one, k from lakehouse_old_rows group by dataset_id limit 1;
  end if;
  if k = 1 then  -- 020 fast path: one dataset
    select d.rows_rewrite_version into prev from datasets d where d.id = one for no key update;
    v := nextval('lakehouse_rows_version_seq');
    if tg_op = 'UPDATE' then
      -- 019: row ranges (old and new row_index)
      insert into lakehouse_row_changes (dataset_id, version, bucket, prev_version, min_idx, max_idx)
      select one, v, t.row_index >> 12, prev, min(t.row_index), max(t.row_index)
        from (select row_index from lakehouse_new_rows union all select row_index from lakehouse_old_rows) t
       group by t.row_index >> 12;
      update datasets d
         set rows_version = v, rows_rewrite_version = v, rows_xid = pg_current_xact_id(),
             max_row_index = case when d.max_row_index is null
                                  then (select max(r.row_index) from dataset_rows r where r.dataset_id = d.id)
                                  else greatest(d.max_row_index, hi) end
       where d.id = one;
    else
      -- 019: row ranges (old row_index)
      insert into lakehouse_row_changes (dataset_id, version, bucket, prev_version, min_idx, max_idx)
      select one, v, t.row_index >> 12, prev, min(t.row_index), max(t.row_index)
        from lakehouse_old_rows t group by t.row_index >> 12;
      update datasets d set rows_version = v, rows_rewrite_version = v, rows_xid = pg_current_xact_id()
       where d.id = one;
    end if;
    return null;
  end if;
  -- 018 path
  if tg_op = 'UPDATE' then
    perform 1 from datasets where id in (select dataset_id from lakehouse_new_rows
                                         union select dataset_id from lakehouse_old_rows) order by id for no key update;
  elsif tg_op = 'DELETE' then
    perform 1 from datasets where id in (select dataset_id from lakehouse_old_rows) order by id for no key update;
  else
    perform 1 from datasets order by id for no key update;
  end if;
  v := nextval('lakehouse_rows_version_seq');
  -- 019: row ranges (UPDATE: old and new row_index; DELETE: old; TRUNCATE records nothing: the chain breaks)
  if tg_op = 'UPDATE' then
    insert into lakehouse_row_changes (dataset_id, version, bucket, prev_version, min_idx, max_idx)
    select t.dataset_id, v, t.row_index >> 12, d.rows_rewrite_version, min(t.row_index), max(t.row_index)
      from (select dataset_id, row_index from lakehouse_new_rows
            union all select dataset_id, row_index from lakehouse_old_rows) t
      join datasets d on d.id = t.dataset_id
     group by t.dataset_id, t.row_index >> 12, d.rows_rewrite_version;
  elsif tg_op = 'DELETE' then
    insert into lakehouse_row_changes (dataset_id, version, bucket, prev_version, min_idx, max_idx)
    select t.dataset_id, v, t.row_index >> 12, d.rows_rewrite_version, min(t.row_index), max(t.row_index)
      from lakehouse_old_rows t join datasets d on d.id = t.dataset_id
     group by t.dataset_id, t.row_index >> 12, d.rows_rewrite_version;
  end if;
  if tg_op = 'UPDATE' then
    update datasets d
       set rows_version = v, rows_rewrite_version = v, rows_xid = pg_current_xact_id(),
           max_row_index = case when d.max_row_index is null
                                then (select max(r.row_index) from dataset_rows r where r.dataset_id = d.id)
                                else greatest(d.max_row_index, c.max_idx) end
      from (select dataset_id, max(max_idx) as max_idx
              from (select dataset_id, row_index as max_idx from lakehouse_new_rows
                    union all
                    select dataset_id, null::bigint from lakehouse_old_rows) t
             group by dataset_id) c
     where d.id = c.dataset_id;
  elsif tg_op = 'DELETE' then
    update datasets d
       set rows_version = v, rows_rewrite_version = v, rows_xid = pg_current_xact_id()
     where d.id in (select distinct dataset_id from lakehouse_old_rows);
  else  -- TRUNCATE: every dataset may have changed
    update datasets set rows_version = v, rows_rewrite_version = v, rows_xid = pg_current_xact_id();
  end if;
  return null;
end $$;
"""

# Migration 023: the app's most common write, a one-dataset append above the known max_row_index, in ONE
# statement. Measured (bench/bench_app_writes.py), a one-row insert's change tracking was the trigger's
# separate lock, version draw and update (three SPI statements on top of reading the transition table); an
# UPDATE that draws the version in its SET and holds the append test in its WHERE does the same: it takes
# the same FOR NO KEY UPDATE row lock, and a writer that waits for that lock (another writer of the
# dataset) re-evaluates the row and its SET after the other commits (EvalPlanQual, READ COMMITTED), so its
# version is drawn after the other's commit and never moves back; under REPEATABLE READ it fails with a
# serialisation error, as the explicit lock did. What it writes is the 020 path's for an append (version,
# writing transaction, max; rows_rewrite_version and the row ranges untouched). Not an append (or an
# unknown max, or the other writer's commit made it one no more): no row matches, and the 020 path below
# runs unchanged.
_FAST_020 = "  if k = 1 then  -- 020 fast path: one dataset\n"
APPEND_IN_ONE_STATEMENT = ONE_DATASET_TRACKING[
    : ONE_DATASET_TRACKING.index("create or replace function lakehouse_rows_rewritten")
].replace(
    _FAST_020,
    _FAST_020
    + """\
    -- 023: a pure append above the known max (the app's common write) in one statement
    update datasets d
       set rows_version = nextval('lakehouse_rows_version_seq'), rows_xid = pg_current_xact_id(), max_row_index = hi
     where d.id = one and d.max_row_index < lo;
    if found then
      return null;
    end if;
""",
    1,
)
assert "023: a pure append" in APPEND_IN_ONE_STATEMENT

# One batch of the fill (its own transaction) over every dataset once: datasets no trigger ever stamped
# get a version, the writing transaction and their true max row_index, and a max the pre-007 trigger
# set too low (it started from -1 for a dataset that already had rows) is raised. ``greatest`` and the
# row locks mean a concurrent app write is never undone: its trigger either ran before (we wait for it
# and keep its larger values) or runs after us. A batch skips the rows the app holds right now (its
# writes must never queue behind a batch waiting for one of them); those are done afterwards one at a
# time, each waiting for the app while holding no other lock.
_FILL_IDS = "select id from datasets where id > %(after)s order by id limit %(batch)s"
_FILL_LOCK = "select id from datasets where id = any(%(ids)s::uuid[]) order by id for update skip locked"
_FILL_LOCK_ONE = "select id from datasets where id = %(id)s for update"
# A new statement, so a new snapshot (READ COMMITTED): max(row_index) sees every row committed before
# the locks were granted; the version is drawn after them, like the triggers do.
_FILL_STAMP = """
update datasets d
   set max_row_index = greatest(d.max_row_index, m.mx, -1),
       rows_rewrite_version = case when d.rows_version = 0 then greatest(d.rows_rewrite_version, v.v)
                                   else d.rows_rewrite_version end,
       rows_version = case when d.rows_version = 0 then v.v else d.rows_version end,
       rows_xid = coalesce(d.rows_xid, pg_current_xact_id())
  from (select x.id, (select max(r.row_index) from dataset_rows r where r.dataset_id = x.id) as mx
          from unnest(%(ids)s::uuid[]) as x(id)) m,
       (select nextval('lakehouse_rows_version_seq') as v) v
 where d.id = m.id
   and (d.rows_xid is null or d.max_row_index is null or d.max_row_index < m.mx)
"""

FILL_MARK = "007_change_tracking_filled"


def fill_change_tracking(conn: psycopg.Connection, *, batch: int = 1000) -> int:
    """Stamp change tracking on datasets that predate the triggers, in batches of ``batch`` datasets,
    each its own transaction. Safe to re-run (it only raises values and stamps what is unstamped); a
    mark in lakehouse_migrations, written at the end, makes the next ``migrate`` skip it. Returns the
    number of datasets it changed."""
    if conn.execute("select 1 from lakehouse_migrations where name = %s", (FILL_MARK,)).fetchone():
        return 0
    after, total, busy = "00000000-0000-0000-0000-000000000000", 0, []
    while True:
        ids = [r[0] for r in conn.execute(_FILL_IDS, {"after": after, "batch": batch}).fetchall()]
        if not ids:
            break
        with conn.transaction():
            locked = [r[0] for r in conn.execute(_FILL_LOCK, {"ids": ids}).fetchall()]
            if locked:
                total += conn.execute(_FILL_STAMP, {"ids": locked}).rowcount
        busy += sorted(set(ids) - set(locked))
        after = str(ids[-1])
    for ds_id in busy:
        with conn.transaction():
            if conn.execute(_FILL_LOCK_ONE, {"id": ds_id}).fetchone():
                total += conn.execute(_FILL_STAMP, {"ids": [ds_id]}).rowcount
    conn.execute("insert into lakehouse_migrations (name) values (%s) on conflict do nothing", (FILL_MARK,))
    return total


# (name, sql). Append new migrations at the end with a new name; never edit a shipped one's meaning.
MIGRATIONS: list[tuple[str, str]] = [
    ("001_app_schema", APP_SCHEMA),
    ("002_change_tracking", CHANGE_TRACKING),
    ("003_iceberg_sync_log", SYNC_LOG + mirror_sql.BAD_VALUE_FN + mirror_sql.FIND_BAD_ROW_FN),
    ("004_flags", flags_sql.SQL),
    ("005_parity", parity_sql.SQL),
    # The poller's retry sweep looks at recent failed mirror syncs only.
    (
        "006_sync_log_failed_idx",
        "create index if not exists iceberg_sync_log_failed_idx"
        " on iceberg_sync_log (finished_at) where status = 'failed';",
    ),
    # Adopting a live database: missing app columns, triggers that write lakehouse-owned columns only.
    ("007_adopt_app_tables", ADOPT_APP_TABLES),
    # The latest succeeded sync (one definition), datasets.mirrored_version and the poller's sweep.
    ("008_latest_sync_and_sweep", sync_log_sql.MIGRATION_LATEST + sync_log_sql.MIGRATION_MIRRORED),
    ("010_sources", sources_sql.SQL),
    ("011_rollback", rollback_sql.SQL),
    ("012_widen_rules", flags_sql.WIDEN_RULES),
    ("015_parity_digests", parity_sql.DIGESTS),
    # Concurrent app inserts into one dataset must not deadlock on the datasets row (FK KEY SHARE vs FOR UPDATE).
    ("018_no_key_row_locks", NO_KEY_ROW_LOCKS),
    # Flag changes reach every process in under a second (LISTEN/NOTIFY; the TTL stays the fallback).
    ("016_flag_notify", flags_sql.FLAG_NOTIFY),
    # row.edit partial rewrites: the row_index ranges each rewriting statement touched (schema/row_changes_sql.py).
    ("019_row_changes", row_changes_sql.ROW_CHANGES),
    # What the live app pays for its writes: the maintained digest without per-statement planning; change
    # tracking's one-dataset fast path (it carries 019's row ranges).
    ("020_app_write_cost", ONE_DATASET_TRACKING + parity_sql.APP_WRITE_COST),
    # Identity readiness reads only the data files it has not verified yet (per-file facts, issue 11).
    ("021_file_identity", parity_sql.FILE_IDENTITY),
    # The maintained digest can leave the app's transaction: a logical decoding consumer (tracking/capture.py).
    ("022_digest_capture", parity_sql.DIGEST_CAPTURE),
    # A one-dataset append's change tracking in one statement (what the live app pays, issue 11).
    ("023_append_in_one_statement", APPEND_IN_ONE_STATEMENT),
    # Change tracking can leave the app's transaction too (capture mode wal-tracking, issue 11).
    ("024_tracking_capture", parity_sql.TRACKING_CAPTURE),
]

_LOCK_KEY = 0x1A4E_0001


def migrate(conn: psycopg.Connection) -> list[str]:
    """Apply pending migrations; returns the names applied now (empty when up to date)."""
    applied_now: list[str] = []
    with conn.transaction():
        conn.execute("select pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        conn.execute(
            "create table if not exists lakehouse_migrations ("
            " name text primary key, applied_at timestamptz not null default now())"
        )
        done = {r[0] for r in conn.execute("select name from lakehouse_migrations")}
        for name, sql in MIGRATIONS:
            if name in done:
                continue
            conn.execute(sql)
            conn.execute("insert into lakehouse_migrations (name) values (%s)", (name,))
            applied_now.append(name)
    filled = fill_change_tracking(conn)
    if filled:
        applied_now.append(f"{FILL_MARK} ({filled} datasets)")
    return applied_now
