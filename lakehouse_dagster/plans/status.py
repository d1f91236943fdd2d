"""Each plan as an operator asks about it: its stage, the next action, what blocks it, and its history. `lakehouse
rollout status` and the migration overview call these same functions (the overview: ``live_statuses``)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid

import psycopg

from lakehouse_dagster.plans import store
from lakehouse_dagster.plans.analysis import consistency
from lakehouse_dagster.plans.spec import COMPLETE, SHADOW
from lakehouse_dagster.plans.store import (
    ABORTED,
    ABORTING,
    ANALYZING,
    COMPLETING,
    FINISHED,
    FLIPPING,
    LIVE,
    PAUSED,
    SOAKING,
)


@dataclasses.dataclass
class PlanStatus:
    id: uuid.UUID
    kind: str
    name: str
    mode: str
    state: str  # active | paused | aborting | aborted | finished
    stage: int  # 1-based
    stages: int
    stage_what: str
    phase: str
    next_action: str
    blocking: str | None
    reason: str | None
    datasets_moved: int
    created_by: str
    created_at: dt.datetime
    updated_at: dt.datetime
    ended_at: dt.datetime | None
    shadow: dict | None = None  # a shadow stage: the consistency so far
    history: list[dict] = dataclasses.field(default_factory=list)

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["id"] = str(self.id)
        for e in d["history"]:
            e["plan_id"] = str(e["plan_id"])
        return d

    def stage_text(self) -> str:
        """The plan's stage; a plan that ended says how (a finished plan is in no stage and waits for nothing)."""
        if self.state == FINISHED:
            return f"all {self.stages} stage(s) passed"
        if self.state == ABORTED:
            return f"aborted in stage {self.stage} of {self.stages} ({self.stage_what})"
        return f"{self.stage} of {self.stages} ({self.stage_what}, {self.phase})"

    def headline(self) -> str:
        ended = f" {self.ended_at:%Y-%m-%d %H:%M:%S} UTC" if self.ended_at else ""
        if self.state == FINISHED:
            return f"finished{ended}, {self.stage_text()}; {self.datasets_moved} dataset(s) moved"
        if self.state == ABORTED:
            where = f"stage {self.stage} of {self.stages} ({self.stage_what})"
            return f"aborted{ended} in {where}; {self.datasets_moved} dataset(s) had moved"
        return f"{self.state}, stage {self.stage_text()}; {self.datasets_moved} dataset(s) moved so far"

    def lines(self, *, history: bool = True) -> list[str]:
        flag = "reader" if self.kind == "read" else "writer"
        out = [f"plan {self.id}: {flag} {self.name} → {self.mode}: {self.headline()}", f"  next: {self.next_action}"]
        if self.blocking:
            out.append(f"  blocked by: {self.blocking}")
        if self.reason and self.reason != self.blocking:
            out.append(f"  why: {self.reason}")
        if self.shadow:
            out.append(f"  shadow reads: {self.shadow['text']}")
        if history:
            out.append("  history:")
            for e in self.history:
                stage = f" stage {e['stage'] + 1}" if e["stage"] is not None else ""
                who = f" by {e['actor']}" if e["actor"] else ""
                out.append(
                    f"    {e['at']:%Y-%m-%d %H:%M:%S} {e['event']}{stage}{who}"
                    + (f": {e['reason']}" if e["reason"] else "")
                )
        return out


