
create table if not exists lakehouse_source_state (
  dataset_id uuid primary key,
  seq bigint not null,
  state jsonb not null,
  sync_id uuid not null,
  path text not null check (path in ('pg', 'native')),
  writer text not null,
  written_at timestamptz not null default now()
);
