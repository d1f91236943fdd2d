"""The one resource every op, asset, check and sensor uses to reach Postgres and the catalog.

Its fields are the settings that say where the data is and how much work runs at once, so the Resources page of
the UI shows them: each one set in the environment where the code location loads is an ``EnvVar`` (the page names
the variable; the value is read when a run or tick starts), the others stay empty and take their default from
``core/settings/`` (every other variable is read there too, as before). The DSN is always an ``EnvVar``: it
never shows. (No ``from __future__ import annotations`` here: Dagster reads the field annotations at runtime.)
"""

import os
from typing import Any, Optional

import dagster as dg
import psycopg
from pydantic import Field, PrivateAttr

from lakehouse_dagster.api.lake import load_catalog
from lakehouse_dagster.core.db import connect
from lakehouse_dagster.core.settings import Settings

# field -> its environment variable (docs/configuration.md says what each means and its default)
SHOWN_SETTINGS = {
    "catalog_type": "LAKEHOUSE_CATALOG_TYPE",
    "catalog_uri": "LAKEHOUSE_CATALOG_URI",
    "warehouse": "LAKEHOUSE_WAREHOUSE",
    "namespace": "LAKEHOUSE_NAMESPACE",
    "actor": "LAKEHOUSE_ACTOR",
    "ingest_chunk_rows": "LAKEHOUSE_INGEST_CHUNK_ROWS",
    "max_concurrent_ingest": "LAKEHOUSE_MAX_CONCURRENT_INGEST",
    "sensor_max_requests": "LAKEHOUSE_SENSOR_MAX_REQUESTS",
    "mirror_batch_size": "LAKEHOUSE_MIRROR_BATCH_SIZE",
    "recorder_max_events": "LAKEHOUSE_RECORDER_MAX_EVENTS",
}
_INTS = {
    "ingest_chunk_rows",
    "max_concurrent_ingest",
    "sensor_max_requests",
    "mirror_batch_size",
    "recorder_max_events",
}


def _default(name: str) -> str:
    return f"{SHOWN_SETTINGS[name]}; empty: its default (docs/configuration.md)"


class LakehouseResource(dg.ConfigurableResource):
    """Postgres and the Iceberg catalog, configured from the environment (core/settings/)."""

    pg_dsn: str = Field(description="LAKEHOUSE_PG_DSN: the project's Postgres (an EnvVar: never shown)")
    catalog_type: Optional[str] = Field(default=None, description="sql or rest: " + _default("catalog_type"))
    catalog_uri: Optional[str] = Field(default=None, description="the REST catalog's URL: " + _default("catalog_uri"))
    warehouse: Optional[str] = Field(default=None, description="where table files go: " + _default("warehouse"))
    namespace: Optional[str] = Field(default=None, description="the Iceberg namespace: " + _default("namespace"))
    actor: Optional[str] = Field(default=None, description="who flag changes are audited as: " + _default("actor"))
    ingest_chunk_rows: Optional[int] = Field(
        default=None, description="rows per file: " + _default("ingest_chunk_rows")
    )
    max_concurrent_ingest: Optional[int] = Field(
        default=None, description="G2, syncs at once: " + _default("max_concurrent_ingest")
    )
    sensor_max_requests: Optional[int] = Field(
        default=None, description="runs per poller tick: " + _default("sensor_max_requests")
    )
    mirror_batch_size: Optional[int] = Field(
        default=None, description="datasets per mirror run: " + _default("mirror_batch_size")
    )
    recorder_max_events: Optional[int] = Field(
        default=None, description="changes of each kind per recorder tick: " + _default("recorder_max_events")
    )

    _catalog: Any = PrivateAttr(default=None)

    def settings(self) -> Settings:
        given = {var: getattr(self, name) for name, var in SHOWN_SETTINGS.items() if getattr(self, name) is not None}
        return Settings.from_env().with_vars({"LAKEHOUSE_PG_DSN": self.pg_dsn, **given})

    def connect(self) -> psycopg.Connection:
        return connect(self.pg_dsn)

    def catalog(self):
        """Built once per run (Dagster initializes the resource per run, and per sensor tick), not per call."""
        if self._catalog is None:
            self._catalog = load_catalog(self.settings(), self.pg_dsn)
        return self._catalog


def shown_settings(environ=None) -> dict[str, Any]:
    """The fields set in the environment, as EnvVars (read when a run or tick starts; the page names them)."""
    environ = os.environ if environ is None else environ
    return {
        name: (dg.EnvVar.int(var) if name in _INTS else dg.EnvVar(var))
        for name, var in SHOWN_SETTINGS.items()
        if environ.get(var)
    }


@dg.definitions
def resources() -> dg.Definitions:
    return dg.Definitions(
        resources={"lakehouse": LakehouseResource(pg_dsn=dg.EnvVar("LAKEHOUSE_PG_DSN"), **shown_settings())}
    )
