-- lakehouse_latest_succeeded_sync: the current definition (defined by migration 008_latest_sync_and_sweep).
-- Re-applied by every migrate after the numbered migrations (create or replace: triggers and their
-- enabled state are untouched). Change a body here, never in a shipped migration.
--
-- The one definition of the latest succeeded sync (tracking/sync_log.py LATEST_SUCCEEDED_FN).
create or replace function lakehouse_latest_succeeded_sync(ds uuid) returns setof iceberg_sync_log
language sql stable as $$
  select * from iceberg_sync_log l
   where l.dataset_id = ds and l.status = 'succeeded'
   order by l.finished_at desc nulls last, l.id desc
   limit 1
$$;
