"""Capture modes, the face the adapters import: the two modes and the old words, switching, catching up,
repair, the state and the upgrade from the previous release (tracking/capture/).

Each name loads its home module on first use (PEP 562), so a CLI verb's --help imports none of it."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lakehouse_dagster.tracking.capture import (
        AFTER_COMMIT,
        RENAMED,
        TRIGGERS,
        CaptureError,
        catch_up,
        disable,
        enable,
        repair,
        state,
        status,
        upgrade_from_previous_release,
    )

_HOME = {
    "AFTER_COMMIT": "lakehouse_dagster.tracking.capture",
    "RENAMED": "lakehouse_dagster.tracking.capture",
    "TRIGGERS": "lakehouse_dagster.tracking.capture",
    "CaptureError": "lakehouse_dagster.tracking.capture",
    "catch_up": "lakehouse_dagster.tracking.capture",
    "disable": "lakehouse_dagster.tracking.capture",
    "enable": "lakehouse_dagster.tracking.capture",
    "repair": "lakehouse_dagster.tracking.capture",
    "state": "lakehouse_dagster.tracking.capture",
    "status": "lakehouse_dagster.tracking.capture",
    "upgrade_from_previous_release": "lakehouse_dagster.tracking.capture",
}

__all__ = [
    "AFTER_COMMIT",
    "CaptureError",
    "RENAMED",
    "TRIGGERS",
    "catch_up",
    "disable",
    "enable",
    "repair",
    "state",
    "status",
    "upgrade_from_previous_release",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)
