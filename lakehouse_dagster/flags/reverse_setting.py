"""Reverse on/off: whether the reverse mirror (mirror/reverse.py) keeps a native dataset's ``dataset_rows``.

Not a flag of the registry: a flag has modes, ceilings, flip gates and a cache every router reads; this is one
boolean that only the reverse mirror and the rollback report read, uncached. It has the flags' shape all the same:
an override per dataset, workspace or global, the most specific wins (dataset > workspace > global), and with no
override it is ON (the default for every native dataset until it is complete, a later step). Every set and clear
is audited (who, when, note) in the append-only ``lakehouse_reverse_audit`` (migration 033).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable
from datetime import datetime

import psycopg

from lakehouse_dagster.core.db import fetch_value
from lakehouse_dagster.flags.lifecycle_facts import derive, scope_ids
from lakehouse_dagster.flags.overrides import Scope, _check_actor, _check_note, parse_scope, require_target
from lakehouse_dagster.flags.reverse_read import (
    DEFAULT_ON,
    ReverseSetting,
    delete_setting,
    lock_and_read_setting,
    reverse_enabled,
    reverse_settings,
    store_setting,
)
from lakehouse_dagster.lifecycle import REVERSE, transition
from lakehouse_dagster.tracking.datasets import rows as dataset_rows

__all__ = [
    "DEFAULT_ON",
    "ReverseChange",
    "ReverseSetting",
    "reverse_enabled",
    "reverse_history",
    "reverse_settings",
    "set_reverse",
    "where_native_writes_land",
]


@dataclasses.dataclass(frozen=True)
class ReverseChange:
    scope: Scope
    before: bool | None  # None: no setting at that scope
    after: bool | None  # None: cleared
    note: str | None
    actor: str
    at: datetime

    @property
    def changed(self) -> bool:
        return self.before != self.after

    def as_dict(self) -> dict:
        return {
            "scope": self.scope.scope,
            "scope_id": str(self.scope.scope_id) if self.scope.scope_id else None,
            "before": self.before,
            "after": self.after,
            "note": self.note,
            "actor": self.actor,
            "at": self.at.isoformat(),
        }


def where_native_writes_land(conn: psycopg.Connection, dataset_ids: Iterable[uuid.UUID]) -> str:
    """What a write flip's line says of the datasets it moved: their new writes land in Iceberg (the mirror skips
    them), and the reverse mirror copies them back into dataset_rows where it is on (the default), not where off."""
    settings = reverse_settings(conn, dataset_ids)
    off = sorted(str(d) for d, s in settings.items() if not s.enabled)
    if off and len(off) == len(settings):
        return "new writes of the datasets it moves land in Iceberg only, the mirror skips them (reverse mirror off)"
    head = "new writes of the datasets it moves land in Iceberg, the mirror skips them"
    if not off:
        return head + f"; the reverse mirror copies them back into {dataset_rows.TABLE} (lakehouse reverse status)"
    return (
        f"{head}; the reverse mirror copies them back into {dataset_rows.TABLE}, except for {len(off)} of {len(settings)} "
        f"with it off: {', '.join(off[:5])}{' …' if len(off) > 5 else ''}"
    )


def set_reverse(
    conn: psycopg.Connection,
    enabled: bool | None,
    *,
    dataset: object = None,
    workspace: object = None,
    note: str | None,
    actor: str,
) -> ReverseChange:
    """Store (``enabled`` True/False) or clear (None) the setting at one scope, audited, in one transaction.
    Everything is checked before anything is written."""
    scope = parse_scope(dataset, workspace)
    note, actor = _check_note(note), _check_actor(actor)
    require_target(conn, scope)
    what = f"lakehouse reverse {'clear' if enabled is None else 'on' if enabled else 'off'} ({scope})"
    with transition(
        conn,
        REVERSE,
        dataset_ids=[scope.scope_id]
        if scope.scope == "dataset" and scope.scope_id
        else lambda c: scope_ids(c, scope.scope, scope.scope_id),
        wide=scope.scope != "dataset",
        derive=derive,
        actor=actor,
        what=what,
    ):
        before = lock_and_read_setting(conn, scope.scope, scope.scope_id)
        if enabled is None and before is None:  # nothing to clear: nothing written, nothing audited
            return ReverseChange(scope, None, None, note, actor, fetch_value(conn.execute("select now()"), "now"))
        if enabled is None:
            delete_setting(conn, scope.scope, scope.scope_id)
        else:
            store_setting(conn, scope.scope, scope.scope_id, enabled, note, actor)
        at = fetch_value(
            conn.execute(
                "insert into lakehouse_reverse_audit (action, scope, scope_id, before_enabled, after_enabled, note, actor)"
                " values (%s, %s, %s, %s, %s, %s, %s) returning at",
                ("clear" if enabled is None else "set", scope.scope, scope.scope_id, before, enabled, note, actor),
            ),
            "the reverse audit row just written",
        )
    return ReverseChange(scope, before, enabled, note, actor, at)


def reverse_history(conn: psycopg.Connection, limit: int = 20) -> list[dict]:
    """The audit, newest first."""
    rows = conn.execute(
        "select id, at, action, scope, scope_id, before_enabled, after_enabled, note, actor"
        " from lakehouse_reverse_audit order by id desc limit %s",
        (limit,),
    ).fetchall()
    keys = ("id", "at", "action", "scope", "scope_id", "before", "after", "note", "actor")
    return [dict(zip(keys, r)) for r in rows]
