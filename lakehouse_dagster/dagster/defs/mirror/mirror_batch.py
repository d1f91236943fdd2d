"""mirror_batch_job: many changed datasets mirrored in one run, one process (what the mirror poller launches).

A Dagster run per dataset cost seconds of process start-up for a sub-second sync (issue 11). This job's one op
mirrors a list of datasets (mirror/batch.py) and keeps the asset's partitions true: each dataset that lands
logs a materialization of its `postgres/dataset_rows` and `iceberg/dataset_table` partitions with the same
metadata as mirror_job, at once, and after the syncs the three asset checks of each mirrored dataset are evaluated
and logged against its partition (recorded in lakehouse_read_parity as the asset checks are). A dataset that fails
fails the run (loudly, after the others have landed); the poller's sweep retries it alone. A blocking check that ends
ERROR (a parity MISMATCH, identity not ready) fails the run too, naming the datasets, after every dataset landed.
"""

import dagster as dg

from lakehouse_dagster.api.datasets import get_dataset, name_of
from lakehouse_dagster.api.mirror import Failed, mirror_many
from lakehouse_dagster.api.parity import wedged_syncs
from lakehouse_dagster.api.status import partition_state, superseded_by
from lakehouse_dagster.dagster.defs.mirror.assets import (
    dataset_names,
    iceberg_metadata,
    pg_rows_metadata,
    table_now,
)
from lakehouse_dagster.dagster.defs.parity.checks import check_evaluations
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.shared.keys import ICEBERG_TABLE, PG_ROWS
from lakehouse_dagster.dagster.defs.shared.partition_metadata import latest_metadata, postgres_standard
from lakehouse_dagster.dagster.defs.shared.provenance import with_table_provenance
from lakehouse_dagster.dagster.defs.shared.refusals import check_errors_line, refuse
from lakehouse_dagster.dagster.defs.shared.tags import text
from lakehouse_dagster.dagster.launcher.event_writes import pooled_event_writes

DATASETS_TAG = "lakehouse/datasets"  # comma-separated dataset ids of a batch run (the poller's in-flight test)
DATA_VERSION_TAG = "dagster/data_version"


class MirrorBatchConfig(dg.Config):
    """The datasets (uuids) to mirror, and how: auto (incremental when only appends happened, else full)."""

    datasets: list[str]
    mode: str = "auto"


@dg.op(
    out={},
    pool="iceberg_ingest",
    description="Mirror each listed dataset from Postgres to Iceberg (one commit each), then run its checks.",
)
def mirror_datasets(context: dg.OpExecutionContext, config: MirrorBatchConfig, lakehouse: LakehouseResource):
    # A generator: each dataset's materializations are recorded as it lands, even if a later one fails.
    catalog, settings = lakehouse.catalog(), lakehouse.settings()
    synced, failed = [], []
    # One connection for the op's own reads and every dataset's checks; Dagster's event storage keeps its
    # connections while the op logs five events per dataset (launcher/event_writes.py).
    with pooled_event_writes(context.instance), lakehouse.connect() as conn:
        for item in mirror_many(
            lakehouse.pg_dsn, catalog, settings, config.datasets, run_id=context.run_id, mode=config.mode
        ):
            if isinstance(item, Failed):
                failed.append((dataset_name_of(conn, item.dataset_id), item))
                context.log.error(f"{failed[-1][0]} ({item.dataset_id}) failed: {item.error}")
                continue
            synced.append(item)
            yield from with_table_provenance(
                context.instance, synced_materializations(conn, settings, item, context.log, context.instance)
            )
        # One summary line, not one per dataset: each log line is an event the instance stores (the
        # materializations above carry each dataset's mode, rows and snapshot).
        modes = {m: sum(1 for r in synced if r.mode == m) for m in dict.fromkeys(r.mode for r in synced)}
        context.log.info(f"{len(synced)} of {len(config.datasets)} datasets mirrored ({modes}); checking them")
        wedged = {
            w["dataset_id"] for w in wedged_syncs(conn, settings.mirror.wedged_after_seconds)
        }  # once, not per dataset
        verdicts: dict[str, int] = {}
        logged: list[dg.AssetCheckEvaluation] = []
        for r in synced:
            evaluations = check_evaluations(
                lakehouse,
                str(r.dataset_id),
                run_id=context.run_id,
                log=context.log,
                instance=context.instance,
                conn=conn,
                wedged=wedged,
            )
            for e in evaluations:
                if not e.passed:
                    verdicts[e.check_name] = verdicts.get(e.check_name, 0) + 1
            logged += evaluations
            yield from evaluations
        if synced:
            context.log.info(
                f"checks of {len(synced)} datasets: "
                + (", ".join(f"{n} {name} failed" for name, n in verdicts.items()) or "all passed")
            )
    problems = []
    if failed:
        names = "; ".join(f"{name} ({f.dataset_id}): {f.error}" for name, f in failed[:5])
        problems.append(
            f"{len(failed)} of {len(config.datasets)} datasets failed ({names}); the others landed, "
            "and the mirror poller retries the failed ones"
        )
    checks_line = check_errors_line(logged, len(synced))
    if checks_line:
        problems.append(checks_line)
    if problems:
        raise refuse("\n".join(problems)) from None


