"""The ``lakehouse_alerts`` sensor: posts what needs an operator to LAKEHOUSE_ALERT_WEBHOOK_URL (status/alerts.py).

Dagster glue only: it reads the failed runs of this code location's jobs from the instance (since the cursor, with a
look-back), hands them to ``status.alerts.run_tick`` (which finds the other events in Postgres, records and posts
them) and stores the cursor. It never requests a run: every tick ends as a skip whose message says what was posted,
what is pending, or why nothing is (no URL). The URL never reaches a log line, the cursor or the tick's message.
"""

import datetime as dt
import os
from typing import Any

import dagster as dg

from lakehouse_dagster.api import alerts
from lakehouse_dagster.api.plans import alertable_events
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.shared.outage import skip_while_postgres_is_down
from lakehouse_dagster.dagster.defs.shared.run_failure import failure_reason
from lakehouse_dagster.dagster.defs.shared.tags import DATASET, DATASET_NAME, DATASET_NAMES

RUN_PAGE = 200  # failed runs read per tick after the position (a keyset page: the position moves past it)
_TICK = dt.timedelta(microseconds=1)
_DATASETS_TAG = "lakehouse/datasets"  # a mirror batch run's dataset ids (dagster/defs/mirror/mirror_batch.py)


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
        reason=failure_reason(instance, run.run_id) or "",
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


def _failed_run_records(
    instance: dg.DagsterInstance, after: dt.datetime, limit: int, before: dt.datetime | None = None, newest=False
) -> list[dg.RunRecord]:
    return list(
        instance.get_run_records(
            dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE], updated_after=after, updated_before=before),
            limit=limit,
            order_by="update_timestamp",
            ascending=not newest,
        )
    )


def _position(record: dg.RunRecord) -> alerts.Position:
    return alerts.Position(record.update_timestamp, record.storage_id)


def read_failed_runs(
    context: dg.SensorEvaluationContext, conn, start: alerts.Position
) -> tuple[list[alerts.FailedRun], alerts.Position]:
    """The failed runs of this code location's jobs not alerted yet: a keyset page after ``start`` (update time,
    storage id: the position moves past every full page) and, again, the newest of the look-back behind it (a run
    whose failure was written late, or by a host whose clock is behind); with the position after the page. The
    failure reason is read only for runs not recorded yet."""
    instance = context.instance
    page, _ = alerts.keyset_page(lambda t, n: _failed_run_records(instance, t, n), _position, start, RUN_PAGE)
    behind = _failed_run_records(
        instance, start.at - alerts.RUNS_LOOKBACK, alerts.RUNS_LOOKBACK_READ, before=start.at + _TICK, newest=True
    )
    jobs = set(context.repository_def.job_names) if context.repository_def is not None else None
    found = {r.dagster_run.run_id: r for r in [*behind, *page] if jobs is None or r.dagster_run.job_name in jobs}
    new = alerts.unrecorded(conn, [f"{alerts.RUN_FAILED}:{run_id}" for run_id in found])
    failed = [failed_run(instance, r) for run_id, r in found.items() if f"{alerts.RUN_FAILED}:{run_id}" in new]
    return failed, (_position(page[-1]) if page else start)


WHAT_IT_POSTS = (
    "Posts to LAKEHOUSE_ALERT_WEBHOOK_URL (Slack-compatible) once per event: a failed lakehouse run, a parity "
    "MISMATCH, an auto-rollback, a wedged sync, a freshness breach, a native-safety finding, a mirror stream "
    "shard down, a rollout plan that paused, waits for an approval or aborted."
)


def description(webhook_url: str | None) -> str:
    """The sensors page shows a sensor's description, not its ticks' skip reasons (those hide in a tooltip): so the
    description says first whether alerts are on. It is read from the code location's environment when it loads —
    the environment every tick reads the webhook from — and a changed variable needs the location reloaded anyway."""
    problem = alerts.webhook_problem(webhook_url)
    if problem is not None:
        return f"IDLE, alerts are off: {problem}. {WHAT_IT_POSTS}"
    return WHAT_IT_POSTS


@dg.sensor(
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=description(os.environ.get(alerts.ENV) or None),
)
@skip_while_postgres_is_down
def lakehouse_alerts(context: dg.SensorEvaluationContext, lakehouse: LakehouseResource):
    settings = lakehouse.settings()
    cursor = alerts.Cursor.loads(context.cursor)
    now = dt.datetime.now(dt.UTC)
    with lakehouse.connect() as conn:
        failed: list[alerts.FailedRun] = []
        runs_to = None
        if alerts.webhook_problem(settings.alerts.webhook_url) is None:  # (unset: read nothing)
            failed, runs_to = read_failed_runs(context, conn, cursor.runs_after(now))
        plan_rows, plan_read_to = alertable_events(conn, cursor.rollout)
        tick = alerts.run_tick(
            conn,
            settings,
            cursor,
            failed,
            now=now,
            runs_read_to=runs_to,
            plan_events=[plan_event(r) for r in plan_rows],
            plan_events_read_to=plan_read_to,
        )
    for line in tick.log_lines:
        context.log.warning(line)
    # the sensors page shows the latest tick's skip reason: without a webhook it starts by saying the sensor is idle
    reason = f"idle, alerts are off: {tick.summary()}" if tick.disabled else tick.summary()
    return dg.SensorResult(skip_reason=reason, cursor=tick.cursor.dumps())
