"""Which datasets are flipped: any reader or writer whose effective mode is above its registry default.

One query, uncached (the schedule must see a flip at once), through the flags' one precedence definition
(flags/precedence.py) with its clamp (a stored mode above the ceiling counts as the ceiling, so a
hand-written row cannot make a PG-locked writer look flipped).
"""

from __future__ import annotations

import uuid

import psycopg

from lakehouse_dagster.flags import overrides_store
from lakehouse_dagster.flags.registry import REGISTRY
from lakehouse_dagster.tracking.datasets import scopes

# Only datasets some override touches can resolve above their default.
_TOUCHED = scopes.tabular_ids_and_workspaces_where(overrides_store.TOUCHES_DATASET)


def flipped_dataset_ids(conn: psycopg.Connection) -> set[uuid.UUID]:
    """Tabular datasets with at least one read or write flag resolving above its registry default."""
    if not overrides_store.table_exists(conn):
        return set()
    from lakehouse_dagster.flags.precedence import effective_sql  # the flags area's precedence (one place)

    flags = [f for fs in REGISTRY.values() for f in fs.values()]
    query, params = effective_sql(flags, _TOUCHED, select="distinct e.dataset_id", where="e.mode_rank > e.default_rank")
    return {r[0] for r in conn.execute(query, params).fetchall()}
