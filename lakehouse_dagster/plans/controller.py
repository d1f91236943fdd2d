"""The controller's steps: what each live plan does next, from its state in Postgres and its runs' outcomes. The
``rollout_controller`` sensor calls ``tick``, makes the ``RunAsk``s run requests (dagster/defs/plans/; no Dagster here).

A stage goes: waiting (an approval, its window) → flipping (the existing flip job, one run per flag change) →
soaking (incidents checked every tick) → analyzing (a canary run over a sample of the stage's datasets, then its
verdicts) → the next stage, or finished. Fail → abort: every flag key the plan set goes back to its value before
the plan, through the gated set/clear, audited ``rollout <id> aborted: <reason>``. A MISMATCH since the plan started,
on a dataset it moved or covers, fails it in every phase (flipping: before a flip is asked for again), whoever
rolled the dataset back first: a plan never widens past one.

A writer plan's last stage may be ``complete``: waiting (its approval, always) → completing (the ``complete`` job's
run over every dataset the stages before it moved: runbooks/complete/, its own conditions checked per dataset) →
finished once every one of them is complete. A refusal pauses the plan, never aborts it: complete wrote nothing for
a refused dataset, and what it names (a soak not over, a parity not ok, a Postgres-locked consumer) is for the
operator to settle; resume asks for the run again over the datasets not complete yet.

Crash safety: each transition is one transaction holding the plan's row. A step's row (its run key) is written in
the transaction that moves the plan to flipping/analyzing, before the run is asked for; a tick that dies after
the commit asks again next tick under the same run key (Dagster deduplicates), a run that ended unseen is found by
its tags: a daemon killed anywhere resumes, and a flag change runs once.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import uuid

import psycopg

from lakehouse_dagster.core.errors import FlipRefused
from lakehouse_dagster.core.failpoints import failpoint
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.flags.gates import effects
from lakehouse_dagster.flags.overrides import DATASET, Scope
from lakehouse_dagster.flags.registry import READ, WRITE, get_flag, rank
from lakehouse_dagster.flags.reverse_setting import reverse_settings, set_reverse
from lakehouse_dagster.flags.widen import scope_mode
from lakehouse_dagster.plans import store
from lakehouse_dagster.plans.abort import restore
from lakehouse_dagster.plans.complete_steps import _Completing
from lakehouse_dagster.plans.soak_steps import _Soaking
from lakehouse_dagster.plans.spec import COMPLETE, SHADOW, Plan, Stage
from lakehouse_dagster.plans.steps import (
    ANALYSIS,
    COMPLETE_JOB,
    FAILED,
    IN_FLIGHT,
    READ_FLIP,
    SET_FLAG,
    SUCCEEDED,
    WRITE_FLIP,
    RunAsk,
    RunLookup,
    RunState,
    _first_line,
)
from lakehouse_dagster.plans.store import (
    ABORTING,
    ACTIVE,
    ANALYZING,
    COMPLETING,
    ERROR,
    FLIPPING,
    SOAKING,
    WAITING,
    WARNING,
    PlanRow,
)

# The controller's face: every name the Dagster glue and the tests import from plans.controller.
__all__ = [
    "ANALYSIS",
    "COMPLETE_JOB",
    "FAILED",
    "IN_FLIGHT",
    "READ_FLIP",
    "SET_FLAG",
    "SUCCEEDED",
    "WRITE_FLIP",
    "RunAsk",
    "RunLookup",
    "RunState",
    "TickResult",
    "advance",
    "tick",
]

log = logging.getLogger("lakehouse_dagster.plans")

_MAX_TRANSITIONS = 4  # per plan per tick: a passed stage starts the next one in the same tick


@dataclasses.dataclass
class TickResult:
    asks: list[RunAsk]
    live: int  # plans looked at
    lines: list[str]  # what happened, for the sensor's log


def tick(conn: psycopg.Connection, settings: Settings, lookup: RunLookup) -> TickResult:
    """Advance every active or aborting plan one step (or a few, when a stage passes); ``conn``: autocommit."""
    ids = store.plan_ids_in(conn, (ACTIVE, ABORTING))
    result = TickResult([], len(ids), [])
    for plan_id in ids:
        try:
            asks, lines = advance(conn, settings, plan_id, lookup)
        except Exception as exc:  # one plan's trouble must not hold the others back; it is retried next tick
            log.exception("rollout %s: the controller step failed", plan_id)
            result.lines.append(f"rollout {str(plan_id)[:8]}: controller step failed: {type(exc).__name__}: {exc}")
            continue
        result.asks += asks
        result.lines += lines
    return result


def advance(
    conn: psycopg.Connection, settings: Settings, plan_id: uuid.UUID, lookup: RunLookup
) -> tuple[list[RunAsk], list[str]]:
    """One plan's next step(s), each in its own transaction on the plan's row."""
    asks: list[RunAsk] = []
    lines: list[str] = []
    runs: dict[str, RunState] | None = None
    for _ in range(_MAX_TRANSITIONS):
        with conn.transaction():
            p = store.lock(conn, plan_id, wait=False)
            if p is None or p.state not in (ACTIVE, ABORTING):
                break  # another tick or command holds it, or it is paused / over
            if runs is None and (p.state == ABORTING or p.phase in (FLIPPING, ANALYZING, COMPLETING)):
                runs = lookup(plan_id)
            step = _Step(conn, settings, p, runs or {}, lines)
            new_asks, moved_on = step.run()
        asks += new_asks
        if new_asks:
            failpoint("rollout-after-step")  # the step rows are committed, the runs not yet asked for
        if not moved_on:
            break
        runs = None  # a new phase looks at its runs afresh
    return asks, lines


class _Step(_Soaking, _Completing):
    """One transition of one plan (inside its locked transaction)."""

    def __init__(self, conn, settings: Settings, p: PlanRow, runs: dict[str, RunState], lines: list[str]):
        self.conn, self.settings, self.p, self.runs, self.lines = conn, settings, p, runs, lines
        self.plan: Plan = p.plan
        self.now: dt.datetime = store.db_now(conn)

    def say(self, text: str) -> None:
        self.lines.append(f"rollout {self.p.short} ({self.plan.name}): {text}")

    def run(self) -> tuple[list[RunAsk], bool]:
        """(runs to ask for, whether the plan moved on and may take another step this tick)."""
        if self.p.state == ABORTING:
            return self.aborting(), False
        stage = self.plan.stages[self.p.stage]
        handler = {
            WAITING: self.waiting,
            FLIPPING: self.flipping,
            SOAKING: self.soaking,
            ANALYZING: self.analyzing,
            COMPLETING: self.completing,
        }
        return handler[self.p.phase](stage)

    # -- waiting: approval, window, then the stage's flag changes ------------------------------------------------

    def waiting(self, stage: Stage) -> tuple[list[RunAsk], bool]:
        if self.check_mismatches(upcoming=True):  # never widen past a MISMATCH, nor wait for an approval over one
            return self.aborting(), False
        row = store.stage_row(self.conn, self.p.id, self.p.stage)
        n = self.p.stage + 1
        if stage.approval and row.approved_at is None:
            if not store.has_event(self.conn, self.p.id, store.APPROVAL_NEEDED, self.p.stage):
                store.event(
                    self.conn,
                    self.p.id,
                    store.APPROVAL_NEEDED,
                    stage=self.p.stage,
                    severity=WARNING,
                    reason=f"stage {n} ({stage.describe()}) waits for an approval",
                )
                self.say(f"stage {n} needs an approval")
            store.set_blocking(
                self.conn, self.p, f"approval needed before stage {n}: lakehouse rollout approve {self.p.id}"
            )
            return [], False
        if stage.window and not stage.window.is_open(self.now):
            opens = stage.window.next_open(self.now)
            store.set_blocking(
                self.conn,
                self.p,
                f"outside its window ({stage.window.text}): stage {n} starts at {opens:%Y-%m-%d %H:%M} UTC",
            )
            return [], False
        return self.start_stage(stage)

    def start_stage(self, stage: Stage) -> tuple[list[RunAsk], bool]:
        if stage.kind == COMPLETE:
            return self.start_complete(stage)
        flag = get_flag(self.plan.kind, self.plan.name)
        changes = [c for c in self.p.rendered["stages"][self.p.stage]["changes"]]
        asks, total, moving = [], 0, []
        for c in changes:
            scope = Scope(c["scope"], uuid.UUID(c["scope_id"]) if c["scope_id"] else None)
            moved, datasets = effects(self.conn, flag, scope, c["mode"])
            tabular = [e.dataset_id for e in moved if datasets[e.dataset_id][3] == "tabular"]
            total += len(tabular)
            moving += tabular
            params = {
                "kind": self.plan.kind,
                "name": self.plan.name,
                "mode": c["mode"],
                "scope": c["scope"],
                "scope_id": c["scope_id"],
                "note": self.note(c["mode"]),
                "max_datasets": stage.max_datasets,
                "sample": stage.analysis.sample,
            }
            job = SET_FLAG if stage.kind == SHADOW else READ_FLIP if self.plan.kind == READ else WRITE_FLIP
            raises = scope.scope != DATASET and rank(flag.kind, scope_mode(self.conn, flag, scope)) < rank(
                flag.kind, c["mode"]
            )
            if not tabular and not raises:  # what the dry-run skipped as well: the flip job would say "nothing to flip"
                store.add_step(
                    self.conn,
                    self.p.id,
                    c["step_key"],
                    self.p.stage,
                    "flip",
                    job,
                    params,
                    [],
                    status=SUCCEEDED,
                    detail="skipped: moves no Iceberg-tabular dataset",
                )
                continue
            store.record_before(
                self.conn, self.p.id, self.plan.kind, self.plan.name, scope.scope, scope.scope_id, c["before"]
            )
            store.add_step(self.conn, self.p.id, c["step_key"], self.p.stage, "flip", job, params, tabular)
            asks.append(RunAsk(self.p.id, c["step_key"], job, params))
        if stage.max_datasets is not None and stage.kind != SHADOW and total > stage.max_datasets:
            # Nothing of the stage ran: every step this start wrote goes, the "skipped" ones too. A skipped row left
            # behind would stand for its change when the resumed stage needs a run for it after all (its scope moved
            # meanwhile): the stage would count nothing moved there, and the abort would not restore the key.
            store.delete_unstarted_steps(self.conn, self.p.id, self.p.stage, [c["step_key"] for c in changes])
            self.pause(
                f"stage {self.p.stage + 1} would move {total} datasets now, above its max_datasets "
                f"{stage.max_datasets}; abort, or resume once fewer would move"
            )
            return [], False
        try:
            armed = self.arm_reverse(moving) if self.plan.kind == WRITE and stage.kind != SHADOW else []
        except FlipRefused as exc:  # a dataset whose reverse the lifecycle keeps off (completing, complete)
            store.delete_unstarted_steps(self.conn, self.p.id, self.p.stage, [c["step_key"] for c in changes])
            self.pause(f"stage {self.p.stage + 1}: the reverse mirror cannot be armed before its flip: {exc}")
            return [], False
        store.update_stage(self.conn, self.p.id, self.p.stage, started_at=self.now)
        store.update(self.conn, self.p.id, phase=FLIPPING, blocking=None)
        store.event(
            self.conn,
            self.p.id,
            store.STAGE_STARTED,
            stage=self.p.stage,
            reason=f"stage {self.p.stage + 1} ({stage.describe()}): {len(asks)} flag change(s), {total} dataset(s)"
            + (f"; the reverse mirror armed for {len(armed)} dataset(s) whose reverse was off" if armed else ""),
            detail={"steps": [a.step_key for a in asks], "datasets": total, "reverse_armed": [str(d) for d in armed]},
        )
        self.say(f"stage {self.p.stage + 1} started: {len(asks)} run(s)")
        return asks, not asks  # nothing to run: flipping passes at once

    def arm_reverse(self, ids: list[uuid.UUID]) -> list[uuid.UUID]:
        """Before a writer stage's flip, as Vitess arms reverse replication before it switches writes: the reverse
        mirror on (dataset scope, audited) for each dataset it moves whose reverse resolves off, so that Postgres
        keeps every native row and an abort is a lossless rollback (``arm_reverse: false`` in the plan: left)."""
        if not self.plan.arm_reverse or not ids:
            return []
        setting = reverse_settings(self.conn, ids)
        off = [d for d in dict.fromkeys(ids) if d in setting and not setting[d].enabled]
        with self.conn.transaction():  # all or none: a refusal (the lifecycle's) leaves none armed
            for d in off:
                set_reverse(
                    self.conn,
                    True,
                    dataset=d,
                    note=f"rollout {self.p.id} stage {self.p.stage + 1}: reverse armed before the flip"[:1000],
                    actor=f"{self.settings.project.actor} (rollout {self.p.short})",
                )
        return off

    def note(self, mode: str) -> str:
        plan_note = f": {self.plan.note}" if self.plan.note else ""
        return f"rollout {self.p.id} stage {self.p.stage + 1} ({mode}){plan_note}"[:1000]

    # -- flipping: the flip runs ---------------------------------------------------------------------------------

    def flipping(self, stage: Stage) -> tuple[list[RunAsk], bool]:
        flips = store.steps(self.conn, self.p.id, self.p.stage, "flip", with_moved=False)
        again, failed = [], []
        for s in flips:
            if s.status != "requested":
                if s.status == FAILED:
                    failed.append(s)
                continue
            r = self.runs.get(s.step_key)
            if r is None:
                again.append(RunAsk(self.p.id, s.step_key, s.job, s.config))  # asked before, not launched: ask again
            elif r.status == SUCCEEDED:
                store.finish_step(self.conn, self.p.id, s.step_key, SUCCEEDED, r.run_id, None)
            elif r.status == FAILED:
                store.finish_step(self.conn, self.p.id, s.step_key, FAILED, r.run_id, r.message)
                failed.append(dataclasses.replace(s, run_id=r.run_id, detail=r.message))
        if again and self.check_mismatches(upcoming=True):  # a flip not launched yet never runs past a MISMATCH
            return self.aborting(), False
        if failed:
            s = failed[0]
            self.begin_abort(
                f"stage {self.p.stage + 1}: the {s.job} run {str(s.run_id or '')[:8]} failed"
                + (f": {_first_line(s.detail)}" if s.detail else "")
            )
            return self.aborting(), False
        pending = [
            s
            for s in store.steps(self.conn, self.p.id, self.p.stage, "flip", with_moved=False)
            if s.status == "requested"
        ]
        if pending:
            store.set_blocking(self.conn, self.p, f"waiting for {len(pending)} flip run(s) of stage {self.p.stage + 1}")
            return again, False
        moved = store.set_stage_moved(self.conn, self.p.id, self.p.stage)
        store.update_stage(self.conn, self.p.id, self.p.stage, flipped_at=self.now)
        store.update(self.conn, self.p.id, phase=SOAKING, blocking=None)
        store.event(
            self.conn,
            self.p.id,
            store.STAGE_FLIPPED,
            stage=self.p.stage,
            reason=f"stage {self.p.stage + 1} flipped {moved} dataset(s); soaking",
        )
        self.say(f"stage {self.p.stage + 1} flipped {moved} dataset(s)")
        return [], True

    # -- pause and abort -----------------------------------------------------------------------------------------

    def pause(self, reason: str) -> None:
        store.update(self.conn, self.p.id, state=store.PAUSED, reason=reason, blocking=reason)
        store.event(
            self.conn,
            self.p.id,
            store.PAUSED_EVENT,
            stage=self.p.stage,
            severity=WARNING,
            reason=reason,
            actor="rollout_controller",
        )
        self.say(f"paused: {reason}")

    def begin_abort(self, reason: str) -> None:
        store.update(self.conn, self.p.id, state=ABORTING, reason=reason, blocking=None)
        store.event(
            self.conn,
            self.p.id,
            store.ABORTING_EVENT,
            stage=self.p.stage,
            severity=ERROR,
            reason=reason,
            actor="rollout_controller",
        )
        self.p = dataclasses.replace(self.p, state=ABORTING, reason=reason)
        self.say(f"aborting: {reason}")

    def aborting(self) -> list[RunAsk]:
        """Wait until no flip run of the plan is in flight, then restore every flag key (plans/abort.py)."""
        pending = [
            s
            for s in store.steps(self.conn, self.p.id, with_moved=False)
            if s.kind in store.RUN_STEP_KINDS and s.status == "requested"
        ]
        waiting = []
        for s in pending:
            r = self.runs.get(s.step_key)
            if r is not None and r.status != IN_FLIGHT:
                store.finish_step(self.conn, self.p.id, s.step_key, r.status, r.run_id, r.message)
            elif r is not None:
                waiting.append(r.run_id)
            else:  # never launched (a tick died before asking): it will not be asked for now
                store.finish_step(self.conn, self.p.id, s.step_key, FAILED, None, "not launched: the plan aborted")
        if waiting:
            store.set_blocking(
                self.conn, self.p, f"aborting: waiting for run(s) {', '.join(w[:8] for w in waiting)} to end"
            )
            return []
        restored = restore(self.conn, self.settings.project, self.p)
        self.say(
            f"aborted: {len(restored.restored)} flag key(s) restored"
            + (f", {len(restored.refused)} refused by a gate" if restored.refused else "")
        )
        return []
