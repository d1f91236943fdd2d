"""Bounded table growth for a table written many times a minute (the mirror's stream): compaction of small data files
and expiry of snapshots, each its own commit, each under the dataset's lock (G3) so it never races a sync.

Why beside what a sync already does: a mirror commit compacts the run of small files at the top of the table with
its own new rows (tracking/row_changes.py plan_compaction) and expires snapshots past the newest
``LAKEHOUSE_SNAPSHOTS_KEEP`` that are older than ``LAKEHOUSE_SNAPSHOTS_MAX_AGE_SECONDS`` (an hour; lake/writer.py
expirable_snapshots). A trickle of one small append a second keeps every snapshot of the last hour (~3,600, each
~0.8 KB that every later commit writes again and every load parses) and leaves small files the sync's own
compaction does not reach (an update in the middle of the table splits the run). These functions bound both:

- ``compact_small_files``: the live data files below ``LAKEHOUSE_MAINTENANCE_SMALL_FILE_BYTES``, when there are at
  least ``LAKEHOUSE_MAINTENANCE_MIN_FILES`` of them, read back (lake/reader.py read_files, by field id) in
  ``__row_index`` order and written as files of ``LAKEHOUSE_INGEST_CHUNK_ROWS`` rows, in one overwrite commit that
  removes exactly those files (lake/writer.py, mode "partial"): the same rows with the same identity columns and
  values, the same source version and row count recorded in the table's properties. A mirror table only: a native
  table's files are counted by its run (mirror/native_run.py) and compacted by its writer (routing/native_compaction.py).
- ``expire_snapshots``: removes from the table metadata the snapshots older than
  ``LAKEHOUSE_MAINTENANCE_SNAPSHOT_AGE_SECONDS``, keeping the newest ``LAKEHOUSE_MAINTENANCE_KEEP_SNAPSHOTS`` (at least
  16, the snapshots a sync's compaction reads to decide) and every snapshot a reader may have pinned (``reader_pins``).

How readers pin a snapshot: the read router serves a dataset's latest succeeded sync's snapshot (routing/read_router.py
``snapshot_id``); a reader loads the table by that id (service/db.py: again only when its kept table lacks it) and then
reads the snapshot's files. A read that has its table keeps working after an expiry (only metadata goes; data files are
removed only by the orphan sweep, with its grace of at least an hour); what must not go is a snapshot a reader was
handed a moment ago and has not loaded yet. So a pin is: the latest succeeded sync's snapshot, and the snapshot of
every succeeded sync that was still the latest within the last ``LAKEHOUSE_MAINTENANCE_PIN_SECONDS``; branch and tag
heads are never expired either.

No Dagster here (core never imports it): the stream loop, a job or the CLI calls these with a connection.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid

import psycopg
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException

from lakehouse_dagster.core.guards import dataset_lock
from lakehouse_dagster.core.settings import SNAPSHOTS_KEEP_MIN, Settings
from lakehouse_dagster.lake.catalog import load_table_or_none, table_identifier
from lakehouse_dagster.lake.reader import read_files
from lakehouse_dagster.lake.schema import arrow_schema
from lakehouse_dagster.lake.writer import SOURCE_VERSION, WRITE_PATH, TableWrite, write_arrow
from lakehouse_dagster.tracking.datasets import get_dataset
from lakehouse_dagster.tracking.row_changes import file_ranges
from lakehouse_dagster.tracking.sync_log import snapshots_handed_out

_log = logging.getLogger(__name__)

EXPIRE_ATTEMPTS = 4  # lost compare-and-swaps (another writer of the table's metadata) before giving up this round


@dataclasses.dataclass(frozen=True)
class Compaction:
    """What ``compact_small_files`` did: ``skipped`` says why nothing was committed (None: committed)."""

    dataset_id: uuid.UUID
    files_before: int
    files_after: int
    compacted_files: int = 0
    rows: int = 0
    snapshot_id: int | None = None
    skipped: str | None = None


@dataclasses.dataclass(frozen=True)
class Expiry:
    """What ``expire_snapshots`` did."""

    dataset_id: uuid.UUID
    snapshots_before: int
    snapshots_after: int
    expired: tuple[int, ...] = ()
    pinned: tuple[int, ...] = ()


def reader_pins(conn: psycopg.Connection, dataset_id: uuid.UUID, pin_seconds: float) -> set[int]:
    """Snapshot ids a reader may have been handed and not loaded yet (module docstring): never expired."""
    return snapshots_handed_out(conn, dataset_id, pin_seconds)


def expirable(metadata, *, keep: int, older_than_seconds: float, pinned: set[int], now_ms: int) -> list[int]:
    """The snapshot ids to expire from ``metadata``: past the newest ``keep`` (at least SNAPSHOTS_KEEP_MIN), older than
    ``older_than_seconds``, not a branch or tag head, not pinned."""
    keep = max(keep, SNAPSHOTS_KEEP_MIN)
    protected = {ref.snapshot_id for ref in metadata.refs.values()} | set(pinned)
    by_age = sorted(metadata.snapshots, key=lambda s: (s.timestamp_ms, s.sequence_number or 0))
    cutoff = now_ms - older_than_seconds * 1000
    return [
        s.snapshot_id
        for s in by_age[: max(0, len(by_age) - keep)]
        if s.timestamp_ms < cutoff and s.snapshot_id not in protected
    ]


def expire_snapshots(
    conn: psycopg.Connection,
    catalog: Catalog,
    settings: Settings,
    dataset_id: uuid.UUID,
    *,
    keep: int | None = None,
    older_than_seconds: float | None = None,
    pin_seconds: float | None = None,
    lock_timeout_s: float = 60,
) -> Expiry:
    """Expire the dataset table's old snapshots (module docstring), one commit, under G3 on ``conn`` (do not call it
    while this process holds the dataset's lock on another connection). Defaults from ``settings``."""
    keep = settings.maintenance.keep_snapshots if keep is None else keep
    age = settings.maintenance.snapshot_age_seconds if older_than_seconds is None else older_than_seconds
    pin = settings.maintenance.pin_seconds if pin_seconds is None else pin_seconds
    with dataset_lock(conn, dataset_id, timeout_s=lock_timeout_s):
        table = load_table_or_none(catalog, table_identifier(settings, dataset_id))
        if table is None:
            return Expiry(dataset_id, 0, 0)
        before = len(table.metadata.snapshots)
        for attempt in range(EXPIRE_ATTEMPTS):
            pinned = reader_pins(conn, dataset_id, pin)
            ids = expirable(table.metadata, keep=keep, older_than_seconds=age, pinned=pinned, now_ms=_now_ms())
            if not ids:
                return Expiry(dataset_id, before, before, (), tuple(sorted(pinned)))
            try:
                table.maintenance.expire_snapshots().by_ids(ids).commit()
            except CommitFailedException:
                if attempt == EXPIRE_ATTEMPTS - 1:
                    raise
                time.sleep(0.05 * (2**attempt))
                table = table.refresh()
                continue
            after = len(table.refresh().metadata.snapshots)
            return Expiry(dataset_id, before, after, tuple(ids), tuple(sorted(pinned)))
    raise AssertionError("unreachable")  # pragma: no cover


