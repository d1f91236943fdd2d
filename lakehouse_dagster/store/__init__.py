"""Postgres: connections, the embedded default server, migrations and table access."""
