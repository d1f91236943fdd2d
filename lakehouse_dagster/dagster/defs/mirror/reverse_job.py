"""reverse_mirror_job: the reverse mirror (mirror/reverse.py) of one native dataset, one run per snapshot, and the
materialization every reverse apply logs, whoever drives it.

The mirror stream applies the native commits of its shard itself (mirror/stream.py) and logs each apply as below.
Where no live stream covers a dataset (LAKEHOUSE_MIRROR_STREAM off, a shard down past the bound), the mirror_poller
sensor requests a run of this job for each due dataset, run key ``reverse:<dataset>:<snapshot>``: a snapshot is
applied by one run (a later snapshot is a new key), and a run that finds the dataset caught up already (the stream
got there first) is a no-op that logs nothing.

An apply is a materialization of the dataset's ``postgres/dataset_rows`` partition naming the snapshot applied
(``lakehouse/reverse_snapshot_id``), how (append / full), the rows copied, removed and held after it, and
``lakehouse/reverse`` true. Its data version stays the dataset's rows_version: the reverse moves no rows_version
(no echo), so Dagster does not call the dataset's Iceberg partition stale for rows that came from it.
"""

import uuid

import dagster as dg
import psycopg

from lakehouse_dagster.dagster.defs.mirror.assets import dataset_names
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.shared.keys import PG_ROWS
from lakehouse_dagster.dagster.defs.shared.partitions import datasets_partitions
from lakehouse_dagster.dagster.defs.shared.refusals import refuse
from lakehouse_dagster.dagster.defs.shared.tags import DATASET, name_run, text
from lakehouse_dagster.mirror.reverse import NOOP, ReverseResult, apply_reverse
from lakehouse_dagster.tracking.datasets import get_dataset

DATA_VERSION_TAG = "dagster/data_version"
REVERSE_TAG = "lakehouse/reverse"
SNAPSHOT_TAG = "lakehouse/reverse_snapshot_id"


def reverse_materialization(conn: psycopg.Connection, r: ReverseResult) -> dg.AssetMaterialization:
    """A reverse apply as a materialization of the dataset's postgres/dataset_rows partition."""
    ds = get_dataset(conn, r.dataset_id)
    what = "appended" if r.how == "append" else "re-synced in full"
    return dg.AssetMaterialization(
        asset_key=PG_ROWS,
        partition=str(r.dataset_id),
        description=f"Iceberg snapshot {r.snapshot_id} {what} into dataset_rows by the reverse mirror ({r.reason})",
        metadata={
            **dataset_names(ds),
            REVERSE_TAG: True,
            SNAPSHOT_TAG: text(r.snapshot_id),
            "lakehouse/reverse_how": r.how,
            "lakehouse/reverse_reason": text(r.reason),
            "rows_copied": r.copied,
            "rows_removed": r.removed,
            "dagster/row_count": r.pg_rows,
            "seconds": round(r.seconds, 3),
            "rows_version": text(ds.rows_version),
        },
        tags={DATA_VERSION_TAG: str(ds.rows_version)},
    )


def reverse_run_key(dataset_id: uuid.UUID, snapshot_id: int | None) -> str:
    """One run per (dataset, snapshot): a run key deduplicates forever, and the next snapshot is a new key."""
    return f"reverse:{dataset_id}:{snapshot_id if snapshot_id is not None else 'none'}"


def reverse_run_request(
    dataset_id: uuid.UUID, snapshot_id: int | None, named: dict[uuid.UUID, dict[str, str]] | None = None
) -> dg.RunRequest:
    tags = {
        DATASET: str(dataset_id),
        **(named or {}).get(dataset_id, {}),
        SNAPSHOT_TAG: str(snapshot_id) if snapshot_id is not None else "",
    }
    return dg.RunRequest(
        job_name=reverse_mirror_job.name,
        run_key=reverse_run_key(dataset_id, snapshot_id),
        partition_key=str(dataset_id),
        tags={k: v for k, v in tags.items() if v},
    )


@dg.op(
    out={},
    description="Apply the dataset's native Iceberg commits to dataset_rows (mirror/reverse.py), once; a "
    "materialization of its postgres/dataset_rows partition names the snapshot applied.",
)
def reverse_apply_op(context: dg.OpExecutionContext, lakehouse: LakehouseResource):
    ds_id = context.partition_key
    with lakehouse.connect() as conn:
        name_run(context, conn, ds_id)
        try:
            r = apply_reverse(lakehouse.pg_dsn, lakehouse.catalog(), lakehouse.settings(), ds_id, lock_timeout_s=60)
        except Exception as exc:  # the reason, one line: the run fails, the poller asks again after its backoff
            raise refuse(f"reverse apply of {ds_id} failed: {type(exc).__name__}: {exc}") from None
        context.log.info(r.summary())
        if r.how != NOOP:  # caught up already (the stream, or an earlier run, got there first): nothing to log
            yield reverse_materialization(conn, r)


@dg.job(
    partitions_def=datasets_partitions,
    executor_def=dg.in_process_executor,
    description="Apply one native dataset's Iceberg commits to dataset_rows (the reverse mirror), requested by the "
    "mirror_poller sensor for the datasets no live mirror stream covers.",
)
def reverse_mirror_job():
    reverse_apply_op()
