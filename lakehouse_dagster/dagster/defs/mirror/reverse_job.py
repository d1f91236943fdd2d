"""reverse_mirror_job: the reverse mirror (mirror/reverse.py) of one native dataset, one run per snapshot, and the
materialization every reverse apply logs, whoever drives it.

The mirror stream applies the native commits of its shard itself (mirror/stream.py) and logs each apply as below.
Where no live stream covers a dataset (LAKEHOUSE_MIRROR_STREAM off, a shard down past the bound), the mirror_poller
sensor requests a run of this job for each due dataset, run key ``reverse:<dataset>:<snapshot>``: a snapshot is
applied by one run (a later snapshot is a new key), and a run that finds the dataset caught up already (the stream
got there first) is a no-op that logs nothing. A run key deduplicates forever, so a run that failed (or was
canceled) at a snapshot is retried under a key of its own, ``reverse:<dataset>:<snapshot>:attempt:<n>``, ``n`` one
more than the failed runs of that dataset at that snapshot (the instance's runs, tags lakehouse/dataset and
lakehouse/reverse_snapshot_id): after the mirror poller's backoff (LAKEHOUSE_RETRY_FAILED_AFTER_SECONDS, doubling per
failure), at most LAKEHOUSE_RETRY_FAILED_MAX times per snapshot, and never while a run of the dataset is in flight
(``reverse_retries``).

An apply is a materialization of the dataset's ``postgres/dataset_rows`` partition naming the snapshot applied
(``lakehouse/reverse_snapshot_id``), how (append / full), the rows copied, removed and held after it, and
``lakehouse/reverse`` true. Its data version stays the dataset's rows_version: the reverse moves no rows_version
(no echo), so Dagster does not call the dataset's Iceberg partition stale for rows that came from it.
"""

import dataclasses
import uuid

import dagster as dg
import psycopg

from lakehouse_dagster.api.datasets import get_dataset
from lakehouse_dagster.api.mirror import backoff_seconds
from lakehouse_dagster.api.reverse import NOOP, ReverseResult, apply_reverse, position
from lakehouse_dagster.api.status import newer_than, sync_order
from lakehouse_dagster.dagster.defs.mirror.assets import dataset_names
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.shared.keys import PG_ROWS
from lakehouse_dagster.dagster.defs.shared.partitions import datasets_partitions
from lakehouse_dagster.dagster.defs.shared.refusals import refuse
from lakehouse_dagster.dagster.defs.shared.tags import DATASET, name_run, text

DATA_VERSION_TAG = "dagster/data_version"
REVERSE_TAG = "lakehouse/reverse"
SNAPSHOT_TAG = "lakehouse/reverse_snapshot_id"
ATTEMPT_TAG = "lakehouse/attempt"
# A run in one of these may still do its work (sensors.IN_FLIGHT: the one list, here because sensors imports this).
IN_FLIGHT_STATUSES = (
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
)


def reverse_materialization(conn: psycopg.Connection, r: ReverseResult, log=None) -> dg.AssetMaterialization | None:
    """A reverse apply as a materialization of the dataset's postgres/dataset_rows partition; None when a later
    apply has moved the reverse position past its snapshot since (the event written late: the page is never put
    back to an older snapshot, status/page_order.py). ``log``: the run's, for the line saying so."""
    now = position(conn, r.dataset_id)
    if now is not None and now.snapshot_id is not None and r.snapshot_id is not None:
        order = sync_order(conn, [(r.dataset_id, r.snapshot_id), (r.dataset_id, now.snapshot_id)])
        if newer_than(order, r.dataset_id, now.snapshot_id, r.snapshot_id):
            if log is not None:
                log.info(
                    f"{r.dataset_id}: the apply of snapshot {r.snapshot_id} is not recorded: the reverse mirror has "
                    f"applied snapshot {now.snapshot_id}, committed after it, since"
                )
            return None
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


