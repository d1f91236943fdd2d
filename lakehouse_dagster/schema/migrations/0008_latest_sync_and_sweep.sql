
create index if not exists iceberg_sync_log_succeeded_idx
  on iceberg_sync_log (dataset_id, finished_at desc nulls last, id desc) where status = 'succeeded';

-- The one definition: the succeeded sync that finished last (ties: the later row).
create or replace function lakehouse_latest_succeeded_sync(ds uuid) returns setof iceberg_sync_log
language sql stable as $$
  select * from iceberg_sync_log l
   where l.dataset_id = ds and l.status = 'succeeded'
   order by l.finished_at desc nulls last, l.id desc
   limit 1
$$;

alter table datasets add column if not exists mirrored_version bigint;

create or replace function lakehouse_sync_log_mirrored() returns trigger language plpgsql as $$
declare ds uuid := case when tg_op = 'DELETE' then old.dataset_id else new.dataset_id end;
begin
  update datasets d
     set mirrored_version = l.v
    from (select (select s.source_version from lakehouse_latest_succeeded_sync(ds) s) as v) l
   where d.id = ds and d.mirrored_version is distinct from l.v;
  return null;
end $$;

drop trigger if exists lakehouse_sync_log_mirrored_ins on iceberg_sync_log;
create trigger lakehouse_sync_log_mirrored_ins after insert on iceberg_sync_log
  for each row when (new.status = 'succeeded') execute function lakehouse_sync_log_mirrored();
drop trigger if exists lakehouse_sync_log_mirrored_upd on iceberg_sync_log;
create trigger lakehouse_sync_log_mirrored_upd after update of status, source_version, finished_at on iceberg_sync_log
  for each row when (old.status = 'succeeded' or new.status = 'succeeded') execute function lakehouse_sync_log_mirrored();
drop trigger if exists lakehouse_sync_log_mirrored_del on iceberg_sync_log;
create trigger lakehouse_sync_log_mirrored_del after delete on iceberg_sync_log
  for each row when (old.status = 'succeeded') execute function lakehouse_sync_log_mirrored();

create index if not exists datasets_mirror_behind_idx on datasets (rows_version, id)
  where kind = 'tabular' and coalesce(mirrored_version, -1) < rows_version;

-- The poller's memory of what it asked for: one row per dataset, the version and how many times.
create table if not exists lakehouse_mirror_requests (
  dataset_id uuid primary key,
  rows_version bigint not null,
  attempts int not null,
  last_at timestamptz not null default now()
);
