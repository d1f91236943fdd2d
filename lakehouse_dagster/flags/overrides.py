"""Runtime overrides (global / workspace / dataset) and their append-only audit.

Every set and clear validates everything first (name, mode, ceiling, scope, that the dataset or
workspace exists) and only then writes the override and its audit row in one transaction, so a
refusal writes nothing. The CLI and the Dagster jobs both call these functions.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

import psycopg

from lakehouse_dagster.core.db import fetch_one
from lakehouse_dagster.core.errors import BadInput, NotFound
from lakehouse_dagster.core.ids import parse_uuid
from lakehouse_dagster.flags import overrides_store
from lakehouse_dagster.flags.lifecycle_facts import derive, scope_ids
from lakehouse_dagster.flags.registry import READ, Flag, check_kind, check_mode, get_flag
from lakehouse_dagster.flags.resolver import invalidate_local
from lakehouse_dagster.lifecycle import READER_FLAG, WRITER_FLAG, transition
from lakehouse_dagster.tracking import datasets as app_tables
from lakehouse_dagster.tracking.datasets import lookup

GLOBAL = "global"
WORKSPACE = "workspace"
DATASET = "dataset"
SCOPES = (DATASET, WORKSPACE, GLOBAL)  # most specific first


@dataclasses.dataclass(frozen=True)
class Scope:
    scope: str
    scope_id: uuid.UUID | None

    def __str__(self) -> str:
        return self.scope if self.scope_id is None else f"{self.scope} {self.scope_id}"


@dataclasses.dataclass(frozen=True)
class Override:
    kind: str
    name: str
    scope: str
    scope_id: uuid.UUID | None
    mode: str
    note: str | None
    set_by: str
    set_at: datetime


@dataclasses.dataclass(frozen=True)
class AuditEntry:
    id: int
    at: datetime
    action: str
    kind: str
    name: str
    scope: str
    scope_id: uuid.UUID | None
    before_mode: str | None
    after_mode: str | None
    note: str | None
    actor: str


@dataclasses.dataclass(frozen=True)
class Change:
    """What a set or clear did: the audit row it wrote (None when a clear found nothing to drop)."""

    flag: Flag
    scope: Scope
    before: str | None
    after: str | None
    audit: AuditEntry | None

    @property
    def changed(self) -> bool:
        return self.audit is not None


# (conn, flag, scope, new mode or None for a clear) → None, or raises to refuse the change.
Guard = Callable[[psycopg.Connection, Flag, "Scope", "str | None"], None]


def parse_scope(dataset: object = None, workspace: object = None) -> Scope:
    """--dataset / --workspace / neither (global); both at once is refused."""
    if dataset not in (None, "") and workspace not in (None, ""):
        raise BadInput("give either --dataset or --workspace, not both (no scope = global)")
    if dataset not in (None, ""):
        return Scope(DATASET, parse_uuid(dataset, "dataset id"))
    if workspace not in (None, ""):
        return Scope(WORKSPACE, parse_uuid(workspace, "workspace id"))
    return Scope(GLOBAL, None)


def require_target(conn: psycopg.Connection, scope: Scope) -> None:
    if scope.scope == DATASET:
        if not lookup.dataset_exists(conn, scope.scope_id):
            raise NotFound(f"dataset {scope.scope_id} does not exist; check the id (nothing was changed)")
    elif scope.scope == WORKSPACE:
        if not app_tables.workspace_exists(conn, scope.scope_id):
            raise NotFound(f"workspace {scope.scope_id} does not exist; check the id (nothing was changed)")


def _check_note(note: str | None) -> str | None:
    if note is None:
        return None
    note = note.strip()
    if len(note) > 1000:
        raise BadInput(f"--note is {len(note)} characters; keep it under 1000")
    return note or None


def _check_actor(actor: str) -> str:
    if not actor or not actor.strip():
        raise BadInput("no actor: set LAKEHOUSE_ACTOR to who is making the change")
    return actor.strip()


_AUDIT_INSERT = (
    "insert into lakehouse_flag_audit (action, kind, name, scope, scope_id, before_mode, after_mode, note, actor)"
    " values (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
    " returning id, at, action, kind, name, scope, scope_id, before_mode, after_mode, note, actor"
)


def _lock_key(conn: psycopg.Connection, flag: Flag, scope: Scope) -> str | None:
    """Serialise writers of one override key so the audit's `before` is exact; returns the current mode."""
    key = f"lakehouse_flag:{flag.kind}:{flag.name}:{scope.scope}:{scope.scope_id or ''}"
    conn.execute("select pg_advisory_xact_lock(hashtextextended(%s, 0))", (key,))
    return overrides_store.current_mode(conn, flag.kind, flag.name, scope.scope, scope.scope_id)


def _verb(flag: Flag) -> str:
    return "flags" if flag.kind == READ else "write-flags"


def _moving(conn: psycopg.Connection, flag: Flag, scope: Scope, actor: str, what: str):
    """The change as a lifecycle transition (lifecycle/transition.py): under the lifecycle lock, checked against
    the table of transitions, recorded with its effect in one transaction."""
    return transition(
        conn,
        READER_FLAG if flag.kind == READ else WRITER_FLAG,
        dataset_ids=[scope.scope_id]
        if scope.scope == DATASET and scope.scope_id
        else lambda c: scope_ids(c, scope.scope, scope.scope_id),
        wide=scope.scope != DATASET,
        derive=derive,
        actor=actor,
        what=what,
    )


