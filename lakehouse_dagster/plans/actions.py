"""What an operator does to plans, from the CLI or a Dagster job alike: dry-run, start, pause, resume, approve, abort.

Each validates first and writes nothing on bad input (one line: what was wrong, what to do); each change is one
transaction on the plan's row with an event naming the operator.
"""

from __future__ import annotations

import dataclasses
import uuid

import psycopg

from lakehouse_dagster.core.errors import BadInput
from lakehouse_dagster.core.settings import ProjectSettings, Settings
from lakehouse_dagster.plans import store
from lakehouse_dagster.plans.abort import Restored, restore
from lakehouse_dagster.plans.render import Rendered, check_startable, render
from lakehouse_dagster.plans.spec import Plan, load_plan
from lakehouse_dagster.plans.store import ABORTING, ACTIVE, FINISHED, PAUSED, WAITING, WARNING


def dry_run(conn: psycopg.Connection, settings: Settings, text: str, origin: str = "plan") -> Rendered:
    """The plan over the database as it is: every flag change in order with the datasets it moves; nothing written."""
    return render(conn, load_plan(text, origin), settings)


def start(
    conn: psycopg.Connection, settings: Settings, text: str, *, actor: str, origin: str = "plan"
) -> tuple[uuid.UUID, Rendered]:
    """Validate, render, refuse a plan a gate would stop (naming the gate), else store it for the controller."""
    plan: Plan = load_plan(text, origin)
    rendered = render(conn, plan, settings)
    check_startable(rendered)
    return store.create(conn, plan, rendered, source=text, actor=_actor(actor)), rendered


def _actor(actor: str) -> str:
    if not actor or not actor.strip():
        raise BadInput("no actor: set LAKEHOUSE_ACTOR to who is making the change")
    return actor.strip()


def _note(note: str | None) -> str | None:
    if note is not None and len(note) > 1000:
        raise BadInput(f"--note is {len(note)} characters; keep it under 1000")
    return (note or "").strip() or None


def pause(conn: psycopg.Connection, plan_id: uuid.UUID, *, actor: str, reason: str | None = None) -> store.PlanRow:
    actor, reason = _actor(actor), _note(reason)
    with conn.transaction():
        p = store.lock(conn, plan_id)
        assert p is not None
        if p.state != ACTIVE:
            raise BadInput(f"plan {p.id} is {p.state}, not active; nothing to pause")
        why = f"paused by {actor}" + (f": {reason}" if reason else "")
        store.update(conn, p.id, state=PAUSED, reason=why, blocking=why)
        store.event(conn, p.id, store.PAUSED_EVENT, stage=p.stage, severity=WARNING, reason=why, actor=actor)
    return store.get(conn, plan_id)


def resume(conn: psycopg.Connection, plan_id: uuid.UUID, *, actor: str, note: str | None = None) -> store.PlanRow:
    """Back to active where it paused; an inconclusive stage gets a fresh ``pause_after`` bound."""
    actor, note = _actor(actor), _note(note)
    with conn.transaction():
        p = store.lock(conn, plan_id)
        assert p is not None
        if p.state != PAUSED:
            raise BadInput(f"plan {p.id} is {p.state}, not paused; nothing to resume")
        store.update(conn, p.id, state=ACTIVE, reason=None, blocking=None)
        store.update_stage(conn, p.id, p.stage, inconclusive_since=None)
        store.event(conn, p.id, store.RESUMED, stage=p.stage, reason=note or f"resumed by {actor}", actor=actor)
    return store.get(conn, plan_id)


def approve(conn: psycopg.Connection, plan_id: uuid.UUID, *, actor: str, note: str | None = None) -> store.PlanRow:
    """Approve the stage the plan waits at (a stage with ``approval: true``); the controller starts it next tick."""
    actor, note = _actor(actor), _note(note)
    with conn.transaction():
        p = store.lock(conn, plan_id)
        assert p is not None
        if p.state not in (ACTIVE, PAUSED):
            raise BadInput(f"plan {p.id} is {p.state}; nothing to approve")
        stage = p.plan.stages[p.stage]
        row = store.stage_row(conn, p.id, p.stage)
        if p.phase != WAITING or not stage.approval or row.approved_at is not None:
            what = "its stage needs no approval" if not stage.approval else f"stage {p.stage + 1} is {p.phase}"
            if stage.approval and row.approved_at is not None:
                what = f"stage {p.stage + 1} was approved by {row.approved_by} already"
            raise BadInput(f"plan {p.id} is not waiting for an approval ({what}); nothing approved")
        now = store.db_now(conn)
        store.update_stage(conn, p.id, p.stage, approved_at=now, approved_by=actor, approval_note=note)
        store.update(conn, p.id, blocking=None)
        store.event(
            conn, p.id, store.APPROVED, stage=p.stage, reason=note or f"stage {p.stage + 1} approved", actor=actor
        )
    return store.get(conn, plan_id)


@dataclasses.dataclass
class AbortOutcome:
    plan: store.PlanRow
    restored: Restored | None  # None: left to the controller (a flip run may still be running)
    message: str


def abort(
    conn: psycopg.Connection, project: ProjectSettings, plan_id: uuid.UUID, *, actor: str, reason: str | None = None
) -> AbortOutcome:
    """Abort now when no flip run of the plan can still be running; otherwise mark it aborting and let the
    controller restore once those runs end (it knows their state; this process does not)."""
    actor, reason = _actor(actor), _note(reason)
    why = f"aborted by {actor}" + (f": {reason}" if reason else "")
    with conn.transaction():
        p = store.lock(conn, plan_id)
        assert p is not None
        if p.state not in (ACTIVE, PAUSED, ABORTING):
            raise BadInput(f"plan {p.id} is {p.state} already; nothing to abort")
        if p.state != ABORTING:
            store.update(conn, p.id, state=ABORTING, reason=why, blocking=None)
            store.event(conn, p.id, store.ABORTING_EVENT, stage=p.stage, severity=store.ERROR, reason=why, actor=actor)
            p = dataclasses.replace(p, state=ABORTING, reason=why)
        in_flight = [
            s
            for s in store.steps(conn, p.id, with_moved=False)
            if s.kind in store.RUN_STEP_KINDS and s.status == "requested"
        ]
        if in_flight:
            msg = (
                f"abort requested: {len(in_flight)} flip or complete run(s) of the plan may still be running; the "
                "rollout_controller restores every flag it set once they end (lakehouse rollout status shows it)"
            )
            return AbortOutcome(store.get(conn, plan_id), None, msg)
        restored = restore(conn, project, p)
    msg = f"aborted: {len(restored.restored)} flag key(s) restored to their value before the plan" + (
        f"; {len(restored.refused)} refused by a gate" if restored.refused else ""
    )
    return AbortOutcome(store.get(conn, plan_id), restored, msg)


def is_over(p: store.PlanRow) -> bool:
    return p.state in (FINISHED, store.ABORTED)
