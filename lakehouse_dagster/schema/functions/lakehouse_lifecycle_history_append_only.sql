-- lakehouse_lifecycle_history_append_only: the current definition (defined by migration 036_lifecycle).
-- Re-applied by every migrate after the numbered migrations (create or replace: triggers and their
-- enabled state are untouched). Change a body here, never in a shipped migration.
create or replace function lakehouse_lifecycle_history_append_only() returns trigger language plpgsql as $$
begin
  raise exception 'lakehouse_lifecycle_history is append-only (% refused)', tg_op;
end $$;
