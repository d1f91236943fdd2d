"""`lakehouse complete` and its way back, the face the adapters import (runbooks/complete/).

Each name loads its home module on first use (PEP 562), so a CLI verb's --help imports none of it."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lakehouse_dagster.runbooks.complete import backfill_or_restore, complete_scope, complete_status

_HOME = {
    "backfill_or_restore": "lakehouse_dagster.runbooks.complete",
    "complete_scope": "lakehouse_dagster.runbooks.complete",
    "complete_status": "lakehouse_dagster.runbooks.complete",
}

__all__ = [
    "backfill_or_restore",
    "complete_scope",
    "complete_status",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)
