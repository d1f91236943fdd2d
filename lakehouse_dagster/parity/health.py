"""Snapshot freshness and identity readiness of a dataset's Iceberg table (the asset checks' core).

Both return a plain ``Health`` (passed, description, metadata); dagster/defs/parity/checks.py turns it into an
AssetCheckResult. A table or snapshot that cannot be seen is a failure, never a pass.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid

import psycopg
from pyiceberg.catalog import Catalog
from pyiceberg.types import LongType, StringType, TimestamptzType

from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.parity import file_identity
from lakehouse_dagster.parity.digest import IcebergPin, IcebergSide, pin_iceberg
from lakehouse_dagster.parity.errors import FileFactsUnavailable, MaintainedDigestUnavailable
from lakehouse_dagster.tracking import barrier
from lakehouse_dagster.tracking.datasets import lookup
from lakehouse_dagster.tracking.sync_log import latest_succeeded

IDENTITY = {"__row_index": LongType(), "__row_id": StringType(), "__created_at": TimestamptzType()}
DEFAULT_MAX_LAG_SECONDS = 3600


@dataclasses.dataclass
class Health:
    passed: bool
    description: str
    metadata: dict


def snapshot_freshness(
    conn: psycopg.Connection,
    catalog: Catalog,
    settings: Settings,
    dataset_id: uuid.UUID,
    max_lag_seconds: int = DEFAULT_MAX_LAG_SECONDS,
    pin: IcebergPin | None = None,
) -> Health:
    """A succeeded sync exists, the table has a snapshot, and Iceberg is either caught up with Postgres
    or its snapshot is not older than ``max_lag_seconds`` (a behind snapshot older than that is stale).
    ``pin``: the caller's pin of the table (a batch pins once for the three checks)."""
    pin = pin or pin_iceberg(catalog, settings, dataset_id)
    with barrier.read_tracking_consistently(conn, [dataset_id]):  # after-commit: it covers every committed write
        pg_version = lookup.rows_version(conn, dataset_id)
    last_ok = latest_succeeded(conn, dataset_id)
    meta = {
        "snapshot_id": str(pin.snapshot_id) if pin.snapshot_id is not None else None,
        "pg_version": pg_version,
        "iceberg_version": pin.source_version,
        "max_lag_seconds": max_lag_seconds,
        "last_succeeded_sync": last_ok.finished_at.isoformat() if last_ok and last_ok.finished_at else None,
    }
    if not pin.has_snapshot or pin.committed_at is None:  # (a pinned snapshot always has its commit time)
        return Health(False, "no Iceberg snapshot: the dataset was never synced", meta)
    if last_ok is None:
        return Health(False, "the table has a snapshot but no sync of this dataset ever succeeded", meta)
    age = (dt.datetime.now(dt.UTC) - pin.committed_at).total_seconds()
    meta["snapshot_age_seconds"] = round(age, 1)
    meta["snapshot_committed_at"] = pin.committed_at.isoformat()
    if pin.path == "native":
        meta["caught_up"] = None
        return Health(True, "written iceberg-native: the snapshot is the truth (no Postgres lag to measure)", meta)
    caught_up = pin.source_version is not None and pg_version is not None and pin.source_version >= pg_version
    meta["caught_up"] = caught_up
    if caught_up:
        return Health(True, f"caught up with Postgres version {pg_version}", meta)
    if age <= max_lag_seconds:
        return Health(
            True,
            f"behind Postgres (version {pin.source_version} < {pg_version}) for at most {age:.0f} s, "
            f"within the allowed {max_lag_seconds} s",
            meta,
        )
    return Health(
        False,
        f"behind Postgres (version {pin.source_version} < {pg_version}) and the snapshot is "
        f"{age:.0f} s old, more than the allowed {max_lag_seconds} s",
        meta,
    )


def identity_ready(
    catalog: Catalog,
    settings: Settings,
    dataset_id: uuid.UUID,
    conn: psycopg.Connection | None = None,
    pin: IcebergPin | None = None,
) -> Health:
    """Identity columns present with their contract types, non-null in every row, __row_index unique.
    With ``conn``, only the data files without stored per-file facts are read (parity/file_identity.py);
    every row is read when the facts cannot answer (``read`` in the metadata says which and why)."""
    pin = pin or pin_iceberg(catalog, settings, dataset_id)
    meta: dict = {"snapshot_id": str(pin.snapshot_id) if pin.snapshot_id is not None else None}
    if not pin.has_snapshot:
        return Health(False, "no Iceberg snapshot: identity cannot be checked", meta)
    wrong = [
        f"{name} is {pin.fields.get(name)} (expected {typ})" if name in pin.fields else f"{name} is missing"
        for name, typ in IDENTITY.items()
        if pin.fields.get(name) != typ
    ]
    if wrong:
        meta["problems"] = wrong
        return Health(False, "identity columns: " + "; ".join(wrong), meta)
    meta["files"] = len(pin.files)
    stats = None
    if conn is not None:
        try:
            stats, read, cached = file_identity.snapshot_facts(conn, pin, dataset_id)
            meta.update(read="new files only", files_read=read, files_cached=cached)
        except FileFactsUnavailable as exc:
            meta["read"] = f"every row: {exc}"
        except MaintainedDigestUnavailable as exc:  # a file gone or changed in place: the check cannot see the data
            meta["problems"] = [str(exc)]
            return Health(False, f"cannot read the snapshot's data files: {exc}", meta)
    if stats is None:
        meta.setdefault("read", "every row")
        meta["files_read"], meta["files_cached"] = len(pin.files), 0
        with IcebergSide(pin, ()) as side:
            stats = side.identity_stats()
    meta.update(stats)
    problems = []
    for name, key in (("__row_index", "row_index"), ("__row_id", "row_id"), ("__created_at", "created_at")):
        nulls = stats["rows"] - stats[key]
        if nulls:
            problems.append(f"{nulls} row(s) with a null {name}")
    dups = stats["row_index"] - stats["distinct_row_index"]
    if dups:
        problems.append(f"{dups} duplicated __row_index value(s)")
    if problems:
        meta["problems"] = problems
        return Health(False, "; ".join(problems), meta)
    return Health(True, f"{stats['rows']} rows, identity columns complete and __row_index unique", meta)
