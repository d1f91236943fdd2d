-- lakehouse_sync_log_mirrored: the current definition (defined by migration 008_latest_sync_and_sweep).
-- Re-applied by every migrate after the numbered migrations (create or replace: triggers and their
-- enabled state are untouched). Change a body here, never in a shipped migration.
--
-- Keeps datasets.mirrored_version true for every writer of iceberg_sync_log (its own triggers).
create or replace function lakehouse_sync_log_mirrored() returns trigger language plpgsql as $$
declare ds uuid := case when tg_op = 'DELETE' then old.dataset_id else new.dataset_id end;
begin
  update datasets d
     set mirrored_version = l.v
    from (select (select s.source_version from lakehouse_latest_succeeded_sync(ds) s) as v) l
   where d.id = ds and d.mirrored_version is distinct from l.v;
  return null;
end $$;
