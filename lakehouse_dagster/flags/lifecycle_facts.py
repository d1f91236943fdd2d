"""The facts a dataset's lifecycle state is derived from, read in a few set queries: which flip-able writers
resolve to iceberg_native (precedence.py), whether an Iceberg-servable reader resolves to iceberg, whether the
mirror ever landed a snapshot, the complete mark (completed.py) and the reverse setting (reverse_read.py).

``derive`` is what lifecycle/transition.py checks a verb's effect with; ``scope_ids`` says which datasets a scope
covers; ``lifecycle_of`` is the state as stored, brought up to date, for every reader above the flags.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence

import psycopg

from lakehouse_dagster.flags.completed import COMPLETE, IN_PROGRESS, RESTORING, completed_marks
from lakehouse_dagster.flags.precedence import effective_sql
from lakehouse_dagster.flags.registry import FLIPPABLE_WRITERS, SERVABLE_READERS
from lakehouse_dagster.flags.reverse_read import reverse_settings
from lakehouse_dagster.lifecycle import states as st
from lakehouse_dagster.lifecycle.states import Facts
from lakehouse_dagster.lifecycle.transition import current, stored_states
from lakehouse_dagster.tracking import sync_log
from lakehouse_dagster.tracking.datasets import lookup, scopes

_DATASETS = scopes.IDS_AND_WORKSPACES_OF
_MARK_STATE = {IN_PROGRESS: st.COMPLETING, COMPLETE: st.COMPLETE, RESTORING: st.RESTORING}


def derive(conn: psycopg.Connection, dataset_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Facts]:
    """Each existing dataset's state as its facts say now (a deleted one is left out)."""
    ids = list(dataset_ids)
    if not ids:
        return {}
    exists = lookup.existing_ids(conn, ids)
    native: dict[uuid.UUID, list[str]] = {}
    if FLIPPABLE_WRITERS:
        q, args = effective_sql(
            FLIPPABLE_WRITERS, _DATASETS, [ids], select="e.dataset_id, e.name", where="e.mode = 'iceberg_native'"
        )
        for d, name in conn.execute(q, args).fetchall():
            native.setdefault(d, []).append(name)
    reading: set[uuid.UUID] = set()
    if SERVABLE_READERS:
        q, args = effective_sql(
            SERVABLE_READERS,
            _DATASETS,
            [ids],
            select="distinct e.dataset_id",
            where="e.mode in ('iceberg', 'iceberg_only')",
        )
        reading = {r[0] for r in conn.execute(q, args).fetchall()}
    mirrored = sync_log.ever_synced(conn, ids)
    marks = completed_marks(conn, ids)
    reverse = reverse_settings(conn, ids)
    out: dict[uuid.UUID, Facts] = {}
    for d in ids:
        if d not in exists:
            continue
        writers = tuple(sorted(native.get(d, ())))
        mark = marks.get(d)
        if mark is not None and mark.status in _MARK_STATE:
            state = _MARK_STATE[mark.status]
        elif writers:
            state = st.NATIVE
        elif d in mirrored:
            state = st.READ_FLIPPED if d in reading else st.MIRRORED
        else:
            state = st.PG
        on = reverse[d].enabled if d in reverse else None
        out[d] = Facts(state, on if st.AUTHORITY[state] == st.ICEBERG else None, writers)
    return out


def scope_ids(conn: psycopg.Connection, scope: str, scope_id: uuid.UUID | None) -> list[uuid.UUID] | None:
    """The datasets a scope covers now (None: every dataset, a global scope)."""
    if scope == "dataset":
        assert scope_id is not None
        return [scope_id]
    if scope == "workspace":
        return scopes.ids_in_workspace(conn, scope_id)
    return None


def lifecycle_of(conn: psycopg.Connection, dataset_ids: Iterable[uuid.UUID], actor: str = "lakehouse") -> dict:
    """{dataset id: Facts}: the stored state, recorded first for a dataset that has none yet."""
    return current(conn, list(dataset_ids), derive, actor)


def lifecycle_words(conn: psycopg.Connection, dataset_ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, str]:
    """{dataset id: "lifecycle native (reverse on)"}: what a refusal names each dataset's state with. The stored
    state only (a refusal never records one): a dataset without a stored state is left out."""
    return {d: f"lifecycle {f.describe()}" for d, f in stored_states(conn, list(dataset_ids)).items()}
