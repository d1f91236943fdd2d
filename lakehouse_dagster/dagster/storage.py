"""Dagster's Postgres storage, with a plain ``postgresql://`` URL sent to the driver dagster-postgres works with.

dagster.yaml's ``storage: custom:`` names this class instead of ``storage: postgres:``; its config is the same
(``postgres_url`` or ``postgres_db``, through ``env:`` as Dagster's docs show). Why: SQLAlchemy 2.1 maps a bare
``postgresql://`` to psycopg 3 whatever else is installed (``sqlalchemy/dialects/postgresql/__init__.py``:
``base.dialect = psycopg.dialect``), psycopg 3 binds parameters on the server, and every event dagster-postgres 0.29
stores runs ``NOTIFY run_events, :notify_id`` — Postgres refuses a parameter there ("syntax error at or near $1"),
so no run could log an event. psycopg2 (a dependency of dagster-postgres) interpolates on the client. Normalising
here, where the URL is read, fixes it for every process that loads the instance (webserver, daemon, code server,
run workers, ``dagster instance migrate``), not only for the URL ``lakehouse up`` builds.

What is stored and where does not change: the run, event log and schedule storages are dagster-postgres' own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from dagster_postgres import DagsterPostgresStorage
from dagster_postgres.utils import get_token_provider_from_config, pg_url_from_config

# Schemes SQLAlchemy would open with psycopg 3 (server-side binding): bare, the old alias, psycopg 3 named.
_PSYCOPG3_SCHEME = re.compile(r"^postgres(?:ql)?(?:\+psycopg)?://", re.IGNORECASE)


def psycopg2_url(url: str) -> str:
    """``url`` with its scheme ``postgresql+psycopg2://`` when SQLAlchemy would otherwise pick psycopg 3; any other
    URL (another driver named on purpose: pg8000, asyncpg...) unchanged."""
    return _PSYCOPG3_SCHEME.sub("postgresql+psycopg2://", url, count=1)


class PostgresStorage(DagsterPostgresStorage):
    """``DagsterPostgresStorage`` whose URL always reaches SQLAlchemy with the psycopg2 driver (module docstring)."""

    @classmethod
    def from_config_value(cls, inst_data, config_value: Mapping[str, Any]) -> PostgresStorage:
        return cls(
            inst_data=inst_data,
            postgres_url=psycopg2_url(pg_url_from_config(config_value)),
            should_autocreate_tables=config_value.get("should_autocreate_tables", True),
            token_provider=get_token_provider_from_config(config_value),
        )