def _next_action(p: store.PlanRow, stage_row: store.StageRow | None, settings_soak: int) -> str:
    plan = p.plan
    n = p.stage + 1
    if p.state == FINISHED:
        return "none: finished"
    if p.state == ABORTED:
        return "none: aborted; every flag the plan set was restored, but for what its aborted event names (see history)"
    if p.state == ABORTING:
        return "the controller restores every flag the plan set to its value before the plan"
    if p.state == PAUSED:
        return f"lakehouse rollout resume {p.id} (or abort {p.id})"
    stage = plan.stages[p.stage]
    last = n == len(plan.stages)
    then = "the plan finishes" if last else f"stage {n + 1} ({plan.stages[n].describe()}) starts"
    if p.phase == FLIPPING:
        return f"the flip run(s) of stage {n} finish, then it soaks"
    if p.phase == SOAKING:
        if stage_row and stage_row.flipped_at:
            soak = max(stage.soak, settings_soak)
            ends = stage_row.flipped_at + dt.timedelta(seconds=soak)
            what = "its shadow reads are counted" if stage.kind == SHADOW else "a canary analyses it"
            return f"stage {n} soaks until {ends:%Y-%m-%d %H:%M:%S} UTC, then {what}; pass → {then}"
        return f"stage {n} soaks, then its analysis; pass → {then}"
    if p.phase == COMPLETING:
        return (
            f"the complete run of stage {n} retires the Postgres rows of the datasets the plan moved: every one "
            "complete → the plan finishes; a refusal → it pauses, naming why"
        )
    if p.phase == ANALYZING:
        return f"the analysis of stage {n} decides: pass → {then}; MISMATCH → abort; inconclusive → wait, then pause"
    if stage.approval and (stage_row is None or stage_row.approved_at is None):
        if stage.kind == COMPLETE:
            return (
                f"lakehouse rollout approve {p.id} (stage {n}: complete — retires the Postgres rows of every "
                "dataset the plan moved)"
            )
        return f"lakehouse rollout approve {p.id} (stage {n}: {stage.describe()})"
    return f"the controller starts stage {n} ({stage.describe()}) at its next tick"


def plan_status(
    conn: psycopg.Connection, plan_id: uuid.UUID, *, soak_seconds: int = 0, history: int = 50
) -> PlanStatus:
    """``soak_seconds``: the project's soak (settings), for when a stage's soak ends."""
    p = store.get(conn, plan_id)
    return _status(conn, p, soak_seconds, history)


def _status(conn: psycopg.Connection, p: store.PlanRow, soak_seconds: int, history: int) -> PlanStatus:
    plan = p.plan
    rows = store.stage_rows(conn, p.id)
    row = rows[p.stage] if p.stage < len(rows) else None
    moved = store.datasets_moved(conn, p.id)
    events = store.events(conn, p.id, limit=100_000)[-history:] if history else []
    stage = plan.stages[p.stage]
    shadow = None
    if stage.kind == SHADOW and row is not None and row.flipped_at is not None:
        c = consistency(conn, p.name, row.flipped_at)
        shadow = {
            "compared": c.compared,
            "matched": c.matched,
            "errors": c.errors,
            "rate": c.rate,
            "skipped": c.skipped,
            "first_mismatch": c.first_mismatch,
            "text": c.describe(),
        }
    return PlanStatus(
        id=p.id,
        kind=p.kind,
        name=p.name,
        mode=p.mode,
        state=p.state,
        stage=p.stage + 1,
        stages=len(plan.stages),
        stage_what=stage.describe(),
        phase=p.phase,
        next_action=_next_action(p, row, soak_seconds),
        blocking=p.blocking,
        reason=p.reason,
        datasets_moved=moved,
        created_by=p.created_by,
        created_at=p.created_at,
        updated_at=p.updated_at,
        ended_at=p.ended_at,
        shadow=shadow,
        history=events,
    )


def live_statuses(conn: psycopg.Connection, *, soak_seconds: int = 0, history: int = 5) -> list[PlanStatus]:
    """Every plan that is not over (active, paused, aborting), newest first: what the overview shows."""
    return [_status(conn, p, soak_seconds, history) for p in store.plans(conn, LIVE)]


def recent_statuses(
    conn: psycopg.Connection, *, soak_seconds: int = 0, limit: int = 20, history: int = 0
) -> list[PlanStatus]:
    return [_status(conn, p, soak_seconds, history) for p in store.plans(conn, None, limit)]