def synced_materializations(conn, settings, item, log=None, instance=None) -> list[dg.AssetMaterialization]:
    """A landed sync (mirror/sync.SyncResult) as the materializations of its dataset's two partitions, with the
    metadata mirror_job records (a batch run and a stream run log the same). None when the table has moved on since
    (a commit after this sync's, before its event is written: a stream's glue busy with checks while the writer
    was flipped and written natively): its pages are never put back to an older snapshot (status/page_order.py);
    the newer commit's writer, or the lakehouse_recorder, records the table now. ``log``: the run's, for the line
    saying so. ``instance``: the postgres/dataset_rows materialization is left out when that partition already
    shows a newer rows_version (the mirror poller recorded a newer change of the app's while this sync ran)."""
    newer = superseded_by(conn, item.dataset_id, item.snapshot_id)
    if newer is not None:
        if log is not None:
            log.info(
                f"{item.dataset_id}: snapshot {item.snapshot_id} of this sync is not recorded as the table now: "
                f"snapshot {newer} was committed after it (its page shows that one)"
            )
        return []
    key, version = str(item.dataset_id), str(item.source_version)
    ds = get_dataset(conn, item.dataset_id)
    state = partition_state(conn, settings, item.dataset_id)
    shown = latest_metadata(instance, PG_ROWS, {key}, "rows_version").get(key) if instance is not None else None
    rows_event = dg.AssetMaterialization(
        asset_key=PG_ROWS,
        partition=key,
        metadata={
            **pg_rows_metadata(ds),
            "rows_version": text(item.source_version),
            **(postgres_standard(conn, state, item.total_rows) if state else {}),
        },
        tags={DATA_VERSION_TAG: version},
    )
    table_event = dg.AssetMaterialization(
        asset_key=ICEBERG_TABLE,
        partition=key,
        metadata={**dataset_names(ds), **iceberg_metadata(item), **table_now(state, item)},
        tags={DATA_VERSION_TAG: version},
    )
    if shown is not None and shown.lstrip("-").isdigit() and int(shown) > item.source_version:
        return [table_event]  # the rows page already shows a newer version: never put it back
    return [rows_event, table_event]


def dataset_name_of(conn, dataset_id) -> str:
    """A failed dataset's name for its message (operators know names; the id follows it)."""
    return name_of(conn, dataset_id, "(deleted dataset)")


@dg.job(
    executor_def=dg.in_process_executor,
    description="Mirror several datasets in one run, one process (launched by the mirror poller; "
    "each dataset's partition of iceberg/dataset_table is materialized and checked).",
)
def mirror_batch_job():
    mirror_datasets()
