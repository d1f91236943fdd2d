-- lakehouse_bad_value: the current definition (defined by migration 003_iceberg_sync_log).
-- Re-applied by every migrate after the numbered migrations (create or replace: triggers and their
-- enabled state are untouched). Change a body here, never in a shipped migration.
--
-- Raises, naming the row and column of a value that does not fit the dataset's schema (mirror/pinned_read.py);
-- declared to return text so it can sit in the ELSE branch of any typed CASE. typ 'undeclared': the row holds
-- keys the schema does not declare (col: their names, never their values), which Iceberg cannot hold.
create or replace function lakehouse_bad_value(ds uuid, ri bigint, col text, typ text, got text)
returns text language plpgsql as $$
begin
  if typ = 'undeclared' then
    raise exception using errcode = '22023',
      message = format('dataset %s row_index %s holds key(s) %s that its schema does not declare', ds, ri, col);
  end if;
  raise exception using errcode = '22023',
    message = format('dataset %s row_index %s column %s: expected %s, got a JSON %s', ds, ri, col, typ, got);
end $$;
