"""Soak windows read from the audit: since when a flag has held a mode, and when its soak ends.

A soak starts when the flag reached the mode — the audit row that raised it, held without a drop
below it since — and restarts at the latest incident on the datasets it covers (flags/incidents.py).
It ends ``soak_seconds`` after its start. Times are the database's (the audit's ``at`` is ``now()``
of the writing transaction), so the clocks of the processes never matter.
"""

from __future__ import annotations

import dataclasses
import math
import uuid
from datetime import datetime, timedelta

import psycopg

from lakehouse_dagster.flags.incidents import Incident
from lakehouse_dagster.flags.overrides import audit_steps
from lakehouse_dagster.flags.registry import Flag, rank
from lakehouse_dagster.flags.resolver import resolve_from

# (scope, scope id) → [(audit id, at, mode after: None for a clear)], oldest first
KeyHistory = dict[tuple[str, uuid.UUID | None], list[tuple[int, datetime, str | None]]]


def audit_history(conn: psycopg.Connection, kind: str, names: list[str]) -> dict[str, KeyHistory]:
    """{flag name: {(scope, scope id): its audit rows, oldest first}}, read in one query."""
    out: dict[str, KeyHistory] = {n: {} for n in names}
    for id_, at, name, scope, scope_id, after in audit_steps(conn, kind, names):
        out[name].setdefault((scope, scope_id), []).append((id_, at, after))
    return out


def _held_since(steps, flag: Flag, min_mode: str) -> datetime | None:
    """Start of the last unbroken run of steps [(at, mode)] at ``min_mode`` or above (None: not held now)."""
    since = None
    for at, mode in steps:
        if mode is not None and rank(flag.kind, mode) >= rank(flag.kind, min_mode):
            since = since or at
        else:
            since = None
    return since


def key_since(
    history: KeyHistory, flag: Flag, scope: str, scope_id: uuid.UUID | None, min_mode: str
) -> datetime | None:
    """Since when the override (scope, scope id) has stood at ``min_mode`` or above, by the audit."""
    return _held_since([(at, mode) for _, at, mode in history.get((scope, scope_id), [])], flag, min_mode)


def effective_since(
    history: KeyHistory, flag: Flag, dataset_id: uuid.UUID, workspace_id: uuid.UUID | None, min_mode: str
) -> datetime | None:
    """Since when the flag's effective mode for one dataset has been ``min_mode`` or above: the audit of its
    dataset, workspace and global overrides replayed in order through the resolver's precedence."""
    keys = {("dataset", dataset_id): "dataset", ("workspace", workspace_id): "workspace", ("global", None): "global"}
    rows = sorted((r, keys[k]) for k in keys for r in history.get(k, []))
    stored: dict[str, str] = {}
    steps = []
    for (_, at, mode), scope in rows:
        if mode is None:
            stored.pop(scope, None)
        else:
            stored[scope] = mode
        steps.append((at, resolve_from(flag, stored).mode))
    return _held_since(steps, flag, min_mode)


@dataclasses.dataclass(frozen=True)
class Soak:
    what: str  # e.g. "export.stream iceberg at dataset <id>"
    since: datetime  # when it reached the mode
    ends: datetime
    incident: Incident | None  # the latest incident after ``since``: the soak restarted there

    def soaked(self, now: datetime) -> bool:
        return now >= self.ends

    def describe(self, now: datetime) -> str:
        restarted = f", restarted by a {self.incident.describe()}" if self.incident else ""
        return f"{self.what} since {self.since:%Y-%m-%d %H:%M:%S} UTC{restarted}: its soak {until(self.ends, now)}"


def soak(what: str, since: datetime, incidents: list[Incident], soak_seconds: int, names: dict | None = None) -> Soak:
    """The soak of something held since ``since``, restarted by the latest of ``incidents`` after it (``names``:
    dataset names by id, so the incident names its dataset)."""
    after = [i for i in incidents if i.at >= since]
    latest = max(after, key=lambda i: i.at) if after else None
    if latest is not None and names:
        latest = dataclasses.replace(latest, dataset_name=names.get(latest.dataset_id))
    start = max(since, latest.at) if latest else since
    return Soak(what, since, start + timedelta(seconds=soak_seconds), latest)


def until(ends: datetime, now: datetime) -> str:
    minutes = max(1, math.ceil((ends - now).total_seconds() / 60))
    return f"ends at {ends:%Y-%m-%d %H:%M:%S} UTC (in {minutes} min)"
