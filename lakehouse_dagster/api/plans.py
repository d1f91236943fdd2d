"""Rollout plans, the face the adapters import: a dry run, start, pause, resume, approve and abort
(plans/actions.py), a plan's status (status.py), the plans' store and event log (store.py), and the controller's
tick with its run states and step kinds (controller.py, steps.py).

Each name loads its home module on first use (PEP 562), so a CLI verb's --help imports none of it."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lakehouse_dagster.plans.actions import abort, approve, dry_run, pause, resume, start
    from lakehouse_dagster.plans.controller import tick
    from lakehouse_dagster.plans.status import PlanStatus, live_statuses, plan_status, recent_statuses
    from lakehouse_dagster.plans.steps import (
        ANALYSIS,
        COMPLETE_JOB,
        FAILED,
        IN_FLIGHT,
        READ_FLIP,
        SET_FLAG,
        SUCCEEDED,
        WRITE_FLIP,
        RunAsk,
        RunState,
    )
    from lakehouse_dagster.plans.store import alertable_events, events, resolve_id, tables_exist

_HOME = {
    "abort": "lakehouse_dagster.plans.actions",
    "approve": "lakehouse_dagster.plans.actions",
    "dry_run": "lakehouse_dagster.plans.actions",
    "pause": "lakehouse_dagster.plans.actions",
    "resume": "lakehouse_dagster.plans.actions",
    "start": "lakehouse_dagster.plans.actions",
    "PlanStatus": "lakehouse_dagster.plans.status",
    "live_statuses": "lakehouse_dagster.plans.status",
    "plan_status": "lakehouse_dagster.plans.status",
    "recent_statuses": "lakehouse_dagster.plans.status",
    "alertable_events": "lakehouse_dagster.plans.store",
    "events": "lakehouse_dagster.plans.store",
    "resolve_id": "lakehouse_dagster.plans.store",
    "tables_exist": "lakehouse_dagster.plans.store",
    "tick": "lakehouse_dagster.plans.controller",
    "ANALYSIS": "lakehouse_dagster.plans.steps",
    "COMPLETE_JOB": "lakehouse_dagster.plans.steps",
    "FAILED": "lakehouse_dagster.plans.steps",
    "IN_FLIGHT": "lakehouse_dagster.plans.steps",
    "READ_FLIP": "lakehouse_dagster.plans.steps",
    "SET_FLAG": "lakehouse_dagster.plans.steps",
    "SUCCEEDED": "lakehouse_dagster.plans.steps",
    "WRITE_FLIP": "lakehouse_dagster.plans.steps",
    "RunAsk": "lakehouse_dagster.plans.steps",
    "RunState": "lakehouse_dagster.plans.steps",
}

__all__ = [
    "ANALYSIS",
    "COMPLETE_JOB",
    "FAILED",
    "IN_FLIGHT",
    "PlanStatus",
    "READ_FLIP",
    "RunAsk",
    "RunState",
    "SET_FLAG",
    "SUCCEEDED",
    "WRITE_FLIP",
    "abort",
    "alertable_events",
    "approve",
    "dry_run",
    "events",
    "live_statuses",
    "pause",
    "plan_status",
    "recent_statuses",
    "resolve_id",
    "resume",
    "start",
    "tables_exist",
    "tick",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)
