"""Migrations of the ingest area.

``ROW_CHANGES`` — migration "019_row_changes": which ``row_index`` ranges a rewriting statement touched,
so that a sync after a small ``row.edit`` rewrites only the Iceberg data files holding them
(ingest/row_changes.py, the "partial" sync mode).

A statement on ``dataset_rows`` that is not a pure append above ``max_row_index`` (an UPDATE, a DELETE,
an INSERT at or below the max) already moves ``datasets.rows_rewrite_version`` to its version ``v``.
It now also writes, in the same statement trigger and from the transition tables it already scans, one
row per (dataset, 4096-wide bucket of row_index) into ``lakehouse_row_changes``: the [min, max] it
touched in that bucket (an UPDATE counts old and new row_index), and ``prev_version``: the dataset's
``rows_rewrite_version`` before this statement. The records of a dataset therefore form a chain
``rows_rewrite_version → prev_version → …``; a sync follows it from the head down to the version it
mirrored, and any missing link (a TRUNCATE, a schema change, writes from before this migration or from a
session still running the old trigger body) means "unknown" and the sync goes full, as before.
Pruned by the sync once mirrored (records at or below the mirrored version are never read again).

The two functions below are full ``create or replace`` copies of the latest ones (migration
"018_no_key_row_locks", store/migrations.py NO_KEY_ROW_LOCKS); the ONLY additions are the blocks marked
``-- 019: row ranges``, each placed after the row locks and the version draw and before the UPDATE of
``datasets`` (so ``d.rows_rewrite_version`` is still the previous value). A later migration that replaces
these functions (020) must carry those blocks over.
"""

ROW_CHANGES = """
create table if not exists lakehouse_row_changes (
  dataset_id uuid not null,
  version bigint not null,          -- the statement's rows_version (= its rows_rewrite_version)
  bucket bigint not null,           -- row_index >> 12
  prev_version bigint not null,     -- the dataset's rows_rewrite_version before the statement
  min_idx bigint not null,
  max_idx bigint not null,
  primary key (dataset_id, version, bucket)
);

create or replace function lakehouse_rows_inserted() returns trigger language plpgsql as $$
declare v bigint;
begin
  perform 1 from datasets where id in (select dataset_id from lakehouse_new_rows) order by id for no key update;
  v := nextval('lakehouse_rows_version_seq');
  -- 019: row ranges. Only rows at or below the known max (a pure append records nothing; an unknown max
  -- records nothing either, so the chain breaks and the next sync goes full).
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
declare v bigint;
begin
  if tg_op = 'UPDATE' then
    perform 1 from datasets where id in (select dataset_id from lakehouse_new_rows
                                         union select dataset_id from lakehouse_old_rows) order by id for no key update;
  elsif tg_op = 'DELETE' then
    perform 1 from datasets where id in (select dataset_id from lakehouse_old_rows) order by id for no key update;
  else
    perform 1 from datasets order by id for no key update;
  end if;
  v := nextval('lakehouse_rows_version_seq');
  -- 019: row ranges (UPDATE: old and new row_index; DELETE: old). TRUNCATE records nothing: the chain
  -- breaks and the next sync goes full.
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
