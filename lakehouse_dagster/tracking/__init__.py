"""What Postgres knows about each dataset: the app tables, change tracking (rows_version, row ranges), capture modes, the sync log, ingest state."""
