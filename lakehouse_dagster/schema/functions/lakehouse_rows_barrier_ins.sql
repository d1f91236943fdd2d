-- lakehouse_rows_barrier_ins: the current definition (defined by migration 024_tracking_capture).
-- Re-applied by every migrate after the numbered migrations (create or replace: triggers and their
-- enabled state are untouched). Change a body here, never in a shipped migration.
--
-- Capture mode after-commit (tracking/capture.py, tracking/barrier.py): the app's statement only takes a shared
-- transaction-level advisory lock per dataset it wrote. The triggers ship DISABLED (migration 024) and are
-- enabled (ALWAYS) by the capture-mode switch; re-applying this function leaves them as they are.
create or replace function lakehouse_rows_barrier_ins() returns trigger language plpgsql as $$
begin
  perform pg_advisory_xact_lock_shared(uuid_hash_extended(d, 0))
     from (select distinct dataset_id as d from lakehouse_new_rows order by 1) s;
  return null;
end $$;
