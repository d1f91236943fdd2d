"""Alerts, the face the Dagster sensor imports: the event records, the keyset cursor, the outbox's check for what
is recorded, the webhook's check and one tick (status/alerts/). Each name points at the package, the alerts' own
face (its submodules are its parts), so a test that sets one of its tunables there is what the sensor reads. A face
of its own: its ``Cursor`` is not the recorder's (api/status.py).

Each name loads its home module on first use (PEP 562), so a CLI verb's --help imports none of it."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lakehouse_dagster.status.alerts import (
        ENV,
        RUN_FAILED,
        RUNS_LOOKBACK,
        RUNS_LOOKBACK_READ,
        Cursor,
        FailedRun,
        PlanEvent,
        Position,
        keyset_page,
        run_tick,
        unrecorded,
        webhook_problem,
    )

_HOME = {
    "ENV": "lakehouse_dagster.status.alerts",
    "RUN_FAILED": "lakehouse_dagster.status.alerts",
    "RUNS_LOOKBACK": "lakehouse_dagster.status.alerts",
    "RUNS_LOOKBACK_READ": "lakehouse_dagster.status.alerts",
    "Cursor": "lakehouse_dagster.status.alerts",
    "FailedRun": "lakehouse_dagster.status.alerts",
    "PlanEvent": "lakehouse_dagster.status.alerts",
    "Position": "lakehouse_dagster.status.alerts",
    "keyset_page": "lakehouse_dagster.status.alerts",
    "run_tick": "lakehouse_dagster.status.alerts",
    "unrecorded": "lakehouse_dagster.status.alerts",
    "webhook_problem": "lakehouse_dagster.status.alerts",
}

__all__ = [
    "Cursor",
    "ENV",
    "FailedRun",
    "PlanEvent",
    "Position",
    "RUNS_LOOKBACK",
    "RUNS_LOOKBACK_READ",
    "RUN_FAILED",
    "keyset_page",
    "run_tick",
    "unrecorded",
    "webhook_problem",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)
