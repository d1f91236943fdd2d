"""The app's datasets as the migration tracks them, the face the adapters import: a dataset and its columns
(tracking/datasets/), names and workspaces by id (lookup.py, scopes.py), whether the rows table exists (rows.py),
a source's ingest state (tracking/ingest_state.py) and each dataset's last sync (tracking/sync_log.py). Capture
modes have their own face (api/capture.py).

Each name loads its home module on first use (PEP 562), so a CLI verb's --help imports none of it."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lakehouse_dagster.tracking.datasets import Column, Dataset, get_dataset
    from lakehouse_dagster.tracking.datasets.lookup import name_of, names_of
    from lakehouse_dagster.tracking.datasets.rows import rows_table_missing
    from lakehouse_dagster.tracking.datasets.scopes import ids_in_workspace
    from lakehouse_dagster.tracking.ingest_state import current_state, public_cursor
    from lakehouse_dagster.tracking.sync_log import datasets_with_last_sync

_HOME = {
    "Column": "lakehouse_dagster.tracking.datasets",
    "Dataset": "lakehouse_dagster.tracking.datasets",
    "get_dataset": "lakehouse_dagster.tracking.datasets",
    "name_of": "lakehouse_dagster.tracking.datasets.lookup",
    "names_of": "lakehouse_dagster.tracking.datasets.lookup",
    "ids_in_workspace": "lakehouse_dagster.tracking.datasets.scopes",
    "rows_table_missing": "lakehouse_dagster.tracking.datasets.rows",
    "current_state": "lakehouse_dagster.tracking.ingest_state",
    "public_cursor": "lakehouse_dagster.tracking.ingest_state",
    "datasets_with_last_sync": "lakehouse_dagster.tracking.sync_log",
}

__all__ = [
    "Column",
    "Dataset",
    "current_state",
    "datasets_with_last_sync",
    "get_dataset",
    "ids_in_workspace",
    "name_of",
    "names_of",
    "public_cursor",
    "rows_table_missing",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)
