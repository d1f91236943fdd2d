-- lakehouse_rows_barrier_upd: the current definition (defined by migration 024_tracking_capture).
-- Re-applied by every migrate after the numbered migrations (create or replace: triggers and their
-- enabled state are untouched). Change a body here, never in a shipped migration.
--
-- See lakehouse_rows_barrier_ins.sql.
create or replace function lakehouse_rows_barrier_upd() returns trigger language plpgsql as $$
begin
  perform pg_advisory_xact_lock_shared(uuid_hash_extended(d, 0))
     from (select distinct dataset_id as d from (select dataset_id from lakehouse_new_rows
                                                 union all select dataset_id from lakehouse_old_rows) t
           order by 1) s;
  return null;
end $$;
