"""The ingest bench (runbook step 2), the face the adapters import (runbooks/ingest_bench.py): a run, the purge of
what it wrote, and its outcomes. Callers import the module and write ``ingest_bench.X``.

Each name loads its home module on first use (PEP 562), so a CLI verb's --help imports none of it."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lakehouse_dagster.runbooks.ingest_bench import BACKPRESSURE, ERROR, OK, purge, run_ingest_bench

_HOME = {
    "BACKPRESSURE": "lakehouse_dagster.runbooks.ingest_bench",
    "ERROR": "lakehouse_dagster.runbooks.ingest_bench",
    "OK": "lakehouse_dagster.runbooks.ingest_bench",
    "purge": "lakehouse_dagster.runbooks.ingest_bench",
    "run_ingest_bench": "lakehouse_dagster.runbooks.ingest_bench",
}

__all__ = [
    "BACKPRESSURE",
    "ERROR",
    "OK",
    "purge",
    "run_ingest_bench",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)
