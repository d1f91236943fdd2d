"""Which datasets are written natively to Iceberg: the mirror poller skips them.

One query for any number of datasets, uncached (the poller must see a flip at once), through the one
precedence definition (precedence.py), over the writers whose ceiling allows iceberg_native. Writers
locked to PG clamp to pg, so they never count.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

import psycopg

from lakehouse_dagster.flags.precedence import effective_sql
from lakehouse_dagster.flags.registry import FLIPPABLE_WRITERS
from lakehouse_dagster.tracking.datasets import scopes


def native_dataset_ids(conn: psycopg.Connection, dataset_ids: Iterable[uuid.UUID] | None = None) -> set[uuid.UUID]:
    """Datasets (all, or among ``dataset_ids``) where any flip-able writer resolves to iceberg_native."""
    if not FLIPPABLE_WRITERS:
        return set()
    if dataset_ids is None:
        datasets, params = scopes.ALL_IDS_AND_WORKSPACES, []
    else:
        ids = list(dataset_ids)
        if not ids:
            return set()
        datasets, params = scopes.IDS_AND_WORKSPACES_OF, [ids]
    query, args = effective_sql(
        FLIPPABLE_WRITERS, datasets, params, select="distinct e.dataset_id", where="e.mode = 'iceberg_native'"
    )
    return {r[0] for r in conn.execute(query, args).fetchall()}
