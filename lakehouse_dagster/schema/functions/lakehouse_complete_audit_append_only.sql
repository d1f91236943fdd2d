-- lakehouse_complete_audit_append_only: the current definition (defined by migration 034_complete).
-- Re-applied by every migrate after the numbered migrations (create or replace: triggers and their
-- enabled state are untouched). Change a body here, never in a shipped migration.
create or replace function lakehouse_complete_audit_append_only() returns trigger language plpgsql as $$
begin
  raise exception 'lakehouse_complete_audit is append-only (% refused)', tg_op;
end $$;
