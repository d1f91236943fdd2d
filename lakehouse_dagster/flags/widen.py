"""Widening rules (dataset → workspace → global), as the runbooks order them: soak, then the writers' order.

Definitions (the README says the same):

* A *widen* is a gated set at workspace or global scope that raises, to the new mode M (at least iceberg for a
  reader, iceberg_native for a writer), the effective mode of at least one dataset, or the scope's own mode (what
  datasets created there later get: the runbooks' global step after every workspace is flipped moves no dataset
  that exists, and is still the widen to global). Lowering, clearing, shadow and dataset-scope flips are never
  widens.
* Its *narrower flips* are the flag's overrides one scope down, at M or above: for workspace W, the
  dataset-scope overrides of datasets in W; for global, the workspace-scope overrides.
* **Order** (whatever the soak): a widen needs at least one narrower flip — a dataset flip inside W before W, a
  workspace flip before global.
* **Soak** (``soak_seconds`` > 0, the stored soak: flags/soak_setting.py): one narrower flip must have *soaked* —
  ``soak_seconds`` have passed since it reached M (from the audit) and since the latest incident on its datasets
  (a MISMATCH verdict, a failed sync, or a read fallback of any reader: flags/incidents.py; its datasets: the
  dataset itself, or for a workspace override the workspace's datasets the flag resolves to M or above for) — and
  none of them may have had an incident within the last ``soak_seconds`` (an incident restarts that flip's soak,
  and the widen waits for it). A soak of 0 drops the waiting, never the order.
* Writers widen one at a time, in the runbook's order: sync.full, then sync.append, then
  sync.incremental / cdc.append (in either order). Widening a writer at workspace W (or globally) needs
  every earlier writer iceberg_native at that scope — resolved for the scope itself: W's override, else
  the global one — and, with a soak, that earlier widen soaked over the datasets it covers there (the order holds
  with a soak of 0 too). A
  dataset-scope flip of a later writer does not need the earlier one: a dataset is written by its own
  source's writer, and the runbook's canary step (step 3) is per dataset; the order is about widening.

Prerequisite #1 with soak (a writer flips a dataset only after its readers served Iceberg that long) is
per dataset and lives with the other write-flip prerequisites in gates.py; it uses soak.py the same way.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import psycopg

from lakehouse_dagster.core.errors import NotFound
from lakehouse_dagster.flags.incidents import latest_incidents
from lakehouse_dagster.flags.overrides import DATASET, GLOBAL, WORKSPACE, Scope
from lakehouse_dagster.flags.registry import READ, WRITE, WRITERS, Flag, rank
from lakehouse_dagster.flags.resolver import resolve_from
from lakehouse_dagster.flags.soak import Soak, audit_history, key_since, soak
from lakehouse_dagster.flags.stored import resolve_for, stored_overrides
from lakehouse_dagster.tracking.datasets import lookup, scopes

# The runbook's writer order: "start with sync.full, then sync.append, then sync.incremental/cdc.append".
WRITER_ORDER: tuple[tuple[str, ...], ...] = (("sync.full",), ("sync.append",), ("sync.incremental", "cdc.append"))
_SHOWN = 5


def entry_mode(flag: Flag) -> str:
    """The lowest mode that moves a dataset off Postgres: where widening rules begin."""
    return "iceberg" if flag.kind == READ else "iceberg_native"


def earlier_writers(name: str) -> list[str]:
    for i, tier in enumerate(WRITER_ORDER):
        if name in tier:
            return [w for t in WRITER_ORDER[:i] for w in t]
    return []


def is_widen(flag: Flag, scope: Scope, mode: str | None, moved, scope_before: str | None = None) -> bool:
    """``scope_before``: the scope's own mode before the change (``scope_mode``); a rise of it is a widen too."""
    if mode is None or scope.scope == DATASET or rank(flag.kind, mode) < rank(flag.kind, entry_mode(flag)):
        return False
    if scope_before is not None and rank(flag.kind, scope_before) < rank(flag.kind, mode):
        return True
    return any(rank(flag.kind, e.before) < rank(flag.kind, mode) <= rank(flag.kind, e.after) for e in moved)


def scope_mode(conn: psycopg.Connection, flag: Flag, scope: Scope) -> str:
    """The flag's mode for the scope itself (what a dataset created there now gets), ignoring narrower overrides."""
    return _scope_resolve(flag, stored_overrides(conn, flag.kind, [flag.name])[flag.name], scope)[0]


