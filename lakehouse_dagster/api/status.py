"""The migration as it is, the face the adapters import: the overview and its text (status/overview.py,
overview_text.py), each partition's state (partition_state.py), the order of a partition's pages
(page_order.py), lag (lag.py) and what the recorder records (recording.py). The alerts have their own face
(api/alerts.py).

Each name loads its home module on first use (PEP 562), so a CLI verb's --help imports none of it."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lakehouse_dagster.status.lag import behind_datasets, flipped_freshness
    from lakehouse_dagster.status.overview import ATTENTION_SHOWN, POSTGRES, Overview, compute_overview
    from lakehouse_dagster.status.overview_text import text_lines
    from lakehouse_dagster.status.page_order import newer_than, superseded_by, sync_order
    from lakehouse_dagster.status.partition_state import (
        PartitionState,
        partition_state,
        partition_states,
        pg_row_count,
        safe_uri,
    )
    from lakehouse_dagster.status.recording import Change, Cursor, Plan, deleted_dataset_keys, plan_recording

_HOME = {
    "ATTENTION_SHOWN": "lakehouse_dagster.status.overview",
    "POSTGRES": "lakehouse_dagster.status.overview",
    "Overview": "lakehouse_dagster.status.overview",
    "compute_overview": "lakehouse_dagster.status.overview",
    "text_lines": "lakehouse_dagster.status.overview_text",
    "PartitionState": "lakehouse_dagster.status.partition_state",
    "partition_state": "lakehouse_dagster.status.partition_state",
    "partition_states": "lakehouse_dagster.status.partition_state",
    "pg_row_count": "lakehouse_dagster.status.partition_state",
    "safe_uri": "lakehouse_dagster.status.partition_state",
    "newer_than": "lakehouse_dagster.status.page_order",
    "superseded_by": "lakehouse_dagster.status.page_order",
    "sync_order": "lakehouse_dagster.status.page_order",
    "behind_datasets": "lakehouse_dagster.status.lag",
    "flipped_freshness": "lakehouse_dagster.status.lag",
    "Change": "lakehouse_dagster.status.recording",
    "Cursor": "lakehouse_dagster.status.recording",
    "Plan": "lakehouse_dagster.status.recording",
    "deleted_dataset_keys": "lakehouse_dagster.status.recording",
    "plan_recording": "lakehouse_dagster.status.recording",
}

__all__ = [
    "ATTENTION_SHOWN",
    "Change",
    "Cursor",
    "Overview",
    "POSTGRES",
    "PartitionState",
    "Plan",
    "behind_datasets",
    "compute_overview",
    "deleted_dataset_keys",
    "flipped_freshness",
    "newer_than",
    "partition_state",
    "partition_states",
    "pg_row_count",
    "plan_recording",
    "safe_uri",
    "superseded_by",
    "sync_order",
    "text_lines",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)
