-- lakehouse_note_pg_full_sync: the current definition (defined by migration 011_rollback).
-- Re-applied by every migrate after the numbered migrations (create or replace: triggers and their
-- enabled state are untouched). Change a body here, never in a shipped migration.
create or replace function lakehouse_note_pg_full_sync() returns trigger language plpgsql as $$
begin
  if new.path = 'pg' and new.writer = 'sync.full' then
    insert into lakehouse_pg_reconciled (dataset_id, how, seq, actor)
    values (new.dataset_id, 'pg-full-sync', new.seq, 'sync.full on the pg path');
  end if;
  return null;
end $$;
