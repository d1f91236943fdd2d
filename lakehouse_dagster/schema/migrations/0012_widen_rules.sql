
-- Which datasets each Postgres-locked reader (ceiling off: objects.sync, dashboards.aggregate,
-- pipeline.expectations, ...) reads from dataset_rows, declared by operators (lakehouse flags readers add).
-- A workspace row means every dataset of that workspace, now and later.
create table if not exists lakehouse_reader_datasets (
  reader text not null,
  scope text not null check (scope in ('workspace', 'dataset')),
  scope_id uuid not null,
  note text,
  declared_by text not null,
  declared_at timestamptz not null default now(),
  primary key (reader, scope, scope_id)
);
create index if not exists lakehouse_reader_datasets_scope_idx on lakehouse_reader_datasets (scope_id);

-- One row per read the router served from Postgres after an Iceberg error (mode iceberg): a soak
-- that sees one restarts (flags/incidents.py).
create table if not exists lakehouse_read_fallbacks (
  id bigserial primary key,
  reader text not null,
  dataset_id uuid not null,
  at timestamptz not null default now(),
  error text not null
);
create index if not exists lakehouse_read_fallbacks_dataset_idx on lakehouse_read_fallbacks (dataset_id, at desc);
