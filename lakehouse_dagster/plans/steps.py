"""What the controller's steps share (plans/controller.py): the runs they ask for (``RunAsk``, the jobs' names) and the
states they see them in, and the state one step of a plan holds (``StepState``), which the phases in soak_steps.py
and complete_steps.py read.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Callable
from typing import Protocol

import psycopg

from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.plans import analysis
from lakehouse_dagster.plans.spec import Plan, Stage
from lakehouse_dagster.plans.store import PlanRow

READ_FLIP, WRITE_FLIP, SET_FLAG, ANALYSIS = "read_flip", "write_flip", "set_flag", "rollout_analysis"
COMPLETE_JOB = "complete"
IN_FLIGHT, SUCCEEDED, FAILED = "in-flight", "succeeded", "failed"


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


def _first_line(text: str | None) -> str:
    """A refusal's headline and its first reason (a gate's refusal lists the datasets on the lines below)."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return " ".join(lines[:2])[:500]


class StepState(Protocol):
    """What one step of a plan holds and offers its phases: plans/controller.py's ``_Step`` has it all, and the
    phases mixed into it (soak_steps.py, complete_steps.py) read it through ``self``."""

    conn: psycopg.Connection
    settings: Settings
    p: PlanRow
    plan: Plan
    runs: dict[str, RunState]
    now: dt.datetime

    def say(self, text: str) -> None: ...

    def pause(self, reason: str) -> None: ...

    def begin_abort(self, reason: str) -> None: ...

    def aborting(self) -> list[RunAsk]: ...

    def check_mismatches(self, *, upcoming: bool = False) -> bool: ...

    def pass_stage(self, stage: Stage, found: analysis.Outcome) -> list[RunAsk]: ...
