"""Tables of the sources area (migration "010_sources"): the Postgres copy of each dataset's ingest state.

``lakehouse_source_state`` holds, per dataset, what its source writers have ingested so far (cursor,
CDC position, files seen) with a sequence number ``seq``. A pg-path ingest writes it in the same
transaction as the rows; a native ingest writes the same state into the Iceberg commit and copies it
here afterwards (see tracking/ingest_state.py for which copy wins).
"""

SQL = """
create table if not exists lakehouse_source_state (
  dataset_id uuid primary key,
  seq bigint not null,
  state jsonb not null,
  sync_id uuid not null,
  path text not null check (path in ('pg', 'native')),
  writer text not null,
  written_at timestamptz not null default now()
);
"""
