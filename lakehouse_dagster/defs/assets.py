"""The dataset's Postgres rows and its Iceberg table, one partition per dataset, with lineage."""


import dagster as dg

from ..errors import Backpressure, LakehouseError, is_transient
from ..ingest.batch import run_sync_id
from ..ingest.sync import SyncResult, peak_rss_mb, sync_dataset
from ..store.datasets import get_dataset
from .partitions import datasets_partitions
from .resources import LakehouseResource

PG_ROWS = dg.AssetKey(["postgres", "dataset_rows"])
ICEBERG_TABLE = dg.AssetKey(["iceberg", "dataset_table"])


class MirrorConfig(dg.Config):
    """How to mirror: auto (incremental when only appends happened, else full), full, incremental."""

    mode: str = "auto"


@dg.asset(
    key=PG_ROWS,
    partitions_def=datasets_partitions,
    group_name="lakehouse",
    description="A dataset's rows in Postgres (dataset_rows): the source of the mirror.",
    kinds={"postgres"},
)
def pg_dataset_rows(context: dg.AssetExecutionContext, lakehouse: LakehouseResource) -> dg.MaterializeResult:
    with lakehouse.connect() as conn:
        ds = get_dataset(conn, context.partition_key)
    return dg.MaterializeResult(metadata=pg_rows_metadata(ds), data_version=dg.DataVersion(str(ds.rows_version)))


def pg_rows_metadata(ds) -> dict:
    """What a materialization of postgres/dataset_rows records (the asset and the batch job)."""
    return {
        "dataset": ds.name,
        "kind": ds.kind,
        "rows_version": ds.rows_version,
        "max_row_index": ds.max_row_index if ds.max_row_index is not None else -1,
        "columns": len(ds.columns),
    }


def iceberg_metadata(r: SyncResult) -> dict:
    """What a materialization of iceberg/dataset_table records (the asset and the batch job)."""
    return {
        "path": r.path,
        "mode": r.mode,
        "reason": r.reason,
        "rows": dg.MetadataValue.int(r.rows),
        "total_rows": dg.MetadataValue.int(r.total_rows),
        "snapshot_id": str(r.snapshot_id),
        "source_version": r.source_version,
        "bytes_written": dg.MetadataValue.int(r.bytes),
        "files": r.files,
        "seconds": dg.MetadataValue.float(round(r.seconds, 3)),
        "rows_per_s": dg.MetadataValue.float(round(r.rows_per_s, 1)),
        "peak_rss_mb": dg.MetadataValue.float(round(peak_rss_mb(), 1)),
    }


@dg.asset(
    key=ICEBERG_TABLE,
    deps=[PG_ROWS],
    partitions_def=datasets_partitions,
    group_name="lakehouse",
    description="The dataset's Iceberg table, mirrored from Postgres in chunks and committed once.",
    kinds={"iceberg"},
    pool="iceberg_ingest",
    retry_policy=dg.RetryPolicy(
        max_retries=3, delay=5, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.PLUS_MINUS
    ),
)
def iceberg_dataset_table(
    context: dg.AssetExecutionContext, config: MirrorConfig, lakehouse: LakehouseResource
) -> dg.MaterializeResult:
    settings = lakehouse.settings()
    # One sync id per run and partition: a retried step finds its own snapshot instead of appending twice.
    sync_id = run_sync_id(context.run_id, context.partition_key)
    try:
        r = sync_dataset(
            lakehouse.pg_dsn, lakehouse.catalog(), settings, context.partition_key,
            mode=config.mode, sync_id=sync_id, run_id=context.run_id,
        )
    except Backpressure as exc:  # G2: healthy backpressure, come back later
        raise dg.RetryRequested(max_retries=10, seconds_to_wait=30) from exc
    except LakehouseError as exc:
        # Fail loud either way; the asset's RetryPolicy retries only what a retry can fix (a connection,
        # object-store I/O, a commit conflict past its retries, a lost lock); bad data and bad input fail
        # at once. The retry reuses the sync id, so a commit that landed is found, not repeated.
        raise dg.Failure(description=str(exc), allow_retries=is_transient(exc)) from exc
    context.log.info(f"{r.mode}: {r.rows} rows → snapshot {r.snapshot_id} ({r.reason})")
    return dg.MaterializeResult(metadata=iceberg_metadata(r), data_version=dg.DataVersion(str(r.source_version)))


mirror_job = dg.define_asset_job(
    "mirror_job",
    selection=dg.AssetSelection.assets(PG_ROWS, ICEBERG_TABLE),
    partitions_def=datasets_partitions,
    # The steps of a run in one process: a step process would import the code location a second time.
    executor_def=dg.in_process_executor,
    description="Mirror one dataset partition from Postgres to Iceberg (by hand from the UI; the mirror poller "
    "launches mirror_batch_job, or this job per dataset with LAKEHOUSE_MIRROR_BATCH_SIZE=0).",
)
