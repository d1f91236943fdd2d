-- lakehouse_digest_rows: the current definition (first defined by migration 015_parity_digests, last by 020_app_write_cost).
-- Re-applied by every migrate after the numbered migrations (create or replace: triggers and their
-- enabled state are untouched). Change a body here, never in a shipped migration.
--
-- The maintained Postgres digest (triggers lakehouse_rows_{ins,upd,del,trunc}_digest, ENABLE ALWAYS; disabled
-- in capture mode after-commit by tracking/capture.py, which this file never touches). Fires after the
-- change-tracking triggers of the same event (name order), which hold the datasets row lock until commit.
-- 020: the row hash lives in one plpgsql function per hash expression (lakehouse_digest_fn); the statement's
-- rows of a registered dataset go to it as one array of signed rows. More than DIGEST_ARRAY_ROWS rows
-- (schema/names.py: the 1000 and 1001 below) take the 015 set-based path. A value the hash cannot type (or a
-- missing function) drops the registration in the writing transaction, never fails the app's write.
-- Reverse mirror (mirror/reverse.py): a full re-sync deletes every row of one dataset in a REPEATABLE READ
-- transaction that names it in lakehouse.reverse_resync (set_config(..., true)) and deletes that dataset's
-- deltas its snapshot sees itself (the sums of exactly the rows it deletes, the digest being filled): its DELETE
-- is not hashed here, row by row, only to cancel those sums out.
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
              where s.dataset_id in (select dataset_id from lakehouse_old_rows)
                and s.dataset_id::text is distinct from current_setting('lakehouse.reverse_resync', true) loop
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
