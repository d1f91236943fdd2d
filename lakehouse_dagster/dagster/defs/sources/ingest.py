"""Source ingest in Dagster: the `ingest_job` (one dataset partition, typed config: writer) and the
`source_poller` sensor that requests it when a dataset's source has something new.

The op calls ``runbooks.first_sync.checked_write`` (``run_writer``, its first native write canaried) — the same function as `lakehouse ingest` — which resolves
the writer's flag: the native path commits to the Iceberg table (materialization of
iceberg/dataset_table), the pg path COPYs into dataset_rows (materialization of postgres/dataset_rows)
and leaves Iceberg to the mirror: the pg write moves the dataset's rows_version, so the mirror_poller
requests the mirror run on its next tick (one place decides when the mirror runs, with its retries
and per-partition queue). The path and the flag's reason go into the materialization metadata and
the run's tags. (No ``from __future__ import annotations`` here: Dagster reads the Config annotations
at runtime.)
"""

import uuid
from enum import Enum
from typing import Any, Optional

import dagster as dg
from pydantic import Field

from lakehouse_dagster.api.flags import FlagResolver
from lakehouse_dagster.api.flips import checked_write
from lakehouse_dagster.api.mirror import peak_rss_mb
from lakehouse_dagster.api.sources import WRITERS, get_source, pending_ingests
from lakehouse_dagster.api.status import partition_state, superseded_by
from lakehouse_dagster.core.errors import BadInput
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.shared.keys import ICEBERG_TABLE, PG_ROWS
from lakehouse_dagster.dagster.defs.shared.outage import skip_while_postgres_is_down
from lakehouse_dagster.dagster.defs.shared.partition_metadata import (
    iceberg_standard,
    migration_state,
    postgres_standard,
)
from lakehouse_dagster.dagster.defs.shared.partitions import DATASETS, datasets_partitions
from lakehouse_dagster.dagster.defs.shared.provenance import DATA_VERSION_TAG, table_provenance
from lakehouse_dagster.dagster.defs.shared.refusals import fail_step
from lakehouse_dagster.dagster.defs.shared.tags import WRITER, datasets_tags, name_run, text

SourceWriter = Enum("SourceWriter", {w: w for w in WRITERS})  # type: ignore[misc]  # built from the registry


class IngestConfig(dg.Config):
    writer: Optional[SourceWriter] = Field(
        default=None,
        description="the writer to run; empty = the source's default (files: sync.append, postgres "
        "with a cursor: sync.incremental, without: sync.full, cdc: cdc.append)",
    )


@dg.op(
    description="Run a source writer for the partition's dataset through the write router: pg (dataset_rows; the "
    "mirror poller then mirrors it) or iceberg_native (straight to the Iceberg table).",
    pool="iceberg_ingest",
)
def ingest_op(context: dg.OpExecutionContext, config: IngestConfig, lakehouse: LakehouseResource) -> dict:

    settings = lakehouse.settings()
    ds_id = context.partition_key
    # One sync id per run and partition: a retried step finds its own native commit instead of appending twice.
    sync_id = uuid.uuid5(uuid.NAMESPACE_URL, f"lakehouse:ingest:{context.run_id}:{ds_id}")
    try:
        with lakehouse.connect() as conn:
            named = name_run(context, conn, ds_id)
            writer = config.writer.value if config.writer else _default_writer(get_source(conn, ds_id), ds_id)
            checked = checked_write(
                conn,
                lakehouse.pg_dsn,
                lakehouse.catalog(),
                settings,
                FlagResolver(conn, ttl_seconds=0),
                ds_id,
                writer,
                sync_id=sync_id,
                run_id=context.run_id,
                logger=context.log,
            )
            r = checked.result
            for line in checked.lines():  # the dataset's first native write: its canary and any auto-rollback
                (context.log.error if checked.first_native and checked.first_native.problem else context.log.info)(line)
            state = partition_state(conn, settings, r.dataset_id)
            standard = _partition_metadata(conn, state, r)
            # a native commit another writer has committed over since: not recorded as the table now (the newer
            # commit's writer, or the lakehouse_recorder, records that; status/page_order.py)
            newer = superseded_by(conn, r.dataset_id, r.snapshot_id) if r.path == "native" and r.new else None
    except Exception as exc:
        # Like the mirror asset: G2 backpressure and what a retry can fix (errors.is_transient: a connection,
        # object-store I/O, a lost lock, an unknown commit outcome) come back later; bad data, bad input and refusals
        # fail at once with the one-line reason and no stack trace. The retry reuses the sync id.
        fail_step(context, exc)
    tags = {WRITER: r.writer, "lakehouse/write_path": r.path, "lakehouse/flag_reason": r.flag_reason[:200]}
    context.instance.add_run_tags(context.run_id, tags)
    metadata: dict[str, Any] = {
        **named,
        "writer": r.writer,
        "path": r.path,
        "flag_reason": r.flag_reason,
        "new": r.new,
        "rows": dg.MetadataValue.int(r.rows),
        "total_rows": dg.MetadataValue.int(r.total_rows if r.total_rows is not None else -1),
        "cursor": dg.MetadataValue.json(r.cursor if isinstance(r.cursor, (dict, list)) else {"cursor": r.cursor}),
        "sync_id": text(r.sync_id or ""),
        "seconds": dg.MetadataValue.float(round(r.seconds, 3)),
        "rows_per_s": dg.MetadataValue.float(round(r.rows / r.seconds, 1) if r.seconds > 0 else 0.0),
        "peak_rss_mb": dg.MetadataValue.float(round(peak_rss_mb(), 1)),
        **standard,
    }
    if r.path == "native":
        metadata["snapshot_id"] = text(r.snapshot_id)
        if r.compacted_rows:  # why the commit rewrote more than the source gave
            metadata["compacted"] = (
                f"{r.compacted_rows} row(s) of the native run's small files rewritten with the new "
                "rows in the same commit (native compaction)"
            )
    else:
        metadata["mirror"] = "the mirror_poller mirrors the new rows to Iceberg on its next tick"
    if newer is not None:
        context.log.info(
            f"{r.writer}: snapshot {r.snapshot_id} is not recorded as the table now: snapshot {newer} was committed "
            "after it (its page shows that one)"
        )
    elif r.new:
        context.log_event(
            dg.AssetMaterialization(
                asset_key=ICEBERG_TABLE if r.path == "native" else PG_ROWS,
                partition=ds_id,
                metadata=metadata,
                description=f"{r.writer} → {r.path} ({r.flag_reason})",
                tags=_version_tags(context.instance, state, r),
            )
        )
    else:
        context.log.info(f"{r.writer}: the source has nothing new for {ds_id}; nothing written")
    context.add_output_metadata(metadata)
    return r.to_json()


