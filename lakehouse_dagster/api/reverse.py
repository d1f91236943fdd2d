"""The reverse mirror, the face the CLI, the Dagster glue and the service import: its runs (mirror/reverse.py),
its on/off setting (flags/reverse_setting.py), its lag (mirror/reverse_lag.py), its parity and catch-up
(runbooks/reverse_parity.py) and the recorder's page changes (status/reverse_page.py). The capability spans
layers, so its face sits above them all.

Each name loads its home module on first use (PEP 562), so a CLI verb's --help imports none of it."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lakehouse_dagster.flags.reverse_setting import reverse_history, set_reverse, where_native_writes_land
    from lakehouse_dagster.mirror.reverse import (
        NOOP,
        ReverseResult,
        apply_due,
        apply_reverse,
        due_datasets,
        latest_snapshots,
        position,
        reverse_states,
    )
    from lakehouse_dagster.mirror.reverse_lag import reverse_lags
    from lakehouse_dagster.runbooks.reverse_parity import catch_up, check_reverse_parity, is_reverse_verdict
    from lakehouse_dagster.status.reverse_page import ReversePageChange, reverse_page_changes

_HOME = {
    "NOOP": "lakehouse_dagster.mirror.reverse",
    "ReverseResult": "lakehouse_dagster.mirror.reverse",
    "apply_due": "lakehouse_dagster.mirror.reverse",
    "apply_reverse": "lakehouse_dagster.mirror.reverse",
    "due_datasets": "lakehouse_dagster.mirror.reverse",
    "latest_snapshots": "lakehouse_dagster.mirror.reverse",
    "position": "lakehouse_dagster.mirror.reverse",
    "reverse_states": "lakehouse_dagster.mirror.reverse",
    "reverse_history": "lakehouse_dagster.flags.reverse_setting",
    "set_reverse": "lakehouse_dagster.flags.reverse_setting",
    "where_native_writes_land": "lakehouse_dagster.flags.reverse_setting",
    "reverse_lags": "lakehouse_dagster.mirror.reverse_lag",
    "catch_up": "lakehouse_dagster.runbooks.reverse_parity",
    "check_reverse_parity": "lakehouse_dagster.runbooks.reverse_parity",
    "is_reverse_verdict": "lakehouse_dagster.runbooks.reverse_parity",
    "ReversePageChange": "lakehouse_dagster.status.reverse_page",
    "reverse_page_changes": "lakehouse_dagster.status.reverse_page",
}

__all__ = [
    "NOOP",
    "ReversePageChange",
    "ReverseResult",
    "apply_due",
    "apply_reverse",
    "catch_up",
    "check_reverse_parity",
    "due_datasets",
    "is_reverse_verdict",
    "latest_snapshots",
    "position",
    "reverse_history",
    "reverse_lags",
    "reverse_page_changes",
    "reverse_states",
    "set_reverse",
    "where_native_writes_land",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)
