"""Settling syncs that did not conclude: a process killed mid-sync, a commit whose outcome was unknown,
an interruption before the commit was seen to land. Run by the next sync of the dataset (mirror or
native) while it holds the dataset lock, before it starts its own.

Which rows: ``running`` rows of the dataset (their process died or lost its lock: a live sync holding
the lock cannot exist while we hold it) and ``failed`` rows whose error starts with ``UNSETTLED`` (a
sync that gave up without knowing whether its commit landed, and kept its files; or one known not to have
committed whose files could not be deleted, the object store failing: lake/writer.py files_left). Each is settled
against the table: its snapshot is there → ``succeeded`` (with the source version that snapshot
covers); not there → ``failed``, and its files are deleted — unless one of them is a data file of the
current snapshot (its own snapshot was expired since it landed): ``succeeded``, nothing deleted.

Why deleting is safe although the reaper cannot see the other process. Holding the dataset lock (G3)
proves only that no *session* holds it; the process whose session died (server restart, timeout,
pg_terminate_backend) may still be running and about to commit. Two things close that window:
  1. a writer re-checks its guard locks right before every commit attempt (guards.check_held) and
     does not commit without them; every file it will commit is written before that check, so if
     the check passed before its session died, all its files are on disk when we list them here;
  2. when we are about to delete files of such a sync, we first commit a *fence*: an empty snapshot on
     the table's main branch. Every commit built before the fence asserts the old main snapshot, so
     its compare-and-swap now fails (CommitFailedException), and the writer's retry loop re-checks
     its lock, finds it gone, and aborts (pyiceberg's own retry, which would rebuild the commit on
     the fence without asking, is switched off per table — lake/writer.py). A commit that landed
     before the fence is visible in the table we settle against, so its files are kept.
No files of an unresolved sync on disk means no fence is needed: such a writer has not passed its
pre-commit check, and will fail it. The fence copies the current snapshot's source version and path
into its summary, so freshness and the table's watermark read exactly as before, and a native run's
totals (mirror/native_run.py), so the rollback's count and native compaction go on across it.
"""

from __future__ import annotations

import logging
import time
import uuid

import psycopg
from pyarrow import fs as pafs
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table

from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.lake.catalog import load_table_or_none, table_identifier
from lakehouse_dagster.lake.storage import table_filesystem
from lakehouse_dagster.lake.writer import (
    COMMIT_ATTEMPTS,
    FENCE,
    SOURCE_VERSION,
    SYNC_FILE,
    WRITE_PATH,
    snapshot_source_version,
    sync_snapshot,
)
from lakehouse_dagster.mirror.native_run import RUN_KEYS, RUN_PARENT, run_totals
from lakehouse_dagster.tracking import sync_log

_log = logging.getLogger(__name__)

UNSETTLED = "unsettled: "  # error prefix of a failed sync that kept its files (outcome unknown, or not deleted)


def unsettled_syncs(conn: psycopg.Connection, ds_id: uuid.UUID) -> set[str]:
    """The dataset's syncs this module has yet to settle (their files are never an orphan sweep's)."""
    return {str(r[0]) for r in sync_log.unconcluded(conn, ds_id, UNSETTLED.replace("_", r"\_") + "%")}


def reap_abandoned(conn: psycopg.Connection, catalog: Catalog, settings: Settings, ds_id: uuid.UUID) -> int:
    """Settle the dataset's unconcluded syncs (the caller holds the dataset lock); how many there were."""
    rows = sync_log.unconcluded(conn, ds_id, UNSETTLED.replace("_", r"\_") + "%")
    if not rows:
        return 0
    table = load_table_or_none(catalog, table_identifier(settings, ds_id))
    files: dict[str, list[str]] = {}
    live: set[str] | None = None  # the current snapshot's data files, when a file of an unresolved sync exists
    if table is not None:
        unresolved = {str(sid) for sid, _ in rows if sync_snapshot(table, sid) is None}
        if unresolved:
            files = {sid: paths for sid, paths in files_by_sync(table).items() if sid in unresolved}
        if files:
            table = fence(table, f"reaping {', '.join(sorted(files))}")
    for sid, status in rows:
        snap = sync_snapshot(table, sid) if table is not None else None
        if snap is not None:
            total = snap.summary.additional_properties.get("total-records") if snap.summary else None
            sync_log.settle_landed(
                conn,
                sid,
                snap.snapshot_id,
                snapshot_source_version(snap),
                int(total) if total is not None else None,
                f"its commit landed but the sync did not record it ({status}); settled by the next sync",
            )
            continue
        paths = files.get(str(sid), ())
        if paths and table is not None and live is None:  # a sync has files only when there is a table
            live = {task.file.file_path for task in table.scan().plan_files()}
        if live is not None and any(path in live for path in paths):
            # Its snapshot is no longer kept (expired: lake/writer.py expirable_snapshots) but its files are
            # the table's: it landed. Never delete a live file.
            sync_log.settle_landed_expired(
                conn,
                sid,
                f"its commit landed but the sync did not record it ({status}); its snapshot has been expired,"
                " its files are in the table; settled by the next sync",
            )
            continue
        was = "died before its commit landed" if status == "running" else "its commit did not land"
        sync_log.settle_abandoned(conn, sid, f"abandoned: the sync {was}; settled by the next sync")
        if table is not None:
            for path in paths:
                _delete(table, path)
    return len(rows)


def files_by_sync(table: Table) -> dict[str, list[str]]:
    """{sync id: data file paths} of the files our writer named after their sync in the table's data dir."""

    found: dict[str, list[str]] = {}
    try:
        filesystem, root = table_filesystem(table, f"{table.location()}/data")
        for info in filesystem.get_file_info(pafs.FileSelector(root, allow_not_found=True)):
            m = SYNC_FILE.match(info.base_name)
            if m:
                found.setdefault(m.group(1), []).append(f"{table.location()}/data/{info.base_name}")
    except Exception as exc:  # noqa: BLE001 - orphans waste space but never change what the table holds
        _log.warning("could not list the data files of %s: %s", table.name(), exc)
    return found


def _delete(table: Table, path: str) -> None:
    try:
        table.io.delete(path)
    except Exception as exc:  # noqa: BLE001
        _log.warning("could not remove abandoned file %s: %s", path, exc)


def fence(table: Table, why: str) -> Table:
    """Commit an empty snapshot on main (see the module docstring); returns the table as of the fence."""
    for attempt in range(COMMIT_ATTEMPTS):
        current = table.current_snapshot()
        summary = {FENCE: why[:200]}
        if current is not None and current.summary is not None:
            for key in (SOURCE_VERSION, WRITE_PATH):
                if key in current.summary.additional_properties:
                    summary[key] = current.summary.additional_properties[key]
            if run_totals(current) is not None:  # a native run's totals go on unchanged (the fence adds nothing)
                summary.update(
                    {k: current.summary.additional_properties[k] for k in RUN_KEYS},
                    **{RUN_PARENT: str(current.snapshot_id)},
                )
        try:
            tx = table.transaction()
            with tx.update_snapshot(snapshot_properties=summary).fast_append():
                pass
            tx.commit_transaction()
            return table.refresh()
        except CommitFailedException:
            if attempt == COMMIT_ATTEMPTS - 1:
                raise
            table = table.refresh()
            time.sleep(0.05 * 2**attempt)
    raise AssertionError("unreachable")
