

create table if not exists workspaces (
  id uuid primary key default gen_random_uuid(),
  name text not null,
  created_at timestamptz not null default now()
);

create table if not exists datasets (
  id uuid primary key default gen_random_uuid(),
  workspace_id uuid references workspaces(id),
  name text not null,
  kind text not null default 'tabular' check (kind in ('tabular', 'manifest')),
  schema jsonb not null default '[]'::jsonb,
  row_count bigint,
  status text not null default 'ready',
  source jsonb,
  error text,
  created_at timestamptz not null default now(),
  updated_at timestamptz not null default now()
);

create table if not exists dataset_rows (
  dataset_id uuid not null references datasets(id) on delete cascade,
  row_index bigint not null,
  row_id uuid not null default gen_random_uuid(),
  created_at timestamptz not null default now(),
  data jsonb not null,
  primary key (dataset_id, row_index)
);

create table if not exists pipelines (
  id uuid primary key default gen_random_uuid(),
  workspace_id uuid references workspaces(id),
  name text not null,
  spec jsonb not null default '{}'::jsonb
);
