"""The dataset lifecycle, the face the adapters import: its states and counts (lifecycle/) and each dataset's
state derived from the facts (flags/lifecycle_facts.py).

Each name loads its home module on first use (PEP 562), so a CLI verb's --help imports none of it."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lakehouse_dagster.flags.lifecycle_facts import lifecycle_of
    from lakehouse_dagster.lifecycle import AUTHORITY, ICEBERG, STATES, state_counts

_HOME = {
    "AUTHORITY": "lakehouse_dagster.lifecycle",
    "ICEBERG": "lakehouse_dagster.lifecycle",
    "STATES": "lakehouse_dagster.lifecycle",
    "state_counts": "lakehouse_dagster.lifecycle",
    "lifecycle_of": "lakehouse_dagster.flags.lifecycle_facts",
}

__all__ = [
    "AUTHORITY",
    "ICEBERG",
    "STATES",
    "lifecycle_of",
    "state_counts",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)
