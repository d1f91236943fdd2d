"""The canary and its verdicts, the face the adapters import: verdict names and exit codes, the latest verdicts
(parity/verdicts.py), a run of the canary (parity/canary.py), the smoke check's bound, the health checks
(parity/health.py), the pinned Iceberg snapshot, the canary with its auto-rollback (runbooks/auto_rollback.py)
and the scheduled rounds (runbooks/canary_rounds.py).

Each name loads its home module on first use (PEP 562), so a CLI verb's --help imports none of it."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lakehouse_dagster.parity.canary import evaluate
    from lakehouse_dagster.parity.canary_verdict import Verdict
    from lakehouse_dagster.parity.digest import pin_iceberg
    from lakehouse_dagster.parity.health import DEFAULT_MAX_LAG_SECONDS, identity_ready, snapshot_freshness
    from lakehouse_dagster.parity.smoke import SMOKE_MAX_ROWS
    from lakehouse_dagster.parity.verdicts import (
        DEFAULT_LIMIT,
        ERROR,
        EXIT_ERROR,
        EXIT_MISMATCH,
        LAGGING,
        MISMATCH,
        NATIVE,
        NO_SNAPSHOT,
        OK,
        VERDICTS,
        counts_by_latest_verdict,
        full_due,
        latest_verdicts,
        wedged_syncs,
    )
    from lakehouse_dagster.runbooks.auto_rollback import lines_of, record_and_roll_back, run_canary_and_roll_back
    from lakehouse_dagster.runbooks.canary_rounds import oldest_first, plan_round

_HOME = {
    "DEFAULT_LIMIT": "lakehouse_dagster.parity.verdicts",
    "ERROR": "lakehouse_dagster.parity.verdicts",
    "EXIT_ERROR": "lakehouse_dagster.parity.verdicts",
    "EXIT_MISMATCH": "lakehouse_dagster.parity.verdicts",
    "LAGGING": "lakehouse_dagster.parity.verdicts",
    "MISMATCH": "lakehouse_dagster.parity.verdicts",
    "NATIVE": "lakehouse_dagster.parity.verdicts",
    "NO_SNAPSHOT": "lakehouse_dagster.parity.verdicts",
    "OK": "lakehouse_dagster.parity.verdicts",
    "VERDICTS": "lakehouse_dagster.parity.verdicts",
    "counts_by_latest_verdict": "lakehouse_dagster.parity.verdicts",
    "full_due": "lakehouse_dagster.parity.verdicts",
    "latest_verdicts": "lakehouse_dagster.parity.verdicts",
    "wedged_syncs": "lakehouse_dagster.parity.verdicts",
    "Verdict": "lakehouse_dagster.parity.canary_verdict",
    "evaluate": "lakehouse_dagster.parity.canary",
    "SMOKE_MAX_ROWS": "lakehouse_dagster.parity.smoke",
    "DEFAULT_MAX_LAG_SECONDS": "lakehouse_dagster.parity.health",
    "identity_ready": "lakehouse_dagster.parity.health",
    "snapshot_freshness": "lakehouse_dagster.parity.health",
    "pin_iceberg": "lakehouse_dagster.parity.digest",
    "lines_of": "lakehouse_dagster.runbooks.auto_rollback",
    "record_and_roll_back": "lakehouse_dagster.runbooks.auto_rollback",
    "run_canary_and_roll_back": "lakehouse_dagster.runbooks.auto_rollback",
    "oldest_first": "lakehouse_dagster.runbooks.canary_rounds",
    "plan_round": "lakehouse_dagster.runbooks.canary_rounds",
}

__all__ = [
    "DEFAULT_LIMIT",
    "DEFAULT_MAX_LAG_SECONDS",
    "ERROR",
    "EXIT_ERROR",
    "EXIT_MISMATCH",
    "LAGGING",
    "MISMATCH",
    "NATIVE",
    "NO_SNAPSHOT",
    "OK",
    "SMOKE_MAX_ROWS",
    "VERDICTS",
    "Verdict",
    "counts_by_latest_verdict",
    "evaluate",
    "full_due",
    "identity_ready",
    "latest_verdicts",
    "lines_of",
    "oldest_first",
    "pin_iceberg",
    "plan_round",
    "record_and_roll_back",
    "run_canary_and_roll_back",
    "snapshot_freshness",
    "wedged_syncs",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)
