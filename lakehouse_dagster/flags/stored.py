"""Every override of some flags read at once, and a flag's effective mode per dataset from them: what the flip gates
(gates.py) and the widening rules (widen.py) both evaluate over many datasets without a query each."""

from __future__ import annotations

import uuid

import psycopg

from lakehouse_dagster.flags import overrides_store
from lakehouse_dagster.flags.overrides import DATASET, GLOBAL, WORKSPACE
from lakehouse_dagster.flags.registry import Flag
from lakehouse_dagster.flags.resolver import resolve_from


def stored_overrides(
    conn: psycopg.Connection, kind: str, names: list[str]
) -> dict[str, dict[tuple[str, uuid.UUID | None], str]]:
    """{flag name: {(scope, scope id): mode}}: every override of these flags, read once."""
    stored: dict[str, dict] = {n: {} for n in names}
    for name, scope, scope_id, mode in overrides_store.of_flags(conn, kind, names):
        stored[name][(scope, scope_id)] = mode
    return stored


def resolve_for(flag: Flag, stored: dict, dataset_id: uuid.UUID, workspace_id: uuid.UUID | None) -> str:
    """The flag's effective mode for one dataset, from ``stored_overrides`` (the resolver's precedence)."""
    found = {}
    for scope, key in ((DATASET, dataset_id), (WORKSPACE, workspace_id), (GLOBAL, None)):
        if (scope, key) in stored:
            found[scope] = stored[(scope, key)]
    return resolve_from(flag, found).mode
