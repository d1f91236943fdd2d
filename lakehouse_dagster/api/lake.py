"""The Iceberg lake, the face the adapters import: the catalog and a dataset's table (lake/catalog.py, reader.py), the
identity columns (schema.py), a data file's columns by field id (parquet_ids.py), the bundled SeaweedFS that
`lakehouse up` starts (seaweed.py) and the catalog cutover, every table moved to another catalog
(runbooks/catalog_migrate.py: ``migrate``).

Each name loads its home module on first use (PEP 562), so a CLI verb's --help imports none of it."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lakehouse_dagster.lake.catalog import load_catalog, load_table_or_none, table_identifier
    from lakehouse_dagster.lake.parquet_ids import columns_in_file
    from lakehouse_dagster.lake.reader import load_dataset_table
    from lakehouse_dagster.lake.schema import IDENTITY_COLUMNS, IDENTITY_DESCRIPTIONS
    from lakehouse_dagster.lake.seaweed import SeaweedServer, kept_credentials, require_weed
    from lakehouse_dagster.runbooks.catalog_migrate import migrate

_HOME = {
    "load_catalog": "lakehouse_dagster.lake.catalog",
    "load_table_or_none": "lakehouse_dagster.lake.catalog",
    "table_identifier": "lakehouse_dagster.lake.catalog",
    "load_dataset_table": "lakehouse_dagster.lake.reader",
    "IDENTITY_COLUMNS": "lakehouse_dagster.lake.schema",
    "IDENTITY_DESCRIPTIONS": "lakehouse_dagster.lake.schema",
    "columns_in_file": "lakehouse_dagster.lake.parquet_ids",
    "SeaweedServer": "lakehouse_dagster.lake.seaweed",
    "kept_credentials": "lakehouse_dagster.lake.seaweed",
    "require_weed": "lakehouse_dagster.lake.seaweed",
    "migrate": "lakehouse_dagster.runbooks.catalog_migrate",
}

__all__ = [
    "IDENTITY_COLUMNS",
    "IDENTITY_DESCRIPTIONS",
    "SeaweedServer",
    "columns_in_file",
    "kept_credentials",
    "load_catalog",
    "load_dataset_table",
    "load_table_or_none",
    "migrate",
    "require_weed",
    "table_identifier",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)
