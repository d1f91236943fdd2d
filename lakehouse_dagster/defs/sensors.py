"""The mirror poller: requests a mirror run for every dataset whose Postgres rows moved, and again for
every dataset still behind with no run in flight (backoff, cap and run keys in ingest/poller.py)."""

import uuid

import dagster as dg

from ..ingest.poller import Cursor, Retry, plan_tick
from .assets import mirror_job
from .partitions import datasets_partitions
from .resources import LakehouseResource
from .tags import datasets_tags

# A run in one of these may still sync its dataset: the sweep does not ask again meanwhile.
IN_FLIGHT = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]


def mirror_runs_in_flight(instance: dg.DagsterInstance, dataset_ids: list[uuid.UUID]) -> set[uuid.UUID]:
    """Datasets among ``dataset_ids`` with a mirror_job run queued or running: one query."""
    if not dataset_ids:
        return set()
    records = instance.get_run_records(
        dg.RunsFilter(job_name=mirror_job.name, statuses=IN_FLIGHT,
                      tags={"dagster/partition": [str(d) for d in dataset_ids]})
    )
    return {uuid.UUID(r.dagster_run.tags["dagster/partition"]) for r in records}


@dg.sensor(
    job=mirror_job,
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="PG → Iceberg mirror poller (ENABLE_ICEBERG_SYNC); skips manifest and iceberg-native datasets.",
)
def mirror_poller(context: dg.SensorEvaluationContext, lakehouse: LakehouseResource):
    settings = lakehouse.settings()
    if not settings.enable_iceberg_sync:
        return dg.SkipReason("ENABLE_ICEBERG_SYNC is off")
    with lakehouse.connect() as conn:
        tick = plan_tick(
            conn, Cursor.loads(context.cursor), limit=settings.sensor_max_requests,
            retry_after_seconds=settings.retry_failed_after_seconds, retry_max=settings.retry_failed_max,
            in_flight=lambda ids: mirror_runs_in_flight(context.instance, ids),
        )
        named = datasets_tags(conn, [p.dataset_id for p in tick.requests])
    known = set(context.instance.get_dynamic_partitions(datasets_partitions.name))
    new_keys = sorted({str(p.dataset_id) for p in tick.requests} - known)
    requests = []
    for p in tick.requests:
        tags = {**named.get(p.dataset_id, {}), "lakehouse/source_version": str(p.rows_version)}
        if isinstance(p, Retry):
            tags["lakehouse/attempt"] = str(p.attempt)
        requests.append(dg.RunRequest(run_key=p.run_key, partition_key=str(p.dataset_id), tags=tags))
    retries = sum(isinstance(p, Retry) for p in tick.requests)
    context.log.info(
        f"scanned {tick.scanned} changed datasets, {tick.behind} behind Postgres; requesting"
        f" {len(requests) - retries} syncs and {retries} retries ({tick.in_flight} behind with a run in flight)"
    )
    return dg.SensorResult(
        run_requests=requests,
        dynamic_partitions_requests=[datasets_partitions.build_add_request(new_keys)] if new_keys else [],
        cursor=tick.cursor.dumps(),
    )
