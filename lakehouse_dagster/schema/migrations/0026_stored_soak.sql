-- Settings every process reads from the database, so the CLI, the Dagster webserver, daemon and run workers
-- use one value (flags/soak_setting.py): first the soak of the widening rules, `lakehouse flags soak set`.
-- A name with no row falls back to the process' environment (LAKEHOUSE_SOAK_SECONDS). Every change is audited.
create table if not exists lakehouse_settings (
  name text primary key,
  value jsonb not null,
  note text,
  set_by text not null,
  set_at timestamptz not null default now()
);

create table if not exists lakehouse_settings_audit (
  id bigserial primary key,
  at timestamptz not null default now(),
  name text not null,
  before_value jsonb,
  after_value jsonb not null,
  note text,
  actor text not null
);
create index if not exists lakehouse_settings_audit_name_idx on lakehouse_settings_audit (name, id desc);

create or replace function lakehouse_settings_audit_append_only() returns trigger language plpgsql as $$
begin
  raise exception 'lakehouse_settings_audit is append-only (% refused)', tg_op;
end $$;

drop trigger if exists lakehouse_settings_audit_no_change on lakehouse_settings_audit;
create trigger lakehouse_settings_audit_no_change before update or delete on lakehouse_settings_audit
  for each statement execute function lakehouse_settings_audit_append_only();

drop trigger if exists lakehouse_settings_audit_no_truncate on lakehouse_settings_audit;
create trigger lakehouse_settings_audit_no_truncate before truncate on lakehouse_settings_audit
  for each statement execute function lakehouse_settings_audit_append_only();
