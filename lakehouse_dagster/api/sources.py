"""A dataset's source and its writers, the face the adapters import: the source set and shown (sources/stored.py),
the writers' names (spec.py: no pyarrow for a usage error) and the check of one (writers.py), the source
poller's query and its cost (poll.py).

Each name loads its home module on first use (PEP 562), so a CLI verb's --help imports none of it."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lakehouse_dagster.sources.poll import pending_ingests, polling_cost
    from lakehouse_dagster.sources.spec import WRITERS
    from lakehouse_dagster.sources.stored import get_source, set_source
    from lakehouse_dagster.sources.writers import check_writer

_HOME = {
    "get_source": "lakehouse_dagster.sources.stored",
    "set_source": "lakehouse_dagster.sources.stored",
    "WRITERS": "lakehouse_dagster.sources.spec",
    "check_writer": "lakehouse_dagster.sources.writers",
    "pending_ingests": "lakehouse_dagster.sources.poll",
    "polling_cost": "lakehouse_dagster.sources.poll",
}

__all__ = [
    "WRITERS",
    "check_writer",
    "get_source",
    "pending_ingests",
    "polling_cost",
    "set_source",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)
