
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
  if tg_op = 'INSERT' then
    for r in select s.dataset_id, s.hash_sql, s.hash_fn from lakehouse_pg_digest_state s
              where s.dataset_id in (select dataset_id from lakehouse_new_rows) loop
      deltas := null;
      select array_agg(row(t.*)::lakehouse_digest_row) into signed
        from (select t.row_index, t.row_id, t.created_at, t.data, 1 from lakehouse_new_rows t where t.dataset_id = r.dataset_id limit 1001) t;
      if r.hash_fn is null or cardinality(signed) > 1000 then
        begin  -- the 015 set-based path
          execute format('insert into lakehouse_pg_digest_deltas (dataset_id, seg, n, s) select $1, row_index >> 16, count(*), sum(%s) from lakehouse_new_rows where dataset_id = $1 group by 2', r.hash_sql) using r.dataset_id;
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
    end loop;
  elsif tg_op = 'DELETE' then
    for r in select s.dataset_id, s.hash_sql, s.hash_fn from lakehouse_pg_digest_state s
              where s.dataset_id in (select dataset_id from lakehouse_old_rows) loop
      deltas := null;
      select array_agg(row(t.*)::lakehouse_digest_row) into signed
        from (select t.row_index, t.row_id, t.created_at, t.data, -1 from lakehouse_old_rows t where t.dataset_id = r.dataset_id limit 1001) t;
      if r.hash_fn is null or cardinality(signed) > 1000 then
        begin  -- the 015 set-based path
          execute format('insert into lakehouse_pg_digest_deltas (dataset_id, seg, n, s) select $1, row_index >> 16, -count(*), -sum(%s) from lakehouse_old_rows where dataset_id = $1 group by 2', r.hash_sql) using r.dataset_id;
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
    end loop;
  else
    for r in select s.dataset_id, s.hash_sql, s.hash_fn from lakehouse_pg_digest_state s
              where s.dataset_id in (select dataset_id from lakehouse_new_rows union all select dataset_id from lakehouse_old_rows) loop
      deltas := null;
      select array_agg(row(t.*)::lakehouse_digest_row) into signed
        from (select t.row_index, t.row_id, t.created_at, t.data, 1 from lakehouse_new_rows t where t.dataset_id = r.dataset_id union all select t.row_index, t.row_id, t.created_at, t.data, -1 from lakehouse_old_rows t where t.dataset_id = r.dataset_id limit 1001) t;
      if r.hash_fn is null or cardinality(signed) > 1000 then
        begin  -- the 015 set-based path
          execute format('insert into lakehouse_pg_digest_deltas (dataset_id, seg, n, s) select $1, seg, sum(n), sum(s) from ( select row_index >> 16 as seg, 1 as n, (%1$s)::numeric as s from lakehouse_new_rows where dataset_id = $1 union all select row_index >> 16, -1, -(%1$s)::numeric from lakehouse_old_rows where dataset_id = $1) d group by seg having sum(n) <> 0 or sum(s) <> 0', r.hash_sql) using r.dataset_id;
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
    end loop;
  end if;
  return null;
end $$;
