"""The metadata every materialization and observation of a dataset partition carries, built in one place for the
runs (mirror_job, mirror_batch_job, ingest_job) and the lakehouse_recorder sensor, so the partition page says the
same things whoever made the change.

Dagster's standard keys (the UI shows them as the row count, the column schema, the table's name and location):
``dagster/row_count``, ``dagster/column_schema`` (the dataset's typed schema plus the identity columns),
``dagster/table_name``, ``dagster/uri`` (never a secret: no user or password). Then the migration's state for the
dataset: each reader's and writer's effective mode and why (a table, plus two one-line summaries) and the newest
parity verdict (with when it was checked: a verdict is only known as of its check) and the newest read fallback.
Identifiers stay text (dagster/defs/shared/tags.py: numeric metadata is plotted across partitions).
"""

from __future__ import annotations

import dagster as dg
import psycopg

from lakehouse_dagster.api.datasets import Column
from lakehouse_dagster.api.flags import CLAMPED, READ, Resolution
from lakehouse_dagster.api.lake import IDENTITY_COLUMNS, IDENTITY_DESCRIPTIONS
from lakehouse_dagster.api.status import PartitionState, pg_row_count, safe_uri
from lakehouse_dagster.dagster.defs.shared.tags import text

ROW_COUNT = "dagster/row_count"
COLUMN_SCHEMA = "dagster/column_schema"
TABLE_NAME = "dagster/table_name"
URI = "dagster/uri"

# dataset_rows keeps the identity under its own names (the Iceberg table's are prefixed __).
_PG_IDENTITY = (
    ("row_index", "int64", "identity: the row's position in the dataset"),
    ("row_id", "uuid", "identity: the row's uuid"),
    ("created_at", "timestamp", "identity: when the row was first written"),
)

_FLAG_SCHEMA = dg.TableSchema(
    columns=[
        dg.TableColumn("kind", "string", description="reader or writer"),
        dg.TableColumn("name", "string", description="the reader or writer (the runbooks' names)"),
        dg.TableColumn("mode", "string", description="its effective mode for this dataset (clamped)"),
        dg.TableColumn("reason", "string", description="why: which override, the registry default, or the clamp"),
    ]
)


def column_schema(columns: tuple[Column, ...] | list[Column]) -> dg.TableSchema:
    """The Iceberg table's columns: the identity columns, then the dataset's typed schema (its own type names)."""
    return dg.TableSchema(
        columns=[dg.TableColumn(c.name, c.type, description=IDENTITY_DESCRIPTIONS[c.name]) for c in IDENTITY_COLUMNS]
        + [dg.TableColumn(c.name, c.type) for c in columns]
    )


def pg_column_schema(columns: tuple[Column, ...] | list[Column]) -> dg.TableSchema:
    """dataset_rows for one dataset: the identity columns, then the typed fields of its jsonb ``data``."""
    return dg.TableSchema(
        columns=[dg.TableColumn(n, t, description=d) for n, t, d in _PG_IDENTITY]
        + [dg.TableColumn(c.name, c.type, description="a field of data (jsonb)") for c in columns]
    )


def iceberg_standard(state: PartitionState, row_count: int | None = None) -> dict:
    """The standard keys of an iceberg/dataset_table materialization. ``row_count``: the caller's (the sync it just
    made), else the table's as its latest succeeded sync left it."""
    rows = row_count if row_count is not None else (state.table.rows if state.table else None)
    out: dict = {COLUMN_SCHEMA: column_schema(state.columns), TABLE_NAME: text(state.table_name)}
    if rows is not None:
        out[ROW_COUNT] = dg.MetadataValue.int(int(rows))
    uri = safe_uri(state.table.location) if state.table else None
    if uri:
        out[URI] = text(uri)
    return out


def postgres_standard(conn: psycopg.Connection, state: PartitionState, row_count: int | None = None) -> dict:
    """The standard keys of a postgres/dataset_rows materialization: the dataset's rows in ``dataset_rows`` of the
    project's database (its address without user or password). ``row_count``: the caller's exact count (a mirror
    sync's), else counted here (datasets.row_count does not follow the app's own writes)."""
    info = conn.info
    host = f"{info.host}:{info.port}" if info.host and not info.host.startswith("/") else ""
    rows = row_count if row_count is not None else pg_row_count(conn, state.dataset_id)
    return {
        ROW_COUNT: dg.MetadataValue.int(int(rows)),
        COLUMN_SCHEMA: pg_column_schema(state.columns),
        TABLE_NAME: text(f"{info.dbname}.dataset_rows"),
        URI: text(f"postgresql://{host}/{info.dbname}?table=dataset_rows&dataset_id={state.dataset_id}"),
    }


