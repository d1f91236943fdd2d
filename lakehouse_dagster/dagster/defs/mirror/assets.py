"""The dataset's Postgres rows and its Iceberg table, one partition per dataset, with lineage.

The Iceberg table asset carries a freshness policy (LAKEHOUSE_MIRROR_FRESHNESS_SECONDS). Dagster 1.13 evaluates it per
asset, not per partition: its daemon compares the newest materialization of *any* partition with the window
(``TimeWindowFreshnessPolicyEvaluator`` reads ``AssetRecord.last_materialization`` of the asset key). So it turns red
when the mirror landed nothing at all for that long — a stopped mirror over a database that keeps changing, or a
database that stopped changing. Per dataset, the poller's observations mark a partition behind and the
flipped_freshness_checks sensor fails its snapshot_freshness check (docs/overview.md).
"""

import datetime as dt

import dagster as dg

from lakehouse_dagster.api.datasets import get_dataset
from lakehouse_dagster.api.mirror import SyncResult, peak_rss_mb, run_sync_id, sync_dataset
from lakehouse_dagster.api.status import partition_state, superseded_by
from lakehouse_dagster.core.settings import mirror_freshness_seconds
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.shared.keys import ICEBERG_TABLE, PG_ROWS
from lakehouse_dagster.dagster.defs.shared.partition_metadata import (
    iceberg_standard,
    migration_state,
    postgres_standard,
    superseded_metadata,
)
from lakehouse_dagster.dagster.defs.shared.partitions import datasets_partitions
from lakehouse_dagster.dagster.defs.shared.refusals import fail_step
from lakehouse_dagster.dagster.defs.shared.tags import name_run, text


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
        named = name_run(context, conn, context.partition_key)
        try:
            ds = get_dataset(conn, context.partition_key)
        except Exception as exc:  # a partition whose dataset is gone: the reason, no stack
            fail_step(context, exc, retry=None)
        state = partition_state(conn, lakehouse.settings(), ds.id)
        standard = postgres_standard(conn, state) if state else {}
    return dg.MaterializeResult(
        metadata={**named, **pg_rows_metadata(ds), **standard}, data_version=dg.DataVersion(str(ds.rows_version))
    )


def dataset_names(ds) -> dict:
    """The dataset's name and id as text metadata (a partition list of uuids becomes readable)."""
    return {"dataset_name": text(ds.name), "dataset_id": text(ds.id)}


def pg_rows_metadata(ds) -> dict:
    """What a materialization of postgres/dataset_rows records (the asset and the batch job). Versions are text:
    Dagster plots numeric metadata across partitions as if it were one series."""
    return {
        **dataset_names(ds),
        "kind": ds.kind,
        "rows_version": text(ds.rows_version),
        "max_row_index": text(ds.max_row_index if ds.max_row_index is not None else "unknown"),
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
        "snapshot_id": text(r.snapshot_id),
        "source_version": text(r.source_version),
        "bytes_written": dg.MetadataValue.int(r.bytes),
        "files": dg.MetadataValue.int(r.files),
        "seconds": dg.MetadataValue.float(round(r.seconds, 3)),
        "rows_per_s": dg.MetadataValue.float(round(r.rows_per_s, 1)),
        "peak_rss_mb": dg.MetadataValue.float(round(peak_rss_mb(), 1)),
    }


def mirror_freshness_policy(seconds: int) -> dg.FreshnessPolicy | None:
    """Fail when no partition landed for ``seconds``, warn at a quarter of it (when that is a minute or more)."""
    if seconds <= 0:
        return None
    warn = dt.timedelta(seconds=seconds // 4) if seconds // 4 >= 60 else None
    return dg.FreshnessPolicy.time_window(fail_window=dt.timedelta(seconds=seconds), warn_window=warn)


@dg.asset(
    key=ICEBERG_TABLE,
    deps=[PG_ROWS],
    partitions_def=datasets_partitions,
    group_name="lakehouse",
    description="The dataset's Iceberg table, mirrored from Postgres in chunks and committed once.",
    kinds={"iceberg"},
    pool="iceberg_ingest",
    freshness_policy=mirror_freshness_policy(mirror_freshness_seconds()),
)
def iceberg_dataset_table(
    context: dg.AssetExecutionContext, config: MirrorConfig, lakehouse: LakehouseResource
) -> dg.MaterializeResult:
    settings = lakehouse.settings()
    # One sync id per run and partition: a retried step finds its own snapshot instead of appending twice.
    sync_id = run_sync_id(context.run_id, context.partition_key)
    try:
        with lakehouse.connect() as conn:
            named = name_run(context, conn, context.partition_key)
        r = sync_dataset(
            lakehouse.pg_dsn,
            lakehouse.catalog(),
            settings,
            context.partition_key,
            mode=config.mode,
            sync_id=sync_id,
            run_id=context.run_id,
        )
    except Exception as exc:
        # Fail loud either way: G2 backpressure and what a retry can fix (a connection, object-store I/O, a commit
        # conflict past its retries, a lost lock) come back later; bad data and bad input fail at once with the
        # reason and no stack (dagster/defs/shared/refusals.py). The retry reuses the sync id: a commit that landed is found.
        fail_step(context, exc)
    context.log.info(f"{r.mode}: {r.rows} rows → snapshot {r.snapshot_id} ({r.reason})")
    with lakehouse.connect() as conn:
        state = partition_state(conn, settings, r.dataset_id)
        newer = superseded_by(conn, r.dataset_id, r.snapshot_id)
    metadata = {**named, **iceberg_metadata(r), **table_now(state, r)}
    if newer is not None and state is not None:  # committed over since: the page shows the table now, not ours
        context.log.info(
            f"snapshot {newer} was committed after this sync's ({r.snapshot_id}): recorded as the table now"
        )
        metadata.update(superseded_metadata(state, r.snapshot_id, newer))
    return dg.MaterializeResult(metadata=metadata, data_version=dg.DataVersion(str(r.source_version)))


def table_now(state, r: SyncResult) -> dict:
    """The standard keys and the dataset's migration state after the sync ``r`` (the asset and the batch job):
    what the lakehouse_recorder's materializations carry too (dagster/defs/shared/partition_metadata.py)."""
    if state is None:  # the dataset was deleted meanwhile: its partition goes with the recorder's next prune
        return {}
    return {**iceberg_standard(state, r.total_rows), **migration_state(state)}


mirror_job = dg.define_asset_job(
    "mirror_job",
    selection=dg.AssetSelection.assets(PG_ROWS, ICEBERG_TABLE),
    partitions_def=datasets_partitions,
    # The steps of a run in one process: a step process would import the code location a second time.
    executor_def=dg.in_process_executor,
    description="Mirror one dataset partition from Postgres to Iceberg (by hand from the UI; the mirror poller "
    "launches mirror_batch_job, or this job per dataset with LAKEHOUSE_MIRROR_BATCH_SIZE=0).",
)
