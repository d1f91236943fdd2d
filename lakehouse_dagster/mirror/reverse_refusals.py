"""The reverse mirror's refusals (mirror/reverse.py), each one line saying what to do, nothing written: a dataset not
native or with the reverse off, a capture mode it cannot run in, dataset_rows written by something else since the
last apply, a full re-sync that would erase undeclared keys.
"""

from __future__ import annotations

import re
import uuid

import psycopg

from lakehouse_dagster.core.errors import BadInput
from lakehouse_dagster.flags.native import native_dataset_ids
from lakehouse_dagster.flags.reverse_setting import reverse_enabled
from lakehouse_dagster.mirror.errors import PostgresWritten
from lakehouse_dagster.mirror.reverse_state import ReversePosition
from lakehouse_dagster.tracking import capture, sync_log, undeclared
from lakehouse_dagster.tracking.datasets import Column, lookup
from lakehouse_dagster.tracking.datasets import rows as dataset_rows


def _refusal(pg: psycopg.Connection, ds_id: uuid.UUID, columns: list[Column], rows: int) -> BadInput:
    """A full re-sync would erase keys of ``rows`` Postgres rows that the table has no column for: named (a few,
    counted) with what to do. ``pg``: the lock session (the rows are still there: the re-sync's delete is not
    committed)."""
    found = undeclared.find(pg, ds_id, [c.name for c in columns])
    keys = found.names() if found is not None else "(they changed meanwhile)"
    first = found.keys[0][0] if found is not None and found.keys else "<key>"
    return BadInput(
        f"dataset {ds_id}: the reverse mirror refuses to re-sync it in full: {rows} row(s) of dataset_rows hold "
        f"key(s) the Iceberg table has no column for, which the re-sync would erase: {keys}; declare them in "
        "datasets.schema (a native write then adds their columns), or remove them from the rows ("
        f"{dataset_rows.remove_key_statement(first, ds_id)}); nothing was written"
    )


def shared_row_index(ds_id: uuid.UUID, snapshot_id: int, exc: Exception) -> BadInput:
    """The snapshot holds two rows at one row_index (another engine's commit reused an index): ``dataset_rows`` keys
    rows by (dataset_id, row_index), so no copy of it can exist there. ``exc``: the driver's unique violation."""
    found = re.search(r"row_index\)=\([^,]+, (-?\d+)\)", str(exc))
    index = f"row_index {found.group(1)}" if found else "one row_index"
    return BadInput(
        f"dataset {ds_id}: the reverse mirror cannot copy snapshot {snapshot_id} into dataset_rows: two of its rows "
        f"share {index} (another engine's commit gave a row an index the dataset already uses), and dataset_rows "
        "holds one row per index; nothing was written — re-index or remove the duplicate in the table with that "
        f"engine, or keep Postgres as it is (lakehouse reverse off --dataset {ds_id})"
    )


def _refuse(conn: psycopg.Connection, ds_id: uuid.UUID) -> None:
    """Under the dataset lock: only a native dataset with the reverse on, in a capture mode where it can run."""
    if not native_dataset_ids(conn, [ds_id]):
        raise BadInput(
            f"dataset {ds_id} is not written iceberg-native (no writer flag resolves to iceberg_native), so "
            "Postgres is its truth and the reverse mirror leaves it alone; after a rollback, copy what only "
            f"Iceberg holds with lakehouse backfill --dataset {ds_id}; nothing was written"
        )
    setting = reverse_enabled(conn, ds_id)
    if not setting.enabled:
        raise BadInput(
            f"dataset {ds_id}: {setting.describe()}; turn it on first (lakehouse reverse on "
            f"--dataset {ds_id}); nothing was written"
        )
    blocked = capture.reverse_blocked(conn)
    if blocked:
        raise BadInput(f"dataset {ds_id}: the reverse mirror cannot run: {blocked}; nothing was written")


def _refuse_postgres_written(conn: psycopg.Connection, ds_id: uuid.UUID, at: ReversePosition | None) -> None:
    """O(1): the dataset's rows_version against the one the last apply left. Only the live app or a pg writer moves
    it (the reverse's own writes are no echo), so a difference means rows in Postgres that Iceberg lacks — unless the
    forward mirror read the dataset at that very rows_version (a writer rolled back to pg, written, mirrored, flipped
    native again): then Iceberg has every row Postgres holds."""
    if at is None or at.rows_version is None:
        return
    now = lookup.rows_version(conn, ds_id, "rows_version")
    if now == at.rows_version or sync_log.mirror_covered(conn, ds_id, now):
        return
    # No log record here: the refusal is the exception, and each caller reports it once (the CLI's error line, the
    # stream's ReverseFailed event, the job's failure); a record beside it printed the refusal twice in the CLI.
    raise PostgresWritten(
        f"refused: dataset {ds_id} is native (Iceberg is its truth), but its dataset_rows was written by something "
        f"other than the reverse mirror since the last apply (rows_version {at.rows_version} → {now}: the live app's "
        "row.edit or ingest.stream, a pg writer): those rows are not in Iceberg, and applying would re-sync them "
        "away; nothing was written. Find them (lakehouse canary --smoke --dataset "
        f"{ds_id} names the differing rows), bring what must be kept into Iceberg through a native writer, then "
        f"accept Iceberg's rows with lakehouse reverse sync --dataset {ds_id} --full"
    )
