"""The durable marker of "Iceberg holds rows Postgres lacks", and the mirror's refusal while it stands.

A native write lands in Iceberg only (dataset_rows untouched). Rolling its writer back to pg resumes
Postgres writes, but the rows written natively are in Iceberg alone: mirroring Postgres over the table
would drop them. Nothing new has to be written to know this — the records already say it:

  * the table property ``lakehouse.path`` is set by every commit in the same transaction as its data
    (iceberg/writer.py), so ``native`` there means the table's current content was last written
    natively (durable across snapshot expiry);
  * each snapshot's summary carries ``lakehouse.path`` too, so walking back from the current snapshot
    to the last mirror snapshot counts the native snapshots and the rows they added (a native
    overwrite rewrote everything: then every row of the table counts);
  * ``lakehouse_pg_reconciled`` (this area's migration) records when Postgres caught up again: a
    backfill of a snapshot (rollback/backfill.py), or a sync.full on the pg path, which repopulates
    Postgres from the source — a trigger on the ingest state (sources/state.py) notes it in the same
    transaction as its rows, with its ``seq``; native snapshots with a lower ingest seq (or, without
    one, committed before it) are superseded. The next mirror commit (path mirror) makes it all moot.

The walk reads only Iceberg metadata (no data file) and is skipped entirely for a dataset that never had
a native sync (one indexed query), so the mirror pays nothing for it in the common case.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid

import psycopg
from pyiceberg.catalog import Catalog

from ..errors import BadInput
from ..iceberg.catalog import load_table_or_none, table_identifier
from ..iceberg.writer import WRITE_PATH
from ..settings import Settings
from ..sources.state import SEQ_SUMMARY

NATIVE = "native"


@dataclasses.dataclass(frozen=True)
class IcebergOnly:
    """What exists only in Iceberg for one dataset (counts from snapshot metadata)."""

    dataset_id: uuid.UUID
    snapshot_id: int  # the table's current snapshot (what a backfill copies from)
    snapshots: int  # native snapshots since the last mirror (or reconciled) snapshot
    rows: int  # rows those snapshots hold that Postgres lacks
    replaced: bool  # a native overwrite rewrote the table: Postgres' older rows are stale
    last_native_at: dt.datetime  # commit time of the newest native snapshot
    added_files: tuple[str, ...] | None = None  # data files those snapshots appended (None: replaced, or unknown)

    def describe(self) -> str:
        how = "a native sync.full replaced the table, so all its rows count; " if self.replaced else ""
        return (f"{self.rows} row(s) in {self.snapshots} native snapshot(s) exist only in Iceberg "
                f"({how}up to snapshot {self.snapshot_id})")

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["dataset_id"] = str(self.dataset_id)
        d["last_native_at"] = self.last_native_at.isoformat()
        return d


def ways_forward(dataset_id: uuid.UUID) -> str:
    return (f"either copy them into Postgres (lakehouse write-flags backfill --dataset {dataset_id}) or repopulate "
            f"Postgres from the source (lakehouse ingest --dataset {dataset_id} --writer sync.full, on the pg path)")


def _ever_native(conn: psycopg.Connection, dataset_id: uuid.UUID) -> bool:
    return conn.execute(
        "select 1 from iceberg_sync_log where dataset_id = %s and path = 'native' limit 1", (dataset_id,)
    ).fetchone() is not None


def _reconciled(conn: psycopg.Connection, dataset_id: uuid.UUID) -> tuple[set[int], int | None, dt.datetime | None]:
    """(snapshots backfilled, the latest pg-path sync.full's ingest seq and time)."""
    rows = conn.execute("select how, snapshot_id, seq, at from lakehouse_pg_reconciled where dataset_id = %s",
                        (dataset_id,)).fetchall()
    full = [(seq, at) for how, _, seq, at in rows if how == "pg-full-sync"]
    return ({snap for how, snap, _, _ in rows if how == "backfill"},
            max((s for s, _ in full if s is not None), default=None), max((a for _, a in full), default=None))


def iceberg_only(conn: psycopg.Connection, catalog: Catalog, settings: Settings, dataset_id: uuid.UUID,
                 table=None) -> IcebergOnly | None:
    """The rows and snapshots only Iceberg holds for the dataset, or None when Postgres has them all."""
    if not _ever_native(conn, dataset_id):
        return None
    if table is None:
        table = load_table_or_none(catalog, table_identifier(settings, dataset_id))
    current = table.current_snapshot() if table is not None else None
    if current is None or table.properties.get(WRITE_PATH) != NATIVE:
        return None
    backfilled, full_seq, full_at = _reconciled(conn, dataset_id)
    newest = dt.datetime.fromtimestamp(current.timestamp_ms / 1000, tz=dt.timezone.utc)
    snapshots, added, replaced, snap, files = 0, 0, False, current, []
    while snap is not None and snap.snapshot_id not in backfilled:
        summary = snap.summary.additional_properties if snap.summary is not None else {}
        if summary.get(WRITE_PATH) != NATIVE:
            break  # a mirror snapshot: Postgres held everything up to here
        seq = summary.get(SEQ_SUMMARY)
        if (full_seq is not None and seq is not None and full_seq > int(seq)) or (
                seq is None and full_at is not None and full_at > newest):
            break  # a later sync.full on the pg path repopulated Postgres from the source
        snapshots += 1
        added += int(summary.get("added-records", 0) or 0)
        if snap.summary is not None and snap.summary.operation.value in ("overwrite", "delete", "replace"):
            replaced = True
        if files is not None and not replaced:
            files = _added_files(table, snap, files)
        snap = table.snapshot_by_id(snap.parent_snapshot_id) if snap.parent_snapshot_id is not None else None
    if snapshots == 0:
        return None
    total = int((current.summary.additional_properties if current.summary else {}).get("total-records", 0) or 0)
    return IcebergOnly(
        dataset_id, current.snapshot_id, snapshots, total if replaced else added, replaced, newest,
        None if replaced or files is None else tuple(files))


def _added_files(table, snap, files: list[str]) -> list[str] | None:
    """The data files ``snap`` appended (what a backfill of an append-only lineage has to copy); None when
    the manifests cannot be read (the backfill then copies the whole snapshot)."""
    from pyiceberg.manifest import ManifestEntryStatus

    try:
        for manifest in snap.manifests(table.io):
            if manifest.added_snapshot_id != snap.snapshot_id:
                continue
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                if entry.status == ManifestEntryStatus.ADDED and entry.snapshot_id == snap.snapshot_id:
                    files.append(entry.data_file.file_path)
    except Exception:
        return None
    return files


def refuse_mirror_over_iceberg_only(conn: psycopg.Connection, catalog: Catalog, settings: Settings,
                                    dataset_id: uuid.UUID) -> None:
    """The mirror's check (ingest/sync.py, under the dataset lock): never overwrite Iceberg-only rows."""
    found = iceberg_only(conn, catalog, settings, dataset_id)
    if found is not None:
        raise BadInput(f"dataset {dataset_id}: {found.describe()}, so mirroring Postgres over the table would drop "
                       f"them; {ways_forward(dataset_id)}")
