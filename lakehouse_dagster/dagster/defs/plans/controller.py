"""The ``rollout_controller`` sensor: advances every live rollout plan (plans/controller.py) and turns the runs it
asks for into run requests of the existing jobs — ``read_flip`` / ``write_flip`` (every gate applies, the UI shows
the flip), ``set_flag`` (a shadow stage), ``rollout_analysis``, ``complete`` (a writer plan's last stage) — tagged
with the plan and the step.

The plan's state is in Postgres; the sensor's cursor is only the last plan event it logged (it moves forward).
A run is found again by its tags (``lakehouse/plan``, ``lakehouse/plan_step``), so a daemon restarted mid-stage
sees the runs it asked for before, and a run asked for twice has one run key, which Dagster launches once.
"""

import json
import uuid

import dagster as dg
import psycopg

from lakehouse_dagster.api import plans
from lakehouse_dagster.api.plans import (
    ANALYSIS,
    COMPLETE_JOB,
    FAILED,
    IN_FLIGHT,
    READ_FLIP,
    SET_FLAG,
    SUCCEEDED,
    WRITE_FLIP,
)
from lakehouse_dagster.core.errors import BadInput
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.dagster.defs.flags.flags import set_flag_job
from lakehouse_dagster.dagster.defs.plans.jobs import rollout_analysis_job
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.runbooks.complete import complete_job
from lakehouse_dagster.dagster.defs.runbooks.rollout import read_flip_job, write_flip_job
from lakehouse_dagster.dagster.defs.shared.outage import skip_while_postgres_is_down
from lakehouse_dagster.dagster.defs.shared.run_failure import failure_reason
from lakehouse_dagster.dagster.defs.shared.tags import PLAN, PLAN_STEP, flag_tags, plan_tags

_OP = {
    READ_FLIP: "read_flip_preflight",
    WRITE_FLIP: "write_flip_preflight",
    SET_FLAG: "set_flag_op",
    ANALYSIS: "rollout_analysis_op",
    COMPLETE_JOB: "complete_op",
}


def _tick_seconds() -> int:
    try:
        return Settings.from_env().rollout.tick_seconds
    except BadInput:  # a bad setting is refused where it is used; the sensor keeps its default interval
        return 15


def run_config(ask: plans.RunAsk) -> dict:
    """The job's launchpad config for a step's parameters; the steps run in the run's own process (a flip's three
    short ops would otherwise start a Python process each: ~5 s apiece on the target machine)."""
    p = ask.params
    if ask.job == ANALYSIS:
        config = {k: p[k] for k in ("plan_id", "stage", "dataset_ids", "kind", "name")}
    elif ask.job == COMPLETE_JOB:
        config = {"dataset_ids": p["dataset_ids"], "export_to": p.get("export_to"), "note": p["note"]}
    else:
        scope = {}
        if p["scope"] == "dataset":
            scope = {"dataset_id": p["scope_id"]}
        elif p["scope"] == "workspace":
            scope = {"workspace_id": p["scope_id"]}
        if ask.job == SET_FLAG:
            config = {"kind": p["kind"], "name": p["name"], "mode": p["mode"], "note": p["note"], **scope}
        else:
            config = {"note": p["note"], "sample": p["sample"], **scope}
            if p.get("max_datasets") is not None:  # else the flip's own preflight cap (500 canaried)
                config["max_datasets"] = p["max_datasets"]
            if ask.job == READ_FLIP:
                config |= {"reader": p["name"], "mode": p["mode"]}
            else:
                config |= {"writer": p["name"]}
    run: dict = {"ops": {_OP[ask.job]: {"config": config}}}  # (every job runs in process: definitions.py)
    return run


def run_request(conn: psycopg.Connection, ask: plans.RunAsk) -> dg.RunRequest:
    p = ask.params
    tags = plan_tags(ask.plan_id, ask.step_key)
    if ask.job in (ANALYSIS, COMPLETE_JOB):
        tags |= flag_tags(conn, p["kind"], p["name"])
    else:
        scope_id = p.get("scope_id")
        tags |= flag_tags(
            conn,
            p["kind"],
            p["name"],
            scope_id if p["scope"] == "dataset" else None,
            scope_id if p["scope"] == "workspace" else None,
        )
    return dg.RunRequest(run_key=ask.run_key, job_name=ask.job, run_config=run_config(ask), tags=tags)


def plan_runs(instance: dg.DagsterInstance, plan_id: uuid.UUID) -> dict[str, plans.RunState]:
    """{step key: its run} of one plan, from the runs' tags. A step with several runs (one re-executed from the UI
    carries the same tags) counts as succeeded when one succeeded, in flight while one runs, else failed (newest)."""
    found: dict[str, list] = {}
    for run in instance.get_runs(filters=dg.RunsFilter(tags={PLAN: str(plan_id)})):  # newest first
        if run.tags.get(PLAN_STEP):
            found.setdefault(run.tags[PLAN_STEP], []).append(run)
    out: dict[str, plans.RunState] = {}
    for step, runs in found.items():
        done = [r for r in runs if r.status == dg.DagsterRunStatus.SUCCESS]
        ended = (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)
        running = [r for r in runs if r.status not in ended]
        if done:
            out[step] = plans.RunState(done[-1].run_id, SUCCEEDED)
        elif running:
            out[step] = plans.RunState(running[0].run_id, IN_FLIGHT)
        else:
            out[step] = plans.RunState(runs[0].run_id, FAILED, failure_reason(instance, runs[0].run_id))
    return out


@dg.sensor(
    jobs=[read_flip_job, write_flip_job, set_flag_job, rollout_analysis_job, complete_job],
    minimum_interval_seconds=_tick_seconds(),
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Advances the rollout plans (lakehouse rollout start): each stage runs the flip job, soaks, then a "
    "canary analysis; pass → next stage (after an approval where asked), MISMATCH → abort and restore every flag "
    "the plan set, inconclusive → wait, then pause. A writer plan's complete stage runs the complete job (a "
    "refusal pauses it).",
)
@skip_while_postgres_is_down
def rollout_controller(context: dg.SensorEvaluationContext, lakehouse: LakehouseResource):
    settings = lakehouse.settings()
    last_event = int(json.loads(context.cursor).get("event", 0)) if context.cursor else 0
    with lakehouse.connect() as conn:
        if not plans.tables_exist(conn):
            return dg.SkipReason("the rollout tables do not exist yet: run lakehouse db migrate")
        result = plans.tick(conn, settings, lambda plan_id: plan_runs(context.instance, plan_id))
        requests = [run_request(conn, ask) for ask in result.asks]
        new_events = plans.events(conn, after_id=last_event, limit=500)
    for e in new_events:
        line = f"rollout {str(e['plan_id'])[:8]} {e['event']}" + (f": {e['reason']}" if e["reason"] else "")
        (context.log.warning if e["severity"] != "info" else context.log.info)(line)
    cursor = json.dumps({"event": max([last_event, *(e["id"] for e in new_events)])})
    if not requests:
        why = "; ".join(result.lines) or f"{result.live} live plan(s), nothing to ask for this tick"
        return dg.SensorResult(skip_reason=dg.SkipReason(why[:1000]), cursor=cursor)
    return dg.SensorResult(run_requests=requests, cursor=cursor)
