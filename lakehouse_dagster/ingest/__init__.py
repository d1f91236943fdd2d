"""Ingest: reading Postgres rows as typed Arrow, the sync (mirror) and its guards."""
