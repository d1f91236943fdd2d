"""Rollout plans in the Dagster UI: a job for each `lakehouse rollout` verb (plan, start, status, pause, resume,
approve, abort), launchable from the launchpad with typed config, and ``rollout_analysis``, the canary run the
controller asks for at the end of a stage's soak. Thin glue: the same functions as the CLI (plans/).
(No ``from __future__ import annotations`` here: Dagster reads the Config annotations at runtime.)
"""

from typing import Optional

import dagster as dg
from pydantic import Field

from lakehouse_dagster.api import parity as canary  # the canary's face: its names load on first use
from lakehouse_dagster.api import plans, reverse
from lakehouse_dagster.api.flags import current_soak
from lakehouse_dagster.api.parity import run_canary_and_roll_back
from lakehouse_dagster.core.errors import LakehouseError
from lakehouse_dagster.core.ids import parse_uuid
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.shared.refusals import refuse, stop
from lakehouse_dagster.dagster.defs.shared.tags import plan_tags, tag_run, text

ANALYSIS_SOURCE = "rollout-analysis"  # lakehouse_read_parity.source of the verdicts an analysis run records
_TAGS = {"lakehouse/area": "rollout"}


def actor_of(context: dg.OpExecutionContext, lakehouse: LakehouseResource) -> str:
    return f"{lakehouse.settings().project.actor} (dagster run {context.run_id[:8]})"


class PlanFileConfig(dg.Config):
    plan: str = Field(description="the plan file's text (YAML: reader or writer, mode, stages; see docs/rollouts.md)")


class PlanIdConfig(dg.Config):
    plan_id: str = Field(description="the plan's id (or its first 8 characters, as `lakehouse rollout status` shows)")
    note: Optional[str] = Field(default=None, description="why (kept in the plan's history)")


class StatusConfig(dg.Config):
    plan_id: Optional[str] = Field(default=None, description="one plan; empty: every recent plan")


def _status_meta(s: plans.PlanStatus) -> dict:
    return {
        "plan_id": text(s.id),
        "state": s.state,
        "stage": s.stage_text(),  # a finished plan: "all N stage(s) passed", not its last stage "waiting"
        "next_action": s.next_action,
        "blocking": s.blocking or "",
        "datasets_moved": s.datasets_moved,
    }


@dg.op(description="Dry-run: every flag change the plan makes, in order, with the datasets each moves; writes nothing.")
def rollout_plan_op(context: dg.OpExecutionContext, config: PlanFileConfig, lakehouse: LakehouseResource) -> dict:
    with lakehouse.connect() as conn:
        try:
            rendered = plans.dry_run(conn, lakehouse.settings(), config.plan)
        except LakehouseError as exc:
            raise refuse(exc) from None
    lines = rendered.lines()
    context.log.info("\n".join(lines))
    meta = {"changes": len(rendered.changes), "plan": dg.MetadataValue.md("```\n" + "\n".join(lines) + "\n```")}
    if rendered.problems:
        raise stop(context, rendered.refusal(), meta) from None
    context.add_output_metadata(meta)
    return rendered.as_dict()


@dg.op(
    description="Start a plan: validated and dry-run first (a plan a gate would refuse is refused, naming the gate)."
)
def rollout_start_op(context: dg.OpExecutionContext, config: PlanFileConfig, lakehouse: LakehouseResource) -> str:
    with lakehouse.connect() as conn:
        try:
            plan_id, rendered = plans.start(conn, lakehouse.settings(), config.plan, actor=actor_of(context, lakehouse))
        except LakehouseError as exc:
            raise refuse(exc) from None
    tag_run(context, plan_tags(plan_id, "start"))
    context.log.info("\n".join([f"started plan {plan_id}", *rendered.lines()]))
    context.add_output_metadata({"plan_id": text(plan_id), "changes": len(rendered.changes)})
    return str(plan_id)


@dg.op(description="Each plan's stage, next action, blocking reason and history (like `lakehouse rollout status`).")
def rollout_status_op(context: dg.OpExecutionContext, config: StatusConfig, lakehouse: LakehouseResource) -> list:
    settings = lakehouse.settings()
    with lakehouse.connect() as conn:
        try:
            if config.plan_id:
                found = [
                    plans.plan_status(
                        conn, plans.resolve_id(conn, config.plan_id), soak_seconds=current_soak(conn, settings).seconds
                    )
                ]
            else:
                found = plans.recent_statuses(conn, soak_seconds=current_soak(conn, settings).seconds, history=5)
        except LakehouseError as exc:
            raise refuse(exc) from None
    context.log.info("\n".join(line for s in found for line in s.lines()) or "no rollout plan yet")
    if len(found) == 1:
        context.add_output_metadata(_status_meta(found[0]))
    return [s.as_dict() for s in found]


def _act(context, lakehouse: LakehouseResource, config: PlanIdConfig, what: str) -> dict:
    settings = lakehouse.settings()
    actor = actor_of(context, lakehouse)
    with lakehouse.connect() as conn:
        try:
            plan_id = plans.resolve_id(conn, config.plan_id)
            tag_run(context, plan_tags(plan_id, what))
            message = None
            if what == "pause":
                plans.pause(conn, plan_id, actor=actor, reason=config.note)
            elif what == "resume":
                plans.resume(conn, plan_id, actor=actor, note=config.note)
            elif what == "approve":
                plans.approve(conn, plan_id, actor=actor, note=config.note)
            else:
                message = plans.abort(conn, settings.project, plan_id, actor=actor, reason=config.note).message
            s = plans.plan_status(conn, plan_id, soak_seconds=current_soak(conn, settings).seconds, history=0)
        except LakehouseError as exc:
            raise refuse(exc) from None
    context.log.info("\n".join(([message] if message else []) + s.lines(history=False)))
    context.add_output_metadata(_status_meta(s))
    return s.as_dict()


