
create or replace function lakehouse_flag_overrides_notify() returns trigger language plpgsql as $$
begin
  perform pg_notify('lakehouse_flags', tg_op);
  return null;
end $$;

drop trigger if exists lakehouse_flag_overrides_notify on lakehouse_flag_overrides;
create trigger lakehouse_flag_overrides_notify after insert or update or delete or truncate
  on lakehouse_flag_overrides for each statement execute function lakehouse_flag_overrides_notify();