def scope_mode_in(flag: Flag, stored: dict, scope: Scope) -> str:
    """``scope_mode`` over given overrides {(scope, scope id): mode} (a dry-run's simulated state)."""
    return _scope_resolve(flag, stored, scope)[0]


def _cmd(flag: Flag) -> str:
    return "lakehouse flags" if flag.kind == READ else "lakehouse write-flags"


def _scope_resolve(flag: Flag, stored: dict, scope: Scope) -> tuple[str, tuple[str, uuid.UUID | None] | None]:
    """The flag's mode for a scope itself (ignoring narrower overrides), and the key that decides it."""
    keys = [(WORKSPACE, scope.scope_id)] if scope.scope == WORKSPACE else []
    for key in keys + [(GLOBAL, None)]:
        if key in stored:
            return resolve_from(flag, {key[0]: stored[key]}).mode, key
    return flag.default, None


def widen_blockers(
    conn: psycopg.Connection,
    flag: Flag,
    scope: Scope,
    mode: str | None,
    moved,
    datasets: dict,
    *,
    soak_seconds: int,
    now: datetime,
    names: dict | None = None,
) -> list[str]:
    """Why this change may not widen now (empty: it may, or it is not a widen). ``moved``/``datasets``
    are gates.effects' output; ``now`` is the database's time; ``names``: dataset and workspace names by id."""
    # an empty scope has no dataset to flip first: only the datasets it moves make it a widen
    before = scope_mode(conn, flag, scope) if datasets and scope.scope != DATASET else None
    if scope.scope == DATASET or not is_widen(flag, scope, mode, moved, before):
        return []
    assert mode is not None
    reasons = []
    if flag.kind == WRITE:
        reasons += _order_blockers(conn, flag, scope, soak_seconds, now, names or {})
    reasons += _narrower_blockers(conn, flag, scope, mode, soak_seconds, now, names or {})
    return reasons


def _covered(conn, flag: Flag, stored: dict, scope: Scope, min_mode: str) -> list[uuid.UUID]:
    """Datasets in ``scope`` the flag resolves to ``min_mode`` or above for."""
    rows: list[tuple[Any, Any]]  # (dataset id, workspace id)
    if scope.scope == DATASET:
        rows = [
            (
                scope.scope_id,
                lookup.workspace_id_of(
                    conn,
                    scope.scope_id,
                    NotFound(f"dataset {scope.scope_id} does not exist (deleted while its flag change was checked)"),
                ),
            )
        ]
    else:
        rows = scopes.ids_and_workspaces(conn, scope.scope_id, every=scope.scope != WORKSPACE)
    return [d for d, ws in rows if rank(flag.kind, resolve_for(flag, stored, d, ws)) >= rank(flag.kind, min_mode)]


def place(scope: str, scope_id: uuid.UUID | None, names: dict) -> str:
    """``workspace sales (<id>)`` / ``dataset orders (<id>)`` / ``global``: a scope as operators know it."""
    if scope_id is None:
        return GLOBAL
    name = names.get(scope_id)
    return f"{scope} {name} ({scope_id})" if name else f"{scope} {scope_id}"


def _at(key: tuple, names: dict) -> str:
    return "globally" if key[0] == GLOBAL else f"at {place(key[0], key[1], names)}"


def _soak_of(
    conn,
    flag: Flag,
    history,
    stored: dict,
    key: tuple | None,
    min_mode: str,
    covered_scope: Scope,
    soak_seconds: int,
    names: dict,
) -> Soak | None:
    """The soak of the override ``key`` at ``min_mode`` over the datasets it covers (None: no audit of it)."""
    if key is None:  # the flag's default decides: no override, so no audit says since when
        return None
    since = key_since(history, flag, key[0], key[1], min_mode)
    if since is None:
        return None
    ids = _covered(conn, flag, stored, covered_scope, min_mode)
    found = latest_incidents(conn, ids, since)
    incidents = [i for v in found.values() for i in v]
    what = f"{flag.name} {min_mode} {_at(key, names)}"
    return soak(what, since, incidents, soak_seconds, names)