def set_override(
    conn: psycopg.Connection,
    kind: str,
    name: str,
    mode: str,
    *,
    dataset: object = None,
    workspace: object = None,
    note: str | None = None,
    actor: str,
    guard: Guard | None = None,
) -> Change:
    """Set (or replace) one override and audit it; refuses bad input before writing anything.
    ``guard(conn, flag, scope, mode)`` runs inside the write's transaction and may refuse (gates.py)."""
    flag = get_flag(kind, name)
    check_mode(flag, mode)
    scope = parse_scope(dataset, workspace)
    note = _check_note(note)
    actor = _check_actor(actor)
    require_target(conn, scope)
    with _moving(conn, flag, scope, actor, f"{_verb(flag)} set {flag.name} {mode} ({scope})"):
        if guard is not None:
            guard(conn, flag, scope, mode)
        before = _lock_key(conn, flag, scope)
        overrides_store.upsert(conn, flag.kind, flag.name, scope.scope, scope.scope_id, mode, note, actor)
        row = fetch_one(
            conn.execute(
                _AUDIT_INSERT, ("set", flag.kind, flag.name, scope.scope, scope.scope_id, before, mode, note, actor)
            ),
            "the audit row just inserted",
        )
    invalidate_local()
    return Change(flag, scope, before, mode, AuditEntry(*row))


def clear_override(
    conn: psycopg.Connection,
    kind: str,
    name: str,
    *,
    dataset: object = None,
    workspace: object = None,
    note: str | None = None,
    actor: str,
    guard: Guard | None = None,
) -> Change:
    """Drop one override (back to the next scope or the default). Clearing nothing is a no-op, not audited.

    The dataset/workspace need not exist any more, so an orphaned override can still be cleared.
    """
    flag = get_flag(kind, name)
    scope = parse_scope(dataset, workspace)
    note = _check_note(note)
    actor = _check_actor(actor)
    with _moving(conn, flag, scope, actor, f"{_verb(flag)} clear {flag.name} ({scope})"):
        if guard is not None:
            guard(conn, flag, scope, None)
        before = _lock_key(conn, flag, scope)
        if before is None:
            return Change(flag, scope, None, None, None)
        overrides_store.delete(conn, flag.kind, flag.name, scope.scope, scope.scope_id)
        row = fetch_one(
            conn.execute(
                _AUDIT_INSERT, ("clear", flag.kind, flag.name, scope.scope, scope.scope_id, before, None, note, actor)
            ),
            "the audit row just inserted",
        )
    invalidate_local()
    return Change(flag, scope, before, None, AuditEntry(*row))


def list_overrides(conn: psycopg.Connection, kind: str | None = None) -> list[Override]:
    """Every runtime override (of one kind, or both), including names the registry no longer knows."""
    return [Override(*r) for r in overrides_store.all_rows(conn, None if kind is None else check_kind(kind))]


def history(
    conn: psycopg.Connection,
    kind: str | None = None,
    name: str | None = None,
    *,
    dataset: object = None,
    workspace: object = None,
    limit: int = 50,
) -> list[AuditEntry]:
    """The audit, newest first, optionally narrowed to one flag and/or one scope."""
    if limit < 1:
        raise BadInput(f"--limit {limit} must be at least 1")
    where: list[str] = []
    params: list[Any] = []
    if kind is not None:
        where.append("kind = %s")
        params.append(check_kind(kind))
    if name is not None:
        where.append("name = %s")
        params.append(get_flag(kind, name).name if kind else name)
    if dataset not in (None, "") or workspace not in (None, ""):
        scope = parse_scope(dataset, workspace)
        where.append("scope = %s and scope_id = %s")
        params += [scope.scope, scope.scope_id]
    sql = (
        "select id, at, action, kind, name, scope, scope_id, before_mode, after_mode, note, actor"
        " from lakehouse_flag_audit"
    )
    if where:
        sql += " where " + " and ".join(where)
    sql += " order by id desc limit %s"
    params.append(limit)
    return [AuditEntry(*r) for r in conn.execute(sql, params).fetchall()]


def audit_steps(conn: psycopg.Connection, kind: str, names: list[str]) -> list[tuple]:
    """(id, at, name, scope, scope id, mode after: None for a clear) of every audit row of the flags, oldest first
    (the soak replays them: flags/soak.py)."""
    return conn.execute(
        "select id, at, name, scope, scope_id, after_mode from lakehouse_flag_audit"
        " where kind = %s and name = any(%s) order by id",
        (kind, names),
    ).fetchall()


def narrower_overrides(conn: psycopg.Connection, kind: str, name: str, scope: Scope) -> list[Override]:
    """The overrides of the same flag that still win over ``scope`` where they apply (the most specific wins):
    under global, every workspace and dataset override; under a workspace, those of its datasets. What an
    operator clearing ``scope`` must be told remains."""
    rows = overrides_store.narrower_rows(conn, check_kind(kind), name, scope.scope, scope.scope_id)
    return [Override(*r) for r in rows]


def remaining_lines(conn: psycopg.Connection, flag: Flag, left: list[Override]) -> list[str]:
    """After a clear: one line per narrower override still in effect (``narrower_overrides``), with the dataset's
    or workspace's name, and how to clear them — empty when none remain."""
    if not left:
        return []
    ids = [o.scope_id for o in left]
    names: dict = app_tables.dataset_and_workspace_names(conn, ids)
    counts = ", ".join(f"{n} {s} override(s)" for s in (WORKSPACE, DATASET) if (n := sum(o.scope == s for o in left)))
    verb = "flags" if flag.kind == "read" else "write-flags"
    lines = [f"{counts} of {flag.name} remain and still win where they apply:"]
    lines += [f"  {o.scope} {o.scope_id} ({names.get(o.scope_id, 'gone')}): {o.mode}" for o in left[:50]]
    if len(left) > 50:
        lines.append(f"  ... and {len(left) - 50} more (lakehouse {verb} list)")
    lines.append(f"  clear each with: lakehouse {verb} clear {flag.name} --<scope> <id>")
    return lines