def _partition_metadata(conn, state, r) -> dict:
    """The standard keys of the asset the write landed in, and for a native write the dataset's migration state
    (dagster/defs/shared/partition_metadata.py: what the lakehouse_recorder's materializations carry too)."""
    if state is None:
        return {}
    if r.path == "native":
        return {**iceberg_standard(state, r.total_rows), **migration_state(state)}
    return postgres_standard(conn, state)


def _version_tags(instance, state, r) -> dict[str, str]:
    """The data version of what the write left (Postgres' rows_version; a native commit: the version its table holds)
    and, for a native commit, its provenance: never "Unsynced" for a copy of it in dataset_rows (shared/provenance.py)."""
    if state is None:
        return {}
    if r.path != "native":
        return {DATA_VERSION_TAG: str(state.rows_version)}
    version = state.table.source_version if state.table is not None else None
    if version is None:
        return {}
    return {
        DATA_VERSION_TAG: str(version),
        **table_provenance(instance, str(r.dataset_id), version, iceberg_truth=True),
    }


def _default_writer(spec, ds_id: str) -> str:
    if spec is None:
        raise BadInput(
            f"dataset {ds_id} has no source; set one with: lakehouse sources set --dataset {ds_id} "
            "(--files ... | --postgres-table ... | --postgres-query ... | --cdc-table ...)"
        )
    return spec.default_writer


@dg.job(
    name="ingest_job",
    partitions_def=datasets_partitions,
    description="Ingest one dataset partition from its source with a source writer (sync.full, sync.append, "
    "sync.incremental, cdc.append) on the path its write flag says: pg or iceberg_native.",
    tags={"lakehouse/area": "ingest"},
)
def ingest_job():
    ingest_op()


@dg.sensor(
    job=ingest_job,
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Requests an ingest run for each dataset whose source has new files / rows / changes "
    "(run key names what is new), at most LAKEHOUSE_SENSOR_MAX_REQUESTS per tick.",
)
@skip_while_postgres_is_down
def source_poller(context: dg.SensorEvaluationContext, lakehouse: LakehouseResource):
    settings = lakehouse.settings()
    found, nxt, visited = pending_ingests(
        lakehouse.pg_dsn, settings, context.cursor, limit=settings.mirror.sensor_max_requests
    )
    with lakehouse.connect() as conn:
        named = datasets_tags(conn, [p.dataset_id for p in found])
    known = set(context.instance.get_dynamic_partitions(DATASETS))
    new_keys = sorted({str(p.dataset_id) for p in found} - known)
    requests = [
        dg.RunRequest(
            run_key=p.run_key,
            partition_key=str(p.dataset_id),
            run_config={"ops": {"ingest_op": {"config": {"writer": p.writer}}}},
            tags={
                **named.get(p.dataset_id, {}),
                WRITER: p.writer,
                "lakehouse/write_path": "native" if p.mode == "iceberg_native" else "pg",
                "lakehouse/flag_reason": p.reason[:200],
                "lakehouse/source_news": p.token[:200],
            },
        )
        for p in found
    ]
    (context.log.info if requests else context.log.debug)(  # nothing asked: the tick's log only, not the console
        f"visited {visited} datasets with a source, requesting {len(requests)} ingests"
    )
    return dg.SensorResult(
        run_requests=requests,
        dynamic_partitions_requests=[datasets_partitions.build_add_request(new_keys)] if new_keys else [],
        cursor=nxt,
    )
