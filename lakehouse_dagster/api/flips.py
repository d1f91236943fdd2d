"""The reader and writer flips, the face the adapters import: the flip with its preflight and verifies
(runbooks/flip.py), the first native syncs and the checked native write (runbooks/first_sync.py), the rollback
report (runbooks/rollback_report.py) and the backfill (runbooks/backfill.py).

Each name loads its home module on first use (PEP 562), so a CLI verb's --help imports none of it."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lakehouse_dagster.runbooks.backfill import BackfillResult, backfill
    from lakehouse_dagster.runbooks.first_sync import checked_write, first_native_syncs, stop_message
    from lakehouse_dagster.runbooks.flip import (
        Preflight,
        fallback_message,
        flip,
        moved_ids,
        preflight,
        verify,
        verify_write,
    )
    from lakehouse_dagster.runbooks.rollback_report import (
        apply_reverse_first,
        leaving_native,
        rollback_lines,
        rolled_back,
    )

_HOME = {
    "Preflight": "lakehouse_dagster.runbooks.flip",
    "fallback_message": "lakehouse_dagster.runbooks.flip",
    "flip": "lakehouse_dagster.runbooks.flip",
    "moved_ids": "lakehouse_dagster.runbooks.flip",
    "preflight": "lakehouse_dagster.runbooks.flip",
    "verify": "lakehouse_dagster.runbooks.flip",
    "verify_write": "lakehouse_dagster.runbooks.flip",
    "checked_write": "lakehouse_dagster.runbooks.first_sync",
    "first_native_syncs": "lakehouse_dagster.runbooks.first_sync",
    "stop_message": "lakehouse_dagster.runbooks.first_sync",
    "apply_reverse_first": "lakehouse_dagster.runbooks.rollback_report",
    "leaving_native": "lakehouse_dagster.runbooks.rollback_report",
    "rollback_lines": "lakehouse_dagster.runbooks.rollback_report",
    "rolled_back": "lakehouse_dagster.runbooks.rollback_report",
    "BackfillResult": "lakehouse_dagster.runbooks.backfill",
    "backfill": "lakehouse_dagster.runbooks.backfill",
}

__all__ = [
    "BackfillResult",
    "Preflight",
    "apply_reverse_first",
    "backfill",
    "checked_write",
    "fallback_message",
    "first_native_syncs",
    "flip",
    "leaving_native",
    "moved_ids",
    "preflight",
    "rollback_lines",
    "rolled_back",
    "stop_message",
    "verify",
    "verify_write",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)
