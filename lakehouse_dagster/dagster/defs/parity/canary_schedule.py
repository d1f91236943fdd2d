"""The canary schedule: every 30 minutes the parity checks over the flipped datasets (a read or write flag above its
registry default), in parity_canary_batch_job runs of many datasets each, sized so the queue drains.

Each tick (runbooks/canary_rounds.py) asks for the flipped datasets whose last scheduled verdict is oldest
(never-checked first), at most LAKEHOUSE_CANARY_MAX_PER_TICK, in runs of LAKEHOUSE_CANARY_BATCH_SIZE, and only as many
runs as LAKEHOUSE_CANARY_MAX_RUNS leaves free beside the canary runs still queued or running, whose datasets it leaves
out: a tick never adds to a queue that has not drained. Each verdict is recorded with source ``schedule``; a MISMATCH
rolls back what serves it and fails the run, naming the dataset.

``parity_canary_job`` (one dataset, tag dagster/partition=<uuid>) stays for launching by hand.
"""

import datetime
import uuid
from typing import Any

import dagster as dg

from lakehouse_dagster.api.flags import flipped_dataset_ids
from lakehouse_dagster.api.parity import oldest_first, plan_round
from lakehouse_dagster.dagster.defs.parity.canary_batch import CanaryBatchConfig, parity_canary_batch_job
from lakehouse_dagster.dagster.defs.parity.checks import CANARY_TAG
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.shared.keys import ICEBERG_TABLE
from lakehouse_dagster.dagster.defs.shared.partitions import DATASETS
from lakehouse_dagster.dagster.defs.shared.tags import batch_tags, datasets_tags

# Checks only: the table is not re-materialized (that is the mirror's job), so a dataset behind its
# Postgres version reads as lagging rather than being synced first. A checks-only asset job carries no
# partitions definition of its own (dagster infers it from selected *assets*), so a run targets its
# dataset with the dagster/partition tag; the check results are recorded against that partition.
parity_canary_job = dg.define_asset_job(
    "parity_canary_job",
    selection=dg.AssetSelection.checks_for_assets(ICEBERG_TABLE),
    description="Run the parity, snapshot_freshness and identity_ready checks of one dataset "
    "(tag dagster/partition=<dataset uuid>) without re-materializing its Iceberg table.",
)
PARTITION_TAG = "dagster/partition"
COUNT_TAG = "lakehouse/canary_datasets"  # how many datasets a canary batch run checks

# A run in one of these may still check its datasets: the schedule does not ask for them again meanwhile.
IN_FLIGHT = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]


def canary_runs_in_flight(instance: dg.DagsterInstance) -> tuple[int, set[uuid.UUID]]:
    """(canary runs queued or running, the datasets they check): batch runs (their config lists the datasets) and
    scheduled one-dataset runs of parity_canary_job (what the schedule launched before batches)."""
    runs, busy = 0, set()
    for r in instance.get_run_records(dg.RunsFilter(job_name=parity_canary_batch_job.name, statuses=IN_FLIGHT)):
        runs += 1
        ops: Any = (r.dagster_run.run_config or {}).get("ops") or {}
        listed = ((ops.get("check_datasets") or {}).get("config") or {}).get("datasets") or []
        busy |= {uuid.UUID(d) for d in listed if _is_uuid(d)}
    for r in instance.get_run_records(
        dg.RunsFilter(job_name=parity_canary_job.name, statuses=IN_FLIGHT, tags={CANARY_TAG: "schedule"})
    ):
        runs += 1
        if _is_uuid(r.dagster_run.tags.get(PARTITION_TAG)):
            busy.add(uuid.UUID(r.dagster_run.tags[PARTITION_TAG]))
    return runs, busy


def _is_uuid(value) -> bool:
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True


@dg.schedule(
    job=parity_canary_batch_job,
    cron_schedule="*/30 * * * *",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Every 30 minutes: the canary over the flipped datasets, oldest verdict first, in batch runs "
    "(runbook Fase 1 monitoring: re-run the canary periodically over the flipped datasets).",
)
def parity_canary_schedule(context: dg.ScheduleEvaluationContext, lakehouse: LakehouseResource):
    settings = lakehouse.settings()
    with lakehouse.connect() as conn:
        flipped = flipped_dataset_ids(conn)
        known = set(context.instance.get_dynamic_partitions(DATASETS))
        unknown = sorted(str(d) for d in flipped if str(d) not in known)
        if unknown:  # not yet a partition (the mirror poller adds them): nothing to attach a check result to
            context.log.info(f"{len(unknown)} flipped dataset(s) are not partitions yet: {', '.join(unknown[:10])}")
        targets = [d for d in flipped if str(d) in known]
        if not targets:
            return dg.SkipReason(
                "no flipped dataset to check" if not flipped else "no flipped dataset is a partition yet"
            )
        runs, busy = canary_runs_in_flight(context.instance)
        plan = plan_round(
            [d for d, _ in oldest_first(conn, targets)],
            in_flight_datasets=busy,
            in_flight_runs=runs,
            max_runs=settings.parity.canary_max_runs,
            cap=settings.parity.canary_max_per_tick,
            batch_size=settings.parity.canary_batch_size,
        )
        if not plan.batches:
            return dg.SkipReason(plan.why_nothing())
        named = datasets_tags(conn, [d for b in plan.batches for d in b])
    context.log.info(plan.summary())
    tick, n = _tick(context), len(plan.batches)
    return [
        dg.RunRequest(
            run_key=f"canary:{tick}:{i + 1}/{n}",
            tags={**batch_tags(named, batch), CANARY_TAG: "schedule", COUNT_TAG: str(len(batch))},
            run_config=dg.RunConfig(ops={"check_datasets": CanaryBatchConfig(datasets=[str(d) for d in batch])}),
        )
        for i, batch in enumerate(plan.batches)
    ]


def _tick(context: dg.ScheduleEvaluationContext) -> str:
    """The tick's time (run keys deduplicate per tick and batch); now when evaluated by hand."""
    try:
        when = context.scheduled_execution_time
    except Exception:  # not set outside a daemon tick
        when = None
    return (when or datetime.datetime.now(datetime.UTC)).isoformat()
