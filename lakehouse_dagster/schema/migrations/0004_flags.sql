
create table if not exists lakehouse_flag_overrides (
  kind text not null check (kind in ('read', 'write')),
  name text not null,
  scope text not null check (scope in ('global', 'workspace', 'dataset')),
  scope_id uuid,
  mode text not null,
  note text,
  set_by text not null,
  set_at timestamptz not null default now(),
  constraint lakehouse_flag_overrides_scope_id check ((scope = 'global') = (scope_id is null)),
  -- A hand-written row may exceed a ceiling (the resolver clamps it) but never names a mode that does not exist.
  constraint lakehouse_flag_overrides_mode check (
    (kind = 'read' and mode in ('off', 'shadow', 'iceberg', 'iceberg_only'))
    or (kind = 'write' and mode in ('pg', 'iceberg_native')))
);
-- One override per (kind, name, scope, scope id); a global override has no scope id.
create unique index if not exists lakehouse_flag_overrides_key
  on lakehouse_flag_overrides (kind, name, scope, coalesce(scope_id, '00000000-0000-0000-0000-000000000000'::uuid));
create index if not exists lakehouse_flag_overrides_scope_idx
  on lakehouse_flag_overrides (scope_id) where scope_id is not null;

create table if not exists lakehouse_flag_audit (
  id bigserial primary key,
  at timestamptz not null default now(),
  action text not null check (action in ('set', 'clear')),
  kind text not null,
  name text not null,
  scope text not null,
  scope_id uuid,
  before_mode text,
  after_mode text,
  note text,
  actor text not null
);
create index if not exists lakehouse_flag_audit_name_idx on lakehouse_flag_audit (kind, name, id desc);

create or replace function lakehouse_flag_audit_append_only() returns trigger language plpgsql as $$
begin
  raise exception 'lakehouse_flag_audit is append-only (% refused)', tg_op;
end $$;

drop trigger if exists lakehouse_flag_audit_no_change on lakehouse_flag_audit;
create trigger lakehouse_flag_audit_no_change before update or delete on lakehouse_flag_audit
  for each statement execute function lakehouse_flag_audit_append_only();

drop trigger if exists lakehouse_flag_audit_no_truncate on lakehouse_flag_audit;
create trigger lakehouse_flag_audit_no_truncate before truncate on lakehouse_flag_audit
  for each statement execute function lakehouse_flag_audit_append_only();
