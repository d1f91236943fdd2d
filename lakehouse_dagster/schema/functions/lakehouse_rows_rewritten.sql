-- lakehouse_rows_rewritten: the current definition (first defined by migration 002_change_tracking, last by 033_reverse_mirror).
-- Re-applied by every migrate after the numbered migrations (create or replace: triggers and their
-- enabled state are untouched). Change a body here, never in a shipped migration.
--
-- Change tracking of UPDATE, DELETE and TRUNCATE on dataset_rows (triggers lakehouse_rows_upd, _del, _trunc):
-- rows_version and rows_rewrite_version move together; UPDATE keeps max_row_index current. The 020 fast path
-- for a statement over one dataset, the 018 set-based path otherwise (FOR NO KEY UPDATE row locks, taken before
-- the version is drawn); both write the 019 row-range records (TRUNCATE records nothing: the chain breaks and
-- the next sync goes full).
-- 033: a transaction of the reverse mirror (lakehouse.reverse_apply = 'on') is not tracked: no echo.
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
