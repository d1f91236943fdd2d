
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
