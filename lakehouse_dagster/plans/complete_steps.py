"""The controller's completing phase (plans/controller.py): a complete stage's run over every dataset the plan moved,
asked again after a resume, and the stage passed once every one of them is complete.
"""

from __future__ import annotations

import uuid

from lakehouse_dagster.flags.completed import COMPLETE as COMPLETE_MARK
from lakehouse_dagster.flags.completed import completed_marks
from lakehouse_dagster.plans import analysis, store
from lakehouse_dagster.plans.spec import Stage
from lakehouse_dagster.plans.steps import (
    COMPLETE_JOB,
    FAILED,
    IN_FLIGHT,
    RunAsk,
    StepState,
    _first_line,
)
from lakehouse_dagster.plans.store import COMPLETING


class _Completing(StepState):
    """A step's completing phase (mixed into plans/controller.py's ``_Step``)."""

    def start_complete(self, stage: Stage) -> tuple[list[RunAsk], bool]:
        """The complete stage's first run, over every dataset the stages before it moved and not complete yet."""
        n = self.p.stage + 1
        moved = store.moved_before(self.conn, self.p.id, self.p.stage)
        marks = completed_marks(self.conn, moved)
        left = [d for d in moved if d not in marks or marks[d].status != COMPLETE_MARK]
        if stage.max_datasets is not None and len(left) > stage.max_datasets:
            self.pause(
                f"stage {n} would complete {len(left)} datasets, above its max_datasets {stage.max_datasets}; "
                "complete some by hand (lakehouse complete --dataset <id>) and resume, or abort"
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
            "lakehouse complete --status shows each dataset)"
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
