-- lakehouse_flag_overrides_notify: the current definition (defined by migration 016_flag_notify).
-- Re-applied by every migrate after the numbered migrations (create or replace: triggers and their
-- enabled state are untouched). Change a body here, never in a shipped migration.
--
-- Every committed change of the flag overrides NOTIFYs channel lakehouse_flags (names.FLAG_NOTIFY_CHANNEL;
-- flags/listen.py drops each process's cache at once). One notification per statement, at commit.
create or replace function lakehouse_flag_overrides_notify() returns trigger language plpgsql as $$
begin
  perform pg_notify('lakehouse_flags', tg_op);
  return null;
end $$;
