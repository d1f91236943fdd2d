"""The ``lakehouse_alerts`` sensor: posts what needs an operator to LAKEHOUSE_ALERT_WEBHOOK_URL (status/alerts.py).

Dagster glue only: it reads the failed runs of this code location's jobs from the instance (since the cursor, with a
look-back), hands them to ``status.alerts.run_tick`` (which finds the other events in Postgres, records and posts
them) and stores the cursor. It never requests a run: every tick ends as a skip whose message says what was posted,
what is pending, or why nothing is (no URL). The URL never reaches a log line, the cursor or the tick's message.
"""

import datetime as dt
from typing import Any

import dagster as dg

from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.shared.tags import DATASET, DATASET_NAME, DATASET_NAMES
from lakehouse_dagster.plans import store as plan_store
from lakehouse_dagster.status import alerts

RUN_PAGE = 200  # failed runs read per tick (the cursor stops at the last one read when there are more)
_DATASETS_TAG = "lakehouse/datasets"  # a mirror batch run's dataset ids (dagster/defs/mirror/mirror_batch.py)
# How a refused step's error reads (dagster/defs/shared/refusals.py): "Refused: <reason>", or with the class's full name.
_REFUSED = ("lakehouse_dagster.dagster.defs.shared.refusals.Refused: ", "Refused: ")


def failure_reason(instance: dg.DagsterInstance, run_id: str) -> str:
    """Why the run failed, as the UI shows it: the first failed step's error (a refusal's reason, without its
    exception name), else the run's own failure message."""
    for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_FAILURE):
        data = entry.dagster_event.step_failure_data if entry.dagster_event else None
        if data is None or data.error is None:
            continue
        error = data.error.cause or data.error
        text = error.message.strip()
        prefix = next((p for p in _REFUSED if text.startswith(p)), "")
        return text[len(prefix) :]
    for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.RUN_FAILURE):
        return entry.message or (entry.dagster_event.message if entry.dagster_event else "") or ""
    return ""


def failed_run(instance: dg.DagsterInstance, record: dg.RunRecord) -> alerts.FailedRun:
    run = record.dagster_run
    tags = run.tags
    config: Any = (run.run_config or {}).get("ops") or {}
    listed = next((op.get("config", {}).get("datasets") for op in config.values() if isinstance(op, dict)), None)
    ids = (
        (tags[DATASET],)
        if tags.get(DATASET)
        else tuple(tags[_DATASETS_TAG].split(","))
        if tags.get(_DATASETS_TAG)
        else tuple(listed or ())
    )
    names = (
        (tags[DATASET_NAME],)
        if tags.get(DATASET_NAME)
        else tuple(n for n in tags.get(DATASET_NAMES, "").split(",") if n)
    )
    return alerts.FailedRun(
        run_id=run.run_id,
        job_name=run.job_name,
        updated_at=record.update_timestamp,
        reason=failure_reason(instance, run.run_id),
        dataset_ids=tuple(str(i) for i in ids),
        dataset_names=names,
    )


def plan_event(row: dict) -> alerts.PlanEvent:
    kind = "reader" if row["kind"] == "read" else "writer"
    return alerts.PlanEvent(
        event_id=row["id"],
        plan_id=row["plan_id"],
        plan=f"{kind} {row['name']} → {row['mode']}",
        event=row["event"],
        stage=row["stage"],
        reason=row["reason"] or "",
    )


@dg.sensor(
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Posts to LAKEHOUSE_ALERT_WEBHOOK_URL (Slack-compatible) once per event: a failed lakehouse run, a "
    "parity MISMATCH, an auto-rollback, a wedged sync, a freshness breach, a native-safety finding, a rollout plan "
    "that paused, waits for an approval or aborted. Unset: posts nothing, and the tick says so.",
)
def lakehouse_alerts(context: dg.SensorEvaluationContext, lakehouse: LakehouseResource):
    settings = lakehouse.settings()
    cursor = alerts.Cursor.loads(context.cursor)
    now = dt.datetime.now(dt.UTC)
    records: list = []
    if alerts.webhook_problem(settings.alert_webhook_url) is None:  # (unset: read nothing)
        records = list(
            context.instance.get_run_records(
                dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE], updated_after=cursor.runs_since(now)),
                limit=RUN_PAGE,
                order_by="update_timestamp",
                ascending=True,
            )
        )
    jobs = set(context.repository_def.job_names) if context.repository_def is not None else None
    failed = [failed_run(context.instance, r) for r in records if jobs is None or r.dagster_run.job_name in jobs]
    with lakehouse.connect() as conn:
        plan_rows, plan_read_to = plan_store.alertable_events(conn, cursor.rollout_id)
        tick = alerts.run_tick(
            conn,
            settings,
            cursor,
            failed,
            now=now,
            runs_read_to=records[-1].update_timestamp if len(records) == RUN_PAGE else now,
            plan_events=[plan_event(r) for r in plan_rows],
            plan_events_read_to=plan_read_to,
        )
    for line in tick.log_lines:
        context.log.warning(line)
    # the sensors page shows the latest tick's skip reason: without a webhook it starts by saying the sensor is idle
    reason = f"idle, alerts are off: {tick.summary()}" if tick.disabled else tick.summary()
    return dg.SensorResult(skip_reason=reason, cursor=tick.cursor.dumps())
