-- lakehouse_digest_schema_changed: the current definition (defined by migration 015_parity_digests).
-- Re-applied by every migrate after the numbered migrations (create or replace: triggers and their
-- enabled state are untouched). Change a body here, never in a shipped migration.
create or replace function lakehouse_digest_schema_changed() returns trigger language plpgsql as $$
begin
  delete from lakehouse_pg_digest_state where dataset_id = new.id;
  return null;
end $$;
