-- The reverse mirror (mirror/reverse.py): Iceberg -> dataset_rows for datasets written iceberg-native.
--
-- lakehouse_reverse_settings: reverse on/off per dataset / workspace / global (most specific wins; no row: on, the
-- default for every native dataset); lakehouse_reverse_audit: every change, append-only (flags/reverse_setting.py).
create table if not exists lakehouse_reverse_settings (
  scope text not null check (scope in ('global', 'workspace', 'dataset')),
  scope_id uuid,
  enabled boolean not null,
  note text,
  set_by text not null,
  set_at timestamptz not null default now(),
  constraint lakehouse_reverse_settings_scope_id check ((scope = 'global') = (scope_id is null))
);
create unique index if not exists lakehouse_reverse_settings_key
  on lakehouse_reverse_settings (scope, coalesce(scope_id, '00000000-0000-0000-0000-000000000000'::uuid));

create table if not exists lakehouse_reverse_audit (
  id bigserial primary key,
  at timestamptz not null default now(),
  action text not null check (action in ('set', 'clear')),
  scope text not null,
  scope_id uuid,
  before_enabled boolean,
  after_enabled boolean,
  note text,
  actor text not null,
  xid xid8 default pg_current_xact_id()
);
create index if not exists lakehouse_reverse_audit_scope_idx on lakehouse_reverse_audit (scope, scope_id, id desc);

create or replace function lakehouse_reverse_audit_append_only() returns trigger language plpgsql as $$
begin
  raise exception 'lakehouse_reverse_audit is append-only (% refused)', tg_op;
end $$;

drop trigger if exists lakehouse_reverse_audit_no_change on lakehouse_reverse_audit;
create trigger lakehouse_reverse_audit_no_change before update or delete on lakehouse_reverse_audit
  for each statement execute function lakehouse_reverse_audit_append_only();

drop trigger if exists lakehouse_reverse_audit_no_truncate on lakehouse_reverse_audit;
create trigger lakehouse_reverse_audit_no_truncate before truncate on lakehouse_reverse_audit
  for each statement execute function lakehouse_reverse_audit_append_only();

-- The position: the last Iceberg snapshot whose rows dataset_rows holds, written in the same transaction as
-- those rows (a crash leaves Postgres as of a whole snapshot, and the position says which).
create table if not exists lakehouse_reverse_position (
  dataset_id uuid primary key,
  snapshot_id bigint not null,
  how text not null check (how in ('append', 'full')),  -- what the last apply did
  rows_copied bigint not null default 0,
  rows_removed bigint not null default 0,
  pg_rows bigint not null,                              -- rows in dataset_rows after it
  applied_at timestamptz not null default now(),
  xid xid8 not null default pg_current_xact_id()
);

-- A reverse apply is a reconciliation too: the native marker (mirror/native_run.py) ends its walk at its snapshot.
alter table lakehouse_pg_reconciled drop constraint if exists lakehouse_pg_reconciled_how_check;
alter table lakehouse_pg_reconciled add constraint lakehouse_pg_reconciled_how_check
  check (how in ('backfill', 'pg-full-sync', 'reverse'));

-- No echo: a transaction that sets lakehouse.reverse_apply = 'on' (set_config(..., true): that transaction only)
-- is not tracked as a write of the live app (no rows_version, rows_xid or row ranges). The digest triggers still
-- run: the maintained Postgres digest follows the rows whoever writes them.
create or replace function lakehouse_rows_inserted() returns trigger language plpgsql as $$
declare v bigint; one uuid; lo bigint; hi bigint; k bigint; mx bigint; prev bigint;
begin
  -- 033: the reverse mirror's own writes (mirror/reverse.py sets lakehouse.reverse_apply in its transaction)
  -- copy Iceberg's rows back; they are no write of the live app: no version, no rows_xid, no row ranges.
  if current_setting('lakehouse.reverse_apply', true) = 'on' then
    return null;
  end if;
  select dataset_id, min(row_index), max(row_index), count(*) over ()
    into one, lo, hi, k from lakehouse_new_rows group by dataset_id limit 1;
  if k = 1 then  -- 020 fast path: one dataset
    -- 023: a pure append above the known max (the app's common write) in one statement
    update datasets d
       set rows_version = nextval('lakehouse_rows_version_seq'), rows_xid = pg_current_xact_id(), max_row_index = hi
     where d.id = one and d.max_row_index < lo;
    if found then
      return null;
    end if;
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
  -- 033: the reverse mirror's own writes (mirror/reverse.py sets lakehouse.reverse_apply in its transaction)
  -- copy Iceberg's rows back; they are no write of the live app: no version, no rows_xid, no row ranges.
  if current_setting('lakehouse.reverse_apply', true) = 'on' then
    return null;
  end if;
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
