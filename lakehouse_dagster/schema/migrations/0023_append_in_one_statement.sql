
create or replace function lakehouse_rows_inserted() returns trigger language plpgsql as $$
declare v bigint; one uuid; lo bigint; hi bigint; k bigint; mx bigint; prev bigint;
begin
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

