-- lakehouse_rows_inserted: the current definition (first defined by migration 002_change_tracking, last by 033_reverse_mirror).
-- Re-applied by every migrate after the numbered migrations (create or replace: triggers and their
-- enabled state are untouched). Change a body here, never in a shipped migration.
--
-- Change tracking of INSERTs into dataset_rows (trigger lakehouse_rows_ins, statement level, transition table
-- lakehouse_new_rows): every write statement bumps its datasets' rows_version from one global sequence and stamps
-- rows_xid with the writing transaction; rows_rewrite_version moves only when the statement is not a pure append
-- above max_row_index (max_row_index NULL = unknown: never taken for an append, the max is read from dataset_rows).
-- 023: the app's most common write, a one-dataset append above the known max, in ONE statement: the UPDATE draws
-- the version in its SET and holds the append test in its WHERE; it takes the same FOR NO KEY UPDATE row lock, and
-- a writer waiting for it re-evaluates the row after the other commits (EvalPlanQual, READ COMMITTED), so a
-- version never moves back. Not an append: no row matches and the 020 path runs.
-- 020 fast path (one dataset): lock the datasets row (FOR NO KEY UPDATE, 018: it does not conflict with the
-- foreign key's KEY SHARE, so concurrent inserts into one dataset do not deadlock), draw the version, write the
-- 019 row-range records (prev_version = rows_rewrite_version before this statement), update through the key.
-- Several datasets (k > 1): the 018 path, set-based, same order (lock, draw, record, update).
-- 033: a transaction of the reverse mirror (lakehouse.reverse_apply = 'on') is not tracked: no echo.
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
