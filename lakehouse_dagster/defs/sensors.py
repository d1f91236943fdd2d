"""The mirror poller: requests a mirror run for every dataset whose Postgres rows moved, and again for
one whose last sync failed (backoff and cap in ingest/poller.py)."""


import dagster as dg

from ..ingest.poller import Cursor, failed_syncs_to_retry, pending_syncs
from .assets import mirror_job
from .partitions import datasets_partitions
from .resources import LakehouseResource


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
    cursor = Cursor.loads(context.cursor)
    with lakehouse.connect() as conn:
        pending, nxt, scanned = pending_syncs(conn, cursor, limit=settings.sensor_max_requests)
        asked = {p.dataset_id for p in pending}
        retries = [r for r in failed_syncs_to_retry(
            conn, after_seconds=settings.retry_failed_after_seconds, max_retries=settings.retry_failed_max,
            limit=settings.sensor_max_requests) if r.dataset_id not in asked]
    known = set(context.instance.get_dynamic_partitions(datasets_partitions.name))
    new_keys = sorted({str(p.dataset_id) for p in [*pending, *retries]} - known)
    requests = [
        dg.RunRequest(
            run_key=p.run_key,
            partition_key=str(p.dataset_id),
            tags={"lakehouse/source_version": str(p.rows_version)},
        )
        for p in pending
    ] + [
        dg.RunRequest(
            run_key=r.run_key,
            partition_key=str(r.dataset_id),
            tags={"lakehouse/source_version": str(r.rows_version), "lakehouse/retry_of": str(r.failed_sync_id),
                  "lakehouse/failures": str(r.failures)},
        )
        for r in retries
    ]
    context.log.info(f"scanned {scanned} changed datasets, requesting {len(pending)} syncs"
                     f" and {len(retries)} retries of failed syncs")
    return dg.SensorResult(
        run_requests=requests,
        dynamic_partitions_requests=[datasets_partitions.build_add_request(new_keys)] if new_keys else [],
        cursor=nxt.dumps(),
    )
