-- lakehouse_rows_barrier_del: the current definition (defined by migration 024_tracking_capture).
-- Re-applied by every migrate after the numbered migrations (create or replace: triggers and their
-- enabled state are untouched). Change a body here, never in a shipped migration.
--
-- See lakehouse_rows_barrier_ins.sql.
create or replace function lakehouse_rows_barrier_del() returns trigger language plpgsql as $$
begin
  perform pg_advisory_xact_lock_shared(uuid_hash_extended(d, 0))
     from (select distinct dataset_id as d from lakehouse_old_rows order by 1) s;
  return null;
end $$;
