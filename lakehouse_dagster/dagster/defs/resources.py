"""The one resource every op, asset, check and sensor uses to reach Postgres and the catalog."""

import dagster as dg
import psycopg

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.lake.catalog import load_catalog


class LakehouseResource(dg.ConfigurableResource):
    """Configuration comes from the environment (core/settings.py); the DSN is an EnvVar so it never shows in the UI."""

    pg_dsn: str

    def settings(self) -> Settings:
        return Settings.from_env().replace(pg_dsn=self.pg_dsn)

    def connect(self) -> psycopg.Connection:
        return connect(self.pg_dsn)

    def catalog(self):
        return load_catalog(self.settings(), self.pg_dsn)


@dg.definitions
def resources() -> dg.Definitions:
    return dg.Definitions(resources={"lakehouse": LakehouseResource(pg_dsn=dg.EnvVar("LAKEHOUSE_PG_DSN"))})