def compact_small_files(
    conn: psycopg.Connection,
    catalog: Catalog,
    settings: Settings,
    dataset_id: uuid.UUID,
    *,
    small_bytes: int | None = None,
    min_files: int | None = None,
    lock_timeout_s: float = 60,
) -> Compaction:
    """Rewrite the table's small data files into fewer (module docstring), one commit, under G3 on ``conn``."""
    small_bytes = settings.maintenance.small_file_bytes if small_bytes is None else small_bytes
    min_files = settings.maintenance.min_files if min_files is None else min_files
    with dataset_lock(conn, dataset_id, timeout_s=lock_timeout_s):
        dataset = get_dataset(conn, dataset_id)
        table = load_table_or_none(catalog, table_identifier(settings, dataset_id))
        if table is None:
            return _skip(dataset_id, 0, "no Iceberg table yet")
        files = file_ranges(table)
        if isinstance(files, str):
            return _skip(dataset_id, 0, files)
        count = len(files)
        path = table.properties.get(WRITE_PATH, "mirror")
        if path != "mirror":
            return _skip(dataset_id, count, f"the table's last writer is {path!r}: its own writer compacts it")
        target = arrow_schema(dataset.columns)
        if target.names != [f.name for f in table.schema().fields]:
            return _skip(dataset_id, count, "the dataset's columns changed since its last sync: the next sync first")
        small = sorted((f for f in files if f[0].file_size_in_bytes < small_bytes), key=lambda f: (f[1], f[2]))
        if len(small) < min_files:
            return _skip(dataset_id, count, f"{len(small)} small data file(s), fewer than {min_files}")
        version = table.properties.get(SOURCE_VERSION)
        plan = TableWrite(
            mode="partial",
            sync_id=uuid.uuid4(),
            source_version=int(version) if version is not None and version != "-1" else None,
            path="mirror",
            delete_files=[f[0] for f in small],
        )
        result = write_arrow(
            catalog, settings, dataset, read_files(table, [f[0].file_path for f in small], target), plan, table=table
        )
        after = count - len(small) + result.files
        _log.info(
            "dataset %s: %d small data files (%d rows) compacted into %d",
            dataset_id,
            len(small),
            result.rows,
            result.files,
        )
        return Compaction(dataset_id, count, after, len(small), result.rows, result.snapshot_id)


def _skip(dataset_id: uuid.UUID, files: int, why: str) -> Compaction:
    return Compaction(dataset_id, files, files, skipped=why)


def _now_ms() -> int:
    return int(time.time() * 1000)
