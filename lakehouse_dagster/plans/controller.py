"""The controller's steps: what each live plan does next, from its state in Postgres and its runs' outcomes. The
``rollout_controller`` sensor calls ``tick``, makes the ``RunAsk``s run requests (dagster/defs/plans/; no Dagster here).

A stage goes: waiting (an approval, its window) → flipping (the existing flip job, one run per flag change) →
soaking (incidents checked every tick) → analyzing (a canary run over a sample of the stage's datasets, then its
verdicts) → the next stage, or finished. Fail → abort: every flag key the plan set goes back to its value before
the plan, through the gated set/clear, audited ``rollout <id> aborted: <reason>``. A MISMATCH since the plan started,
on a dataset it moved or covers, fails it in every phase (flipping: before a flip is asked for again), whoever
rolled the dataset back first: a plan never widens past one.

A writer plan's last stage may be ``complete``: waiting (its approval, always) → completing (the ``complete`` job's
run over every dataset the stages before it moved: runbooks/complete.py, its own conditions checked per dataset) →
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
from collections.abc import Callable

import psycopg

from lakehouse_dagster.core.failpoints import failpoint
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.flags.completed import COMPLETE as COMPLETE_MARK
from lakehouse_dagster.flags.completed import completed_marks
from lakehouse_dagster.flags.gates import effects
from lakehouse_dagster.flags.overrides import DATASET, Scope
from lakehouse_dagster.flags.registry import READ, WRITE, get_flag, rank
from lakehouse_dagster.flags.reverse_setting import reverse_settings, set_reverse
from lakehouse_dagster.flags.soak_setting import current_soak
from lakehouse_dagster.flags.widen import scope_mode
from lakehouse_dagster.plans import analysis, store
from lakehouse_dagster.plans.abort import restore
from lakehouse_dagster.plans.render import effective_soak
from lakehouse_dagster.plans.spec import COMPLETE, SHADOW, Plan, Stage, format_duration
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

log = logging.getLogger("lakehouse_dagster.plans")

READ_FLIP, WRITE_FLIP, SET_FLAG, ANALYSIS = "read_flip", "write_flip", "set_flag", "rollout_analysis"
COMPLETE_JOB = "complete"
IN_FLIGHT, SUCCEEDED, FAILED = "in-flight", "succeeded", "failed"
_MAX_TRANSITIONS = 4  # per plan per tick: a passed stage starts the next one in the same tick


@dataclasses.dataclass(frozen=True)
class RunAsk:
    """A run the controller wants: the Dagster glue makes it a RunRequest (run key = ``run_key``)."""

    plan_id: uuid.UUID
    step_key: str
    job: str  # read_flip | write_flip | set_flag | rollout_analysis | complete
    params: dict  # the job's parameters (the glue maps them to its run config)

    @property
    def run_key(self) -> str:
        return f"rollout:{self.plan_id}:{self.step_key}"


@dataclasses.dataclass(frozen=True)
class RunState:
    run_id: str
    status: str  # in-flight | succeeded | failed
    message: str | None = None  # why it failed (the step's refusal)


# plan id → {step key: the latest run of that step}
RunLookup = Callable[[uuid.UUID], dict[str, RunState]]


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


class _Step:
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
        armed = self.arm_reverse(moving) if self.plan.kind == WRITE and stage.kind != SHADOW else []
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
        for d in off:
            set_reverse(
                self.conn,
                True,
                dataset=d,
                note=f"rollout {self.p.id} stage {self.p.stage + 1}: reverse armed before the flip"[:1000],
                actor=f"{self.settings.actor} (rollout {self.p.short})",
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

    # -- completing: the complete run ------------------------------------------------------------------------------

    def start_complete(self, stage: Stage) -> tuple[list[RunAsk], bool]:
        """The complete stage's first run, over every dataset the stages before it moved and not complete yet."""
        n = self.p.stage + 1
        moved = store.moved_before(self.conn, self.p.id, self.p.stage)
        marks = completed_marks(self.conn, moved)
        left = [d for d in moved if d not in marks or marks[d].status != COMPLETE_MARK]
        if stage.max_datasets is not None and len(left) > stage.max_datasets:
            self.pause(
                f"stage {n} would complete {len(left)} datasets, above its max_datasets {stage.max_datasets}; "
                "complete some by hand (lakehouse write-flags complete --dataset <id>) and resume, or abort"
            )
            return [], False
        store.update_stage(self.conn, self.p.id, self.p.stage, started_at=self.now)
        store.update(self.conn, self.p.id, phase=COMPLETING, blocking=None)
        store.event(
            self.conn,
            self.p.id,
            store.STAGE_STARTED,
            stage=self.p.stage,
            reason=f"stage {n} (complete): retiring the Postgres rows of {len(left)} of the {len(moved)} dataset(s) "
            "the plan moved",
            detail={"datasets": [str(d) for d in left], "complete_already": len(moved) - len(left)},
        )
        self.say(f"stage {n} started: complete of {len(left)} dataset(s)")
        if not left:
            return self.finish_complete(stage, moved), True
        return [self.ask_complete(stage, left, 1)], False

    def ask_complete(self, stage: Stage, ids: list[uuid.UUID], attempt: int) -> RunAsk:
        key = f"stage{self.p.stage}:complete:{attempt}"
        params = {
            "dataset_ids": [str(d) for d in ids],
            "export_to": stage.export_to,
            "note": f"rollout {self.p.id} stage {self.p.stage + 1} (complete)"[:1000],
            "kind": self.plan.kind,
            "name": self.plan.name,
        }
        store.add_step(self.conn, self.p.id, key, self.p.stage, "complete", COMPLETE_JOB, params, ids)
        store.set_blocking(
            self.conn, self.p, f"complete run {attempt} of stage {self.p.stage + 1} over {len(ids)} dataset(s)"
        )
        return RunAsk(self.p.id, key, COMPLETE_JOB, params)

    def completing(self, stage: Stage) -> tuple[list[RunAsk], bool]:
        """Wait for the complete run; then every dataset complete → the stage passes, else pause naming why. A
        resumed plan whose last run has ended asks again over the datasets still not complete."""
        if self.check_mismatches():  # the abort waits for a complete run in flight, then restores what it can
            return self.aborting(), False
        n = self.p.stage + 1
        runs = store.steps(self.conn, self.p.id, self.p.stage, "complete")
        last = runs[-1]
        moved = store.moved_before(self.conn, self.p.id, self.p.stage)
        marks = completed_marks(self.conn, moved)
        left = [d for d in moved if d not in marks or marks[d].status != COMPLETE_MARK]
        if last.status != "requested":  # decided already (it paused): the operator resumed it
            if not left:
                return self.finish_complete(stage, moved), True
            return [self.ask_complete(stage, left, len(runs) + 1)], False
        r = self.runs.get(last.step_key)
        if r is None:
            return [RunAsk(self.p.id, last.step_key, last.job, last.config)], False  # asked before, not launched
        if r.status == IN_FLIGHT:
            return [], False
        store.finish_step(self.conn, self.p.id, last.step_key, r.status, r.run_id, r.message)
        if not left:
            return self.finish_complete(stage, moved), True
        why = _first_line(r.message) if r.status == FAILED and r.message else "no refusal recorded"
        self.pause(
            f"stage {n} (complete): {len(left)} of {len(moved)} dataset(s) not complete after run {r.run_id[:8]}: "
            f"{why}; settle what it names, then lakehouse rollout resume {self.p.id} (it completes the rest; "
            "lakehouse write-flags complete --status shows each dataset)"
        )
        return [], False

    def finish_complete(self, stage: Stage, moved: list[uuid.UUID]) -> list[RunAsk]:
        return self.pass_stage(
            stage,
            analysis.Outcome(
                analysis.PASS,
                f"every dataset the plan moved ({len(moved)}) is complete: its Postgres rows are retired and Iceberg "
                "alone holds it",
                {"completed": [str(d) for d in moved]},
            ),
        )

    # -- soaking and analyzing -----------------------------------------------------------------------------------

    def check_mismatches(self, *, upcoming: bool = False) -> bool:
        """Abort on a MISMATCH since the plan started, on a dataset it moved or its stages cover (``upcoming``: also
        the scopes of the stage about to start); True when it did. Also while the stage waits or completes: a
        dataset rolled back (by auto-rollback, by an operator) is no longer moved, nor in a later analysis."""
        scopes: list[tuple[str, uuid.UUID | None]] = []
        if upcoming:
            for c in self.p.rendered["stages"][self.p.stage]["changes"]:
                scopes.append((c["scope"], uuid.UUID(c["scope_id"]) if c["scope_id"] else None))
        found = analysis.mismatches(self.conn, self.p.id, scopes)
        if found is None:
            return False
        self.begin_abort(f"stage {self.p.stage + 1}: {found.reason}")
        return True

    def check_incidents(self, stage: Stage, row: store.StageRow, *, native_safety: bool = False) -> bool:
        """Abort on an incident since the stage flipped; True when it did."""
        found = analysis.incidents(
            self.conn,
            self.p.id,
            self.plan.kind,
            self.plan.name,
            row.flipped_at or self.now,
            stage.analysis,
            self.settings.wedged_after_seconds,
            native_safety=native_safety,
        )
        if found is None:
            return False
        self.begin_abort(f"stage {self.p.stage + 1}: {found.reason}")
        return True

    def soaking(self, stage: Stage) -> tuple[list[RunAsk], bool]:
        row = store.stage_row(self.conn, self.p.id, self.p.stage)
        if self.check_incidents(stage, row):
            return self.aborting(), False
        soak, _ = effective_soak(stage, current_soak(self.conn, self.settings))
        assert row.flipped_at is not None
        ends = row.flipped_at + dt.timedelta(seconds=soak)
        if stage.kind == SHADOW:
            return self.shadow(stage, row, ends)
        if self.now < ends:
            left = format_duration((ends - self.now).total_seconds())
            store.set_blocking(self.conn, self.p, f"soaking until {ends:%Y-%m-%d %H:%M:%S} UTC ({left} left)")
            return [], False
        if row.moved_count == 0:  # every change was skipped (each dataset already there): nothing to analyse
            return self.pass_stage(stage, analysis.Outcome(analysis.PASS, "it moved no Iceberg-tabular dataset")), True
        return [self.ask_analysis(stage, row, 1)], False

    def ask_analysis(self, stage: Stage, row: store.StageRow, attempt: int) -> RunAsk:
        sample = store.stage_sample(self.conn, self.p.id, self.p.stage, stage.analysis.sample)
        key = f"stage{self.p.stage}:analysis:{attempt}"
        params = {
            "plan_id": str(self.p.id),
            "stage": self.p.stage,
            "dataset_ids": sorted(str(i) for i in sample),
            "kind": self.plan.kind,
            "name": self.plan.name,
        }
        store.add_step(self.conn, self.p.id, key, self.p.stage, "analysis", ANALYSIS, params, sample)
        store.update(
            self.conn, self.p.id, phase=ANALYZING, blocking=f"analysis run {attempt} of stage {self.p.stage + 1}"
        )
        self.say(f"stage {self.p.stage + 1}: analysis {attempt} over {len(sample)} dataset(s)")
        return RunAsk(self.p.id, key, ANALYSIS, params)

    def analyzing(self, stage: Stage) -> tuple[list[RunAsk], bool]:
        row = store.stage_row(self.conn, self.p.id, self.p.stage)
        if self.check_incidents(stage, row):
            return self.aborting(), False
        runs = store.steps(self.conn, self.p.id, self.p.stage, "analysis")
        last = runs[-1]
        attempt = len(runs)
        if last.status == "requested":
            r = self.runs.get(last.step_key)
            if r is None:
                return [RunAsk(self.p.id, last.step_key, last.job, last.config)], False
            if r.status == IN_FLIGHT:
                return [], False
            store.finish_step(self.conn, self.p.id, last.step_key, r.status, r.run_id, r.message)
            if self.plan.kind != READ and self.check_incidents(stage, row, native_safety=True):
                return self.aborting(), False
            found = analysis.verdicts(self.conn, r.run_id, self.plan.kind, stage.analysis, len(last.moved))
            if r.status == FAILED and found.outcome != analysis.FAIL:  # a MISMATCH fails the run too: that decides
                found = analysis.Outcome(
                    analysis.INCONCLUSIVE,
                    f"the analysis run {r.run_id[:8]} failed: {_first_line(r.message or 'no reason recorded')}",
                )
            return self.decide(stage, row, found, attempt)
        # the last analysis was inconclusive: ask again once retry_every has passed
        assert last.finished_at is not None
        if self.now - last.finished_at >= dt.timedelta(seconds=stage.analysis.retry_every):
            return [self.ask_analysis(stage, row, attempt + 1)], False
        return [], False

    def decide(self, stage: Stage, row: store.StageRow, found: analysis.Outcome, attempt: int):
        n = self.p.stage + 1
        if found.outcome == analysis.FAIL:
            self.begin_abort(f"stage {n}: {found.reason}")
            return self.aborting(), False
        if found.outcome == analysis.PASS:
            return self.pass_stage(stage, found), True
        return self.inconclusive(stage, row, found.reason), False

    def inconclusive(self, stage: Stage, row: store.StageRow, reason: str) -> list[RunAsk]:
        since = row.inconclusive_since or self.now
        if row.inconclusive_since is None:
            store.update_stage(self.conn, self.p.id, self.p.stage, inconclusive_since=since)
        if self.now - since >= dt.timedelta(seconds=stage.analysis.pause_after):
            self.pause(
                f"stage {self.p.stage + 1} inconclusive for {format_duration((self.now - since).total_seconds())} "
                f"(pause_after {format_duration(stage.analysis.pause_after)}): {reason}"
            )
            return []
        store.set_blocking(self.conn, self.p, f"inconclusive, retrying every {stage.analysis.retry_every}s: {reason}")
        return []

    def shadow(self, stage: Stage, row: store.StageRow, ends: dt.datetime) -> tuple[list[RunAsk], bool]:
        assert row.flipped_at is not None
        found, c = analysis.shadow(self.conn, self.plan.name, row.flipped_at, stage.analysis)
        if found is not None and found.outcome == analysis.FAIL:
            self.begin_abort(f"stage {self.p.stage + 1}: {found.reason}")
            return self.aborting(), False
        if self.now < ends:
            left = format_duration((ends - self.now).total_seconds())
            store.set_blocking(
                self.conn, self.p, f"shadow soak until {ends:%H:%M:%S} UTC ({left} left); {c.describe()}"
            )
            return [], False
        if found is None:
            need = (
                f"{c.counted} of {stage.analysis.min_reads} shadow read(s) counted (compared at caught-up versions, "
                "or failed on the Iceberg side)"
            )
            return self.inconclusive(stage, row, need), False
        return self.pass_stage(stage, found), True

    def pass_stage(self, stage: Stage, found: analysis.Outcome) -> list[RunAsk]:
        n = self.p.stage + 1
        store.update_stage(self.conn, self.p.id, self.p.stage, passed_at=self.now, inconclusive_since=None)
        store.event(
            self.conn,
            self.p.id,
            store.STAGE_PASSED,
            stage=self.p.stage,
            reason=f"stage {n} ({stage.describe()}) passed: {found.reason}",
            detail=found.detail,
        )
        self.say(f"stage {n} passed: {found.reason}")
        if n == len(self.plan.stages):
            store.update(self.conn, self.p.id, state=store.FINISHED, phase=WAITING, blocking=None, ended_at=self.now)
            store.event(
                self.conn,
                self.p.id,
                store.FINISHED_EVENT,
                stage=self.p.stage,
                reason=f"{self.plan.name} is {self.plan.mode} at every stage of the plan"
                + (", and every dataset it moved is complete" if stage.kind == COMPLETE else ""),
            )
            self.say("finished")
        else:
            store.update(self.conn, self.p.id, stage=n, phase=WAITING, blocking=None)
        return []

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
        restored = restore(self.conn, self.settings, self.p)
        self.say(
            f"aborted: {len(restored.restored)} flag key(s) restored"
            + (f", {len(restored.refused)} refused by a gate" if restored.refused else "")
        )
        return []


def _first_line(text: str | None) -> str:
    """A refusal's headline and its first reason (a gate's refusal lists the datasets on the lines below)."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return " ".join(lines[:2])[:500]
