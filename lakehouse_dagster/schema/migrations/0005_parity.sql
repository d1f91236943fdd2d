
create table if not exists lakehouse_read_parity (
  id bigserial primary key,
  dataset_id uuid not null,
  checked_at timestamptz not null default now(),
  verdict text not null
    check (verdict in ('ok', 'lagging', 'no-snapshot', 'MISMATCH', 'native', 'error')),
  source text not null default 'canary',      -- canary (CLI) | check (Dagster asset check) | schedule
  pg_count bigint,
  iceberg_count bigint,
  pg_digest numeric,                          -- exact sum of the rows' 64-bit hashes (parity/canonical.py)
  iceberg_digest numeric,
  snapshot_id bigint,                         -- the pinned Iceberg snapshot
  pg_version bigint,                          -- datasets.rows_version read in the pinned Postgres snapshot
  iceberg_version bigint,                     -- the Postgres version the snapshot says it covers
  smoke text,                                 -- value-level check: match | differs | skipped | null (not asked)
  mismatched_row_indexes bigint[],            -- first differing __row_index values (localisation), ascending
  seconds double precision,
  run_id text,                                -- Dagster run id when a check or the schedule wrote it
  detail jsonb not null default '{}'::jsonb
);
create index if not exists lakehouse_read_parity_dataset_idx on lakehouse_read_parity (dataset_id, checked_at desc, id desc);
create index if not exists lakehouse_read_parity_mismatch_idx on lakehouse_read_parity (checked_at desc)
  where verdict = 'MISMATCH';