def reverse_run_key(dataset_id: uuid.UUID, snapshot_id: int | None, attempt: int = 1) -> str:
    """One run per (dataset, snapshot, attempt): a run key deduplicates forever, so the next snapshot, and a retry
    after a failed run, is a new key (the first attempt keeps the key it always had)."""
    key = f"reverse:{dataset_id}:{snapshot_id if snapshot_id is not None else 'none'}"
    return key if attempt <= 1 else f"{key}:attempt:{attempt}"


def reverse_run_request(
    dataset_id: uuid.UUID,
    snapshot_id: int | None,
    named: dict[uuid.UUID, dict[str, str]] | None = None,
    attempt: int = 1,
) -> dg.RunRequest:
    tags = {
        DATASET: str(dataset_id),
        **(named or {}).get(dataset_id, {}),
        SNAPSHOT_TAG: str(snapshot_id) if snapshot_id is not None else "",
        ATTEMPT_TAG: str(attempt) if attempt > 1 else "",
    }
    return dg.RunRequest(
        job_name=reverse_mirror_job.name,
        run_key=reverse_run_key(dataset_id, snapshot_id, attempt),
        partition_key=str(dataset_id),
        tags={k: v for k, v in tags.items() if v},
    )


@dataclasses.dataclass(frozen=True)
class ReverseAsk:
    """What the poller asks of one due dataset: a run (its attempt), or nothing and why."""

    dataset_id: uuid.UUID
    snapshot_id: int | None
    attempt: int | None  # None: nothing asked this tick
    why: str = ""


def reverse_retries(
    instance: dg.DagsterInstance,
    due: list[uuid.UUID],
    snapshots: dict[uuid.UUID, int | None],
    *,
    after_seconds: int,
    max_retries: int,
    now: float,
) -> list[ReverseAsk]:
    """For each due dataset, the attempt to ask for at its snapshot (one query over the instance's reverse runs of
    those datasets): 1 when no run of it failed there; n + 1 after n failed or canceled runs, once the last one
    ended ``after_seconds`` (doubling per failure) ago and while n <= ``max_retries``; nothing while a run of the
    dataset is in flight (queued or running: it holds the dataset, whatever its snapshot)."""
    if not due:
        return []
    records = instance.get_run_records(
        dg.RunsFilter(
            job_name=reverse_mirror_job.name,
            tags={DATASET: [str(d) for d in due]},
            statuses=[*IN_FLIGHT_STATUSES, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED],
        )
    )
    busy: set[str] = set()
    failed: dict[tuple[str, str], list[float]] = {}
    for r in records:
        tags = r.dagster_run.tags
        if r.dagster_run.status in IN_FLIGHT_STATUSES:
            busy.add(tags.get(DATASET, ""))
        else:
            ended = r.end_time or r.update_timestamp.timestamp()
            failed.setdefault((tags.get(DATASET, ""), tags.get(SNAPSHOT_TAG, "")), []).append(ended)
    out = []
    for d in due:
        snap = snapshots.get(d)
        ends = failed.get((str(d), str(snap) if snap is not None else ""), [])
        n = len(ends)
        if str(d) in busy:
            out.append(ReverseAsk(d, snap, None, "a reverse run of it is in flight"))
        elif n == 0:
            out.append(ReverseAsk(d, snap, 1))
        elif after_seconds <= 0 or n > max_retries:
            out.append(ReverseAsk(d, snap, None, f"{n} run(s) failed at snapshot {snap}; retries are used up"))
        elif now - max(ends) < backoff_seconds(after_seconds, n):
            out.append(ReverseAsk(d, snap, None, f"{n} run(s) failed at snapshot {snap}; retried after the backoff"))
        else:
            out.append(ReverseAsk(d, snap, n + 1))
    return out


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
        event = reverse_materialization(conn, r, context.log) if r.how != NOOP else None
        if event is not None:  # NOOP: caught up already (the stream, or an earlier run, got there first)
            yield event


@dg.job(
    partitions_def=datasets_partitions,
    executor_def=dg.in_process_executor,
    description="Apply one native dataset's Iceberg commits to dataset_rows (the reverse mirror), requested by the "
    "mirror_poller sensor for the datasets no live mirror stream covers.",
)
def reverse_mirror_job():
    reverse_apply_op()
