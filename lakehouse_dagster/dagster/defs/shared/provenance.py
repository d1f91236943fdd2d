"""Why a dataset's iceberg/dataset_table partition shows "Unsynced" only when Iceberg is behind Postgres.

Dagster decides a partition is stale from the latest materialization's data provenance (its ``dagster/code_version``
and ``dagster/input_event_pointer/<dep>`` tags): stale when the dependency's records after that pointer carry another
data version than the record at it. Without provenance it compares timestamps: stale as soon as any newer
postgres/dataset_rows materialization exists. Ours are logged by many writers in no fixed order — the ingest op's after
its COPY while the stream has already mirrored it, a reverse apply, a backfill or a restore after the native commit
they copy — so a dataset in sync showed "Unsynced (1)" (issue 44). Every iceberg/dataset_table materialization we log
therefore carries provenance pointing at the postgres/dataset_rows record of the version the table holds, and every
postgres/dataset_rows materialization its rows_version as data version.

No record of that version yet (the mirror got there before anyone recorded it): the pointer is past every record,
so nothing recorded later makes it stale until the next materialization of the table, which the mirror logs for the
next change. A dataset whose truth is Iceberg (lifecycle native, completing, complete, restoring) is never behind
Postgres (status/lag.py): its pointer is past every record too, so a reverse apply or backfill copying Iceberg into
dataset_rows is not an upstream change. ``stale_check`` in test_ui_jobs.py reads the staleness as the UI does.
"""

import dagster as dg

from lakehouse_dagster.api import lifecycle
from lakehouse_dagster.dagster.defs.shared.keys import PG_ROWS

DATA_VERSION_TAG = "dagster/data_version"
CODE_VERSION = "lakehouse"  # no code version is declared on the assets: a constant, so it never reads as a change
PAST_EVERY_RECORD = 2**62  # a storage id no record reaches (Postgres bigint)
LOOK_BACK = 20  # postgres/dataset_rows records of the partition looked at for the table's version


def _version(record) -> int | None:
    tags = record.event_log_entry.tags or {}
    raw = tags.get(DATA_VERSION_TAG)
    return int(raw) if raw is not None and raw.lstrip("-").isdigit() else None


def rows_pointer(instance: dg.DagsterInstance, partition: str, version: int) -> int:
    """The storage id of the newest postgres/dataset_rows record of ``partition`` at ``version``; if only newer
    versions are recorded (Iceberg is behind), just below the oldest of them; if none is, past every record."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=PG_ROWS, asset_partitions=[partition]), limit=LOOK_BACK
    ).records  # newest first
    newer = None
    for r in records:
        v = _version(r)
        if v == version:
            return r.storage_id
        if v is not None and v > version:
            newer = r.storage_id
    return newer - 1 if newer is not None else PAST_EVERY_RECORD


def iceberg_holds_truth(state) -> bool:
    """Whether a dataset's PartitionState says Iceberg holds its truth (native, completing, complete, restoring)."""
    facts = getattr(state, "lifecycle", None)
    return facts is not None and lifecycle.AUTHORITY.get(facts.state) == lifecycle.ICEBERG


def table_provenance(
    instance: dg.DagsterInstance | None, partition: str, version: int | None, *, iceberg_truth: bool = False
) -> dict[str, str]:
    """The tags that make Dagster judge an iceberg/dataset_table materialization at Postgres ``version`` by data
    version (none without an instance or a version: the timestamps then decide, as before)."""
    if instance is None or version is None:
        return {}
    pointer = PAST_EVERY_RECORD if iceberg_truth else rows_pointer(instance, partition, version)
    dep = PG_ROWS.to_user_string()
    return {
        "dagster/code_version": CODE_VERSION,
        f"dagster/input_data_version/{dep}": str(version),
        f"dagster/input_event_pointer/{dep}": str(pointer),
        "dagster/data_version_is_user_provided": "true",
    }


def with_table_provenance(instance: dg.DagsterInstance | None, events, *, iceberg_truth: bool = False):
    """``events`` as they are logged, each iceberg/dataset_table materialization given its provenance only once the
    events before it (its own postgres/dataset_rows record) are stored: a generator, for a consumer that stores each
    event before asking for the next (an op's yield, ``dagster_log_now``)."""
    for event in events:
        if isinstance(event, dg.AssetMaterialization) and event.asset_key != PG_ROWS and instance is not None:
            version = (event.tags or {}).get(DATA_VERSION_TAG)
            if version is not None and version.lstrip("-").isdigit() and event.partition is not None:
                prov = table_provenance(instance, event.partition, int(version), iceberg_truth=iceberg_truth)
                event = dg.AssetMaterialization(
                    asset_key=event.asset_key,
                    partition=event.partition,
                    description=event.description,
                    metadata=event.metadata,
                    tags={**(event.tags or {}), **prov},
                )
        yield event