def migration_state(state: PartitionState) -> dict:
    """Each reader's and writer's effective mode and why, and the newest verdict: what the partition page says
    about the dataset's place in the migration."""
    on_iceberg = [r.name for r in state.flags if r.kind == READ and r.mode in ("iceberg", "iceberg_only")]
    native = [r.name for r in state.flags if r.kind != READ and r.mode == "iceberg_native"]
    records = [
        dg.TableRecord(
            {"kind": "reader" if r.kind == READ else "writer", "name": r.name, "mode": r.mode, "reason": _why(r)}
        )
        for r in state.flags
    ]
    life = state.lifecycle
    return {
        "lifecycle": text(f"{life.describe()}, {life.authority} is its truth" if life else "not recorded yet"),
        "lifecycle_version": dg.MetadataValue.int(state.lifecycle_version or 0),
        "readers_on_iceberg": text(", ".join(on_iceberg) or "none (every reader serves Postgres)"),
        "writers_native": text(", ".join(native) or "none (every writer lands in Postgres)"),
        "flags": dg.MetadataValue.table(records, schema=_FLAG_SCHEMA),
        # Resolved when this event was recorded: every later change of a mode records a new event (the recorder).
        "modes_as_of": text(state.read_at.isoformat(timespec="seconds")),
        "latest_verdict": text(state.verdict["verdict"] if state.verdict else "none"),
        "latest_verdict_as_of": text(state.verdict_as_of()),
        "latest_verdict_detail": text(state.verdict_line()),
        "latest_fallback": text(state.fallback_line()),
        # Issue 43: the compute readers' shadow consistency, as of this event (modes_as_of); the flip gate reads it live.
        "shadow_consistency": text(state.shadow_line()),
    }


def _why(r: Resolution) -> str:
    return f"{CLAMPED}: the {r.source} says {r.stored_mode}" if r.reason == CLAMPED else r.reason


def names(state: PartitionState) -> dict:
    """The dataset's name and id (and workspace) as text: a partition list of uuids becomes readable."""
    out = {"dataset_name": text(state.name), "dataset_id": text(state.dataset_id)}
    if state.workspace:
        out["workspace"] = text(state.workspace)
    return out


def written_by(state: PartitionState) -> str:
    """Who made the table's latest succeeded sync, in words: a mirror sync or a native write, a run or not."""
    t = state.table
    assert t is not None
    how = f"mirror sync ({t.mode})" if t.path == "mirror" else f"native write by {t.writer} ({t.mode})"
    who = f"dagster run {t.run_id}" if t.run_id else "outside Dagster (the lakehouse CLI, the service or a script)"
    return f"{how}, {who}"


def latest_sync_metadata(state: PartitionState) -> dict:
    """The table as its latest succeeded sync left it, in the keys a run's materialization uses, with Dagster's
    standard keys (none when the dataset was never synced): what the recorder's events carry, and a run's event
    whose own commit was superseded before it was written (``superseded_metadata``)."""
    t = state.table
    if t is None:
        return {}
    metadata: dict = {
        "path": t.path,
        "mode": t.mode or "",
        "writer": t.writer,
        "snapshot_id": text(t.snapshot_id),
        "source_version": text(t.source_version),
        "sync_id": text(t.sync_id),
        "written_by": text(written_by(state)),
        "finished_at": text(t.finished_at.isoformat(timespec="seconds") if t.finished_at else None),
        **iceberg_standard(state),
    }
    if t.rows is not None:
        metadata["total_rows"] = dg.MetadataValue.int(int(t.rows))
    if t.bytes is not None:
        metadata["bytes_written"] = dg.MetadataValue.int(int(t.bytes))
    if t.seconds is not None:
        metadata["seconds"] = dg.MetadataValue.float(round(t.seconds, 3))
    return metadata


def superseded_metadata(state: PartitionState, own_snapshot_id: int | None, newer: int) -> dict:
    """A run's event whose own commit (``own_snapshot_id``) is older than the table now (``newer``, committed after it
    and before the event was written): it shows the table now, never the older snapshot as if it were current, and
    says what the run committed (status/page_order.py). For the events a run must write (an asset's output)."""
    return {
        **latest_sync_metadata(state),
        "superseded_snapshot_id": text(own_snapshot_id),
        "superseded": text(
            f"this run committed snapshot {own_snapshot_id}; snapshot {newer} was committed after it, before this "
            "event was written: the event shows the table now"
        ),
    }


def latest_metadata(
    instance: dg.DagsterInstance, asset_key: dg.AssetKey, keys: set[str], field: str = "snapshot_id"
) -> dict[str, str]:
    """The ``field`` (text) the latest materialization of each of the asset's partitions ``keys`` shows (two
    queries whatever the number of partitions): what a page shows now, which a writer compares its event with."""
    if not keys:
        return {}
    storage_ids = instance.get_latest_storage_id_by_partition(
        asset_key, dg.DagsterEventType.ASSET_MATERIALIZATION, keys
    )
    if not storage_ids:
        return {}
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=asset_key, storage_ids=list(storage_ids.values())),
        limit=len(storage_ids),
    ).records
    out = {}
    for r in records:
        m = r.asset_materialization
        value = m.metadata.get(field) if m is not None else None
        if r.partition_key is not None and value is not None:
            out[r.partition_key] = str(getattr(value, "value", value))
    return out
