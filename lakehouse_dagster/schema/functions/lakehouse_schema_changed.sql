-- lakehouse_schema_changed: the current definition (defined by migration 002_change_tracking).
-- Re-applied by every migrate after the numbered migrations (create or replace: triggers and their
-- enabled state are untouched). Change a body here, never in a shipped migration.
create or replace function lakehouse_schema_changed() returns trigger language plpgsql as $$
declare v bigint := nextval('lakehouse_rows_version_seq');  -- the row is already locked in a BEFORE trigger
begin
  new.rows_version := v; new.rows_rewrite_version := v; new.rows_xid := pg_current_xact_id();
  return new;
end $$;