@dg.op(description="Pause a plan: the controller leaves it where it is until resumed.")
def rollout_pause_op(context: dg.OpExecutionContext, config: PlanIdConfig, lakehouse: LakehouseResource) -> dict:
    return _act(context, lakehouse, config, "pause")


@dg.op(description="Resume a paused plan where it stopped.")
def rollout_resume_op(context: dg.OpExecutionContext, config: PlanIdConfig, lakehouse: LakehouseResource) -> dict:
    return _act(context, lakehouse, config, "resume")


@dg.op(description="Approve the stage a plan waits at (approval: true).")
def rollout_approve_op(context: dg.OpExecutionContext, config: PlanIdConfig, lakehouse: LakehouseResource) -> dict:
    return _act(context, lakehouse, config, "approve")


@dg.op(description="Abort a plan: every flag it set goes back to its value before the plan (audited).")
def rollout_abort_op(context: dg.OpExecutionContext, config: PlanIdConfig, lakehouse: LakehouseResource) -> dict:
    return _act(context, lakehouse, config, "abort")


@dg.job(
    name="rollout_plan", description="Dry-run a rollout plan: every flag change in order, nothing written.", tags=_TAGS
)
def rollout_plan_job():
    rollout_plan_op()


@dg.job(
    name="rollout_start", description="Start a rollout plan; the rollout_controller sensor advances it.", tags=_TAGS
)
def rollout_start_job():
    rollout_start_op()


@dg.job(name="rollout_status", description="Rollout plans: stage, next action, blocking reason, history.", tags=_TAGS)
def rollout_status_job():
    rollout_status_op()


@dg.job(name="rollout_pause", description="Pause a rollout plan.", tags=_TAGS)
def rollout_pause_job():
    rollout_pause_op()


@dg.job(name="rollout_resume", description="Resume a paused rollout plan.", tags=_TAGS)
def rollout_resume_job():
    rollout_resume_op()


@dg.job(name="rollout_approve", description="Approve the stage a rollout plan waits at.", tags=_TAGS)
def rollout_approve_job():
    rollout_approve_op()


@dg.job(name="rollout_abort", description="Abort a rollout plan and restore every flag it set.", tags=_TAGS)
def rollout_abort_job():
    rollout_abort_op()


class AnalysisConfig(dg.Config):
    plan_id: str = Field(description="the plan whose stage is analysed")
    stage: int = Field(description="the stage (0-based)")
    dataset_ids: list[str] = Field(description="the stage's datasets to canary (a sample)")
    kind: str = Field(default="read", description="read or write: the plan's flag kind")
    name: str = Field(default="", description="the plan's reader or writer")


@dg.op(
    description="A stage's analysis: the canary (--smoke) over a sample of the datasets the stage moved, verdicts "
    "recorded with source rollout-analysis (a MISMATCH also rolls the dataset back and fails this run); the "
    "controller reads the verdicts."
)
def rollout_analysis_op(context: dg.OpExecutionContext, config: AnalysisConfig, lakehouse: LakehouseResource) -> dict:
    settings = lakehouse.settings()
    if not config.dataset_ids:  # (the canary would pick a random sample of its own)
        raise refuse("no dataset to analyse: give the stage's dataset ids (the rollout_controller does)")
    with lakehouse.connect() as conn:
        try:
            catalog = lakehouse.catalog()
            lag_before = {}
            if config.kind == "write":  # parity both ways at the current snapshot; the lag it had is the evidence
                ids = [parse_uuid(d, "dataset id") for d in config.dataset_ids]
                lag_before = reverse.catch_up(conn, lakehouse.pg_dsn, catalog, settings, ids)
                behind = {d: s for d, s in lag_before.items() if s}
                if behind:
                    context.log.info(
                        f"the reverse mirror was behind on {len(behind)} dataset(s) (at most "
                        f"{max(behind.values()):.1f} s): applied before the canary"
                    )
            report = run_canary_and_roll_back(
                conn,
                lakehouse.pg_dsn,
                catalog,
                settings,
                dataset_ids=config.dataset_ids,
                smoke=True,
                source=ANALYSIS_SOURCE,
                run_id=context.run_id,
                reverse_lag_before=lag_before,
            )
        except LakehouseError as exc:
            raise refuse(exc) from None
    context.log.info(report.summary_line())
    meta = {f"verdict_{k}": n for k, n in report.counts.items() if n}
    # a MISMATCH of a reverse copy was repaired and rolls nothing back: the controller holds the stage on it
    bad = [r for r in report.results if r.verdict == canary.MISMATCH and not reverse.is_reverse_verdict(r)]
    if bad:
        lines = [f"MISMATCH on {len(bad)} dataset(s) of stage {config.stage + 1} of plan {config.plan_id}:"]
        lines += [f"  {r.dataset} ({r.dataset_id}): {r.summary_line()}" for r in bad[:20]]
        raise stop(context, "\n".join(lines), meta) from None
    context.add_output_metadata(meta)
    return report.as_dict()["summary"]


@dg.job(
    name="rollout_analysis",
    description="A rollout stage's analysis run (asked for by the rollout_controller): the canary over the stage's "
    "datasets; the controller decides pass / fail / inconclusive from the recorded verdicts.",
    tags=_TAGS,
    executor_def=dg.in_process_executor,
)
def rollout_analysis_job():
    rollout_analysis_op()
