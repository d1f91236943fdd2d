
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
