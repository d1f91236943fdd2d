"""The controller's soaking and analyzing phases (plans/controller.py): incidents and MISMATCHes checked every tick, the
soak, the analysis runs and their verdicts, a shadow stage's comparison, and a stage that passes.
"""

from __future__ import annotations

import datetime as dt
import uuid

from lakehouse_dagster.flags.registry import READ
from lakehouse_dagster.flags.soak_setting import current_soak
from lakehouse_dagster.plans import analysis, store
from lakehouse_dagster.plans.render import effective_soak
from lakehouse_dagster.plans.spec import COMPLETE, SHADOW, Stage, format_duration
from lakehouse_dagster.plans.steps import (
    ANALYSIS,
    FAILED,
    IN_FLIGHT,
    RunAsk,
    StepState,
    _first_line,
)
from lakehouse_dagster.plans.store import (
    ANALYZING,
    WAITING,
)


class _Soaking(StepState):
    """A step's soaking and analyzing phases (mixed into plans/controller.py's ``_Step``)."""

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
            self.settings.mirror.wedged_after_seconds,
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