def _narrower_blockers(
    conn, flag: Flag, scope: Scope, mode: str, soak_seconds: int, now: datetime, names: dict
) -> list[str]:
    """The order (a narrower flip first, whatever the soak), then its soak (when the soak is above 0)."""
    stored = stored_overrides(conn, flag.kind, [flag.name])[flag.name]
    where = place(scope.scope, scope.scope_id, names)
    if scope.scope == WORKSPACE:
        in_ws = set(scopes.ids_in_workspace(conn, scope.scope_id))
        narrower = [
            k
            for k, m in stored.items()
            if k[0] == DATASET and k[1] in in_ws and rank(flag.kind, m) >= rank(flag.kind, mode)
        ]
        one_down, example = "dataset", f"--dataset <id in workspace {scope.scope_id}>"
    else:
        narrower = [k for k, m in stored.items() if k[0] == WORKSPACE and rank(flag.kind, m) >= rank(flag.kind, mode)]
        one_down, example = "workspace", "--workspace <id>"
    if not narrower:
        first = f"flip one first ({_cmd(flag)} set {flag.name} {mode} {example})"
        if soak_seconds <= 0:
            return [
                f"order (dataset → workspace → global): no {one_down}-scope flip of {flag.name} to {mode} inside "
                f"{where} yet; {first}, then widen (the soak is 0 s, which drops the waiting, not the order)"
            ]
        return [
            f"soak: no {one_down}-scope flip of {flag.name} to {mode} inside {where} to have soaked; "
            f"{first}, let it soak {soak_seconds}s (lakehouse soak show) without incident, then widen"
        ]
    if soak_seconds <= 0:
        return []
    history = audit_history(conn, flag.kind, [flag.name])[flag.name]
    soaks, unexplained = [], []
    for key in sorted(narrower, key=str):
        s = _soak_of(conn, flag, history, stored, key, mode, Scope(*key), soak_seconds, names)
        (soaks.append(s) if s else unexplained.append(key))
    window = now - timedelta(seconds=soak_seconds)
    disturbed = [s for s in soaks if s.incident is not None and s.incident.at > window]
    if disturbed:
        lines = [
            f"soak: {len(disturbed)} narrower flip(s) had an incident within the last {soak_seconds}s; "
            "investigate, then widen when their soak ends:"
        ]
        lines += [f"    {s.describe(now)}" for s in disturbed[:_SHOWN]]
        return ["\n".join(lines)]
    if any(s.soaked(now) for s in soaks):
        return []
    if not soaks:
        return [
            f"soak: no audit says when {flag.name} reached {mode} at "
            + ", ".join(place(k[0], k[1], names) for k in unexplained[:_SHOWN])
            + f" (written outside the CLI?): set it again with {_cmd(flag)} set to start its soak"
        ]
    first_ends = min(soaks, key=lambda s: s.ends)
    return [
        f"soak: the narrower flip has not soaked yet: {first_ends.describe(now)} "
        f"(soak {soak_seconds} s: lakehouse soak show)"
    ]


def _order_blockers(conn, flag: Flag, scope: Scope, soak_seconds: int, now: datetime, names: dict) -> list[str]:
    earlier = earlier_writers(flag.name)
    if not earlier:
        return []
    stored = stored_overrides(conn, WRITE, earlier)
    history = audit_history(conn, WRITE, earlier) if soak_seconds > 0 else {}
    where = "globally" if scope.scope == GLOBAL else f"at {place(scope.scope, scope.scope_id, names)}"
    flag_opt = "" if scope.scope == GLOBAL else f" --{scope.scope} {scope.scope_id}"
    order = " → ".join(" / ".join(t) for t in WRITER_ORDER)
    reasons = []
    for name in earlier:
        e = WRITERS[name]
        m, key = _scope_resolve(e, stored[name], scope)
        if m != "iceberg_native":
            reasons.append(
                f"writer order ({order}): {name} is still {m} {where}; widen it first "
                f"(lakehouse write-flags set {name} iceberg_native{flag_opt}), let it soak, then "
                f"{flag.name}"
            )
            continue
        if soak_seconds > 0:
            s = _soak_of(conn, e, history[name], stored[name], key, "iceberg_native", scope, soak_seconds, names)
            if s is None:
                reasons.append(
                    f"writer order: no audit says when {name} reached iceberg_native {where}: set it "
                    "again with lakehouse write-flags set to start its soak"
                )
            elif not s.soaked(now):
                reasons.append(f"writer order: soak between writers — {s.describe(now)}; then {flag.name}")
    return reasons
