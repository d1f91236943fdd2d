"""The orphan sweep over datasets: what `lakehouse orphans` and the Dagster ``orphan_sweep`` job both run.

lake/orphans.py says which files of one table are orphans; this adds what only the sync log knows (the
syncs the reaper has yet to settle, whose files are spared) and which datasets have a table at all.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence

import psycopg
from pyiceberg.table import Table

from lakehouse_dagster.core.errors import BadInput, NotFound, first_line
from lakehouse_dagster.core.ids import parse_uuid
from lakehouse_dagster.core.settings import Settings, SyncSettings
from lakehouse_dagster.lake import orphans as orphan_files
from lakehouse_dagster.lake.catalog import load_table_or_none, table_identifier
from lakehouse_dagster.mirror.reaper import unsettled_syncs
from lakehouse_dagster.tracking.datasets import scopes

GRACE_MIN_SECONDS = 3600.0  # a sync writes its files before it commits; a reader holds its snapshot while it reads


@dataclasses.dataclass(frozen=True)
class Swept:
    dataset_id: uuid.UUID
    orphans: list[orphan_files.Orphan]
    removed: int
    grace_seconds: float
    error: str | None = None  # this dataset could not be swept (every other one still was)

    @property
    def bytes(self) -> int:
        return sum(o.size for o in self.orphans)

    def as_dict(self) -> dict:
        return {
            "dataset_id": str(self.dataset_id),
            "orphans": len(self.orphans),
            "bytes": self.bytes,
            "removed": self.removed,
            "grace_seconds": self.grace_seconds,
            "paths": [o.path for o in self.orphans],
            **({"error": self.error} if self.error else {}),
        }

    def line(self, delete: bool) -> str:
        if self.error:
            return f"{self.dataset_id}: not swept: {self.error}"
        verb = f"removed {self.removed}" if delete else "listed only (add --delete to remove them)"
        return (
            f"{self.dataset_id}: {len(self.orphans)} orphan file(s), {self.bytes:,} bytes, older than "
            f"{self.grace_seconds:.0f} s; {verb}"
        )


def grace(sync: SyncSettings, grace_seconds: float | None) -> float:
    """The grace period: as given (0 or more), else the snapshot max age, at least an hour."""
    if grace_seconds is None:
        return max(GRACE_MIN_SECONDS, sync.snapshots_max_age_seconds)
    if grace_seconds < 0:
        raise BadInput(f"grace of {grace_seconds} s is negative; give 0 or more")
    return float(grace_seconds)


def mirrored_dataset_ids(conn: psycopg.Connection) -> list[uuid.UUID]:
    """Tabular datasets with a succeeded sync (datasets.mirrored_version, kept by the sync log's triggers)."""
    return scopes.mirrored_tabular_ids(conn)


def record_sweep(conn: psycopg.Connection, swept: Swept, actor: str) -> None:
    """A sweep that removed files changed the table's storage: one row the recorder turns into the dataset
    partition's materialization (status/recording.py)."""
    conn.execute(
        "insert into lakehouse_orphan_sweeps (dataset_id, files_removed, bytes_removed, grace_seconds, actor)"
        " values (%s, %s, %s, %s, %s)",
        (swept.dataset_id, swept.removed, swept.bytes, swept.grace_seconds, actor),
    )


def sweep(
    conn: psycopg.Connection,
    catalog,
    settings: Settings,
    dataset_ids: Sequence | None,
    *,
    delete: bool,
    grace_seconds: float | None = None,
) -> list[Swept]:
    """List (``delete``: remove) the orphan files of the datasets' tables. Named datasets must all have a table,
    checked before any file goes; None: every dataset with a succeeded sync whose table exists. A table that
    fails to sweep is reported in its ``Swept.error`` and the others are still swept (callers fail after)."""
    wait = grace(settings.sync, grace_seconds)
    if dataset_ids is None:
        tables: dict[uuid.UUID, Table | None] = {
            d: None for d in mirrored_dataset_ids(conn)
        }  # each loaded in its turn (a failure is its own)
    else:
        ids = [parse_uuid(d, "dataset id") for d in dataset_ids]  # refuse bad input before touching anything
        tables = {d: load_table_or_none(catalog, table_identifier(settings, d)) for d in ids}
        for d, table in tables.items():
            if table is None:
                raise NotFound(f"dataset {d} has no Iceberg table (never mirrored); nothing swept")
    out = []
    for d, table in tables.items():
        try:
            if table is None:
                table = load_table_or_none(catalog, table_identifier(settings, d))
            if table is None:
                continue  # a sync succeeded but the table is gone (dropped by hand): nothing to sweep
            found = orphan_files.find_orphans(table, grace_seconds=wait, protected_syncs=unsettled_syncs(conn, d))
            swept = Swept(d, found, orphan_files.remove(table, found) if delete else 0, wait)
            if swept.removed:
                record_sweep(conn, swept, settings.project.actor)
            out.append(swept)
        except Exception as exc:  # noqa: BLE001 - one unreadable table must not stop the sweep of the others
            out.append(Swept(d, [], 0, wait, error=f"{type(exc).__name__}: {first_line(exc)}"))
    return out
