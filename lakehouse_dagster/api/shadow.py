"""Shadow reads, the face the adapters import (routing/shadow.py): a read served from Postgres compared with Iceberg
off the request path, and the outcomes the service's metrics count. Callers import the module and write
``shadow.X``: the outcome names (``shadow.MATCH``, ``shadow.ERROR``...) are the comparison's, not the canary's.

Each name loads its home module on first use (PEP 562), so a CLI verb's --help imports none of it."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lakehouse_dagster.routing.shadow import (
        DROPPED,
        ERROR,
        LAGGING,
        MATCH,
        MAX_STREAMED_ROWS,
        MISMATCH,
        NO_SNAPSHOT,
        NOT_COMPARABLE,
        ShadowPool,
        iceberg_answer,
        iceberg_side,
        offer_query,
        offer_read,
        pool_for,
        shadowed,
    )

_HOME = {
    "DROPPED": "lakehouse_dagster.routing.shadow",
    "ERROR": "lakehouse_dagster.routing.shadow",
    "LAGGING": "lakehouse_dagster.routing.shadow",
    "MATCH": "lakehouse_dagster.routing.shadow",
    "MAX_STREAMED_ROWS": "lakehouse_dagster.routing.shadow",
    "MISMATCH": "lakehouse_dagster.routing.shadow",
    "NOT_COMPARABLE": "lakehouse_dagster.routing.shadow",
    "NO_SNAPSHOT": "lakehouse_dagster.routing.shadow",
    "ShadowPool": "lakehouse_dagster.routing.shadow",
    "iceberg_answer": "lakehouse_dagster.routing.shadow",
    "iceberg_side": "lakehouse_dagster.routing.shadow",
    "offer_query": "lakehouse_dagster.routing.shadow",
    "offer_read": "lakehouse_dagster.routing.shadow",
    "pool_for": "lakehouse_dagster.routing.shadow",
    "shadowed": "lakehouse_dagster.routing.shadow",
}

__all__ = [
    "DROPPED",
    "ERROR",
    "LAGGING",
    "MATCH",
    "MAX_STREAMED_ROWS",
    "MISMATCH",
    "NOT_COMPARABLE",
    "NO_SNAPSHOT",
    "ShadowPool",
    "iceberg_answer",
    "iceberg_side",
    "offer_query",
    "offer_read",
    "pool_for",
    "shadowed",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)
