-- lakehouse_stamp_changed_xid: the current definition (defined by migration 028_recorder).
-- Re-applied by every migrate after the numbered migrations (create or replace: triggers and their
-- enabled state are untouched). Change a body here, never in a shipped migration.
--
-- Stamps a sync log row with the transaction writing it (status/recording.py reads changes by transaction id).
create or replace function lakehouse_stamp_changed_xid() returns trigger language plpgsql as $$
begin
  new.changed_xid := pg_current_xact_id();
  return new;
end $$;
