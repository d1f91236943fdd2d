"""Partial rewrites after a small ``row.edit``: which Iceberg data files hold the changed rows.

Change tracking records, per rewriting statement, the row_index ranges it touched (migration
"019_row_changes", schema/migrations/README.md) as a chain ``version → prev_version``. Read under the sync's
pinned Postgres snapshot, the chain from the dataset's ``rows_rewrite_version`` down to the mirrored
version gives every range changed since; a missing link means the history is unknown and the sync goes
full. The data files to rewrite are those whose [lower, upper] __row_index bounds (manifest metrics)
meet a changed range, closed under overlap: the rows Postgres has in the union of their ranges (plus
the changed ranges and everything above the mirrored max) are then exactly what replaces them.
"""

from __future__ import annotations

import bisect
import dataclasses
import uuid
from collections.abc import Sequence

import psycopg
from pyiceberg.conversions import from_bytes
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.types import LongType

from lakehouse_dagster.core.settings import SNAPSHOTS_KEEP_MIN

Ranges = list[tuple[int, int]]  # inclusive, ascending, disjoint


@dataclasses.dataclass(frozen=True)
class PartialPlan:
    files: list  # DataFiles of the current snapshot to remove
    read: Ranges  # row_index ranges to read from Postgres (the last may end at the dataset's max)
    file_rows: int  # rows in ``files``
    reason: str


def record_changes(conn: psycopg.Connection, changes: list[tuple]) -> None:
    """The change rows the WAL consumer (tracking/capture/consumer.py, after-commit mode) computed: (dataset, version,
    bucket, previous version, min index, max index) each; a row already there stays (a replayed transaction)."""
    with conn.cursor() as cur:
        cur.executemany(
            "insert into lakehouse_row_changes (dataset_id, version, bucket, prev_version, min_idx,"
            " max_idx) values (%s, %s, %s, %s, %s, %s) on conflict do nothing",
            changes,
        )


def merge(ranges: Sequence[tuple[int, int]]) -> Ranges:
    """Sorted, overlapping or adjacent ranges joined."""
    out: Ranges = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1] + 1:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def changed_ranges(
    conn: psycopg.Connection, dataset_id: uuid.UUID, rewrite_version: int, mirrored_version: int
) -> Ranges | None:
    """Every row_index range rewritten after ``mirrored_version`` up to ``rewrite_version`` (the dataset's
    rows_rewrite_version, read in the same snapshot as ``conn``), or None when a link of the chain is
    missing (TRUNCATE, schema change, writes that predate migration 019)."""
    rows = conn.execute(
        "select version, prev_version, min_idx, max_idx from lakehouse_row_changes"
        " where dataset_id = %s and version > %s and version <= %s",
        (dataset_id, mirrored_version, rewrite_version),
    ).fetchall()
    links: dict[int, tuple[int, Ranges]] = {}
    for version, prev, lo, hi in rows:
        links.setdefault(version, (prev, []))[1].append((lo, hi))
    found: Ranges = []
    version = rewrite_version
    while version > mirrored_version:
        link = links.get(version)
        if link is None:
            return None
        found += link[1]
        version = link[0]
    return merge(found)


def prune(conn: psycopg.Connection, dataset_id: uuid.UUID, mirrored_version: int) -> None:
    """Records at or below the mirrored version are never read again."""
    conn.execute(
        "delete from lakehouse_row_changes where dataset_id = %s and version <= %s", (dataset_id, mirrored_version)
    )


def file_ranges(table: Table) -> list[tuple[DataFile, int, int]] | str:
    """(DataFile, lower, upper __row_index) of every live file, or why that is not known (a file without
    bounds for the column, delete files)."""
    field = table.schema().find_field("__row_index")
    out: list[tuple[DataFile, int, int]] = []
    for task in table.scan().plan_files():
        if task.delete_files:
            return "the table has delete files"
        lo = (task.file.lower_bounds or {}).get(field.field_id)
        hi = (task.file.upper_bounds or {}).get(field.field_id)
        if lo is None or hi is None or (task.file.null_value_counts or {}).get(field.field_id):
            return f"data file {task.file.file_path.rsplit('/', 1)[-1]} has no __row_index bounds"
        out.append((task.file, int(from_bytes(LongType(), lo)), int(from_bytes(LongType(), hi))))
    return out


def _meets(ranges: Ranges, lo: int, hi: int) -> bool:
    i = bisect.bisect_right(ranges, (hi, float("inf"))) - 1
    return i >= 0 and ranges[i][1] >= lo


def plan_partial(
    files: list[tuple[DataFile, int, int]],
    changed: Ranges,
    mirrored_max: int,
    head_max: int | None,
    total_rows: int,
    max_fraction: float,
) -> PartialPlan | str:
    """The files to rewrite and the ranges to read, or why a full rewrite is the better choice."""
    read = merge(changed)
    touched: dict[str, tuple[DataFile, int, int]] = {}
    while True:  # close under overlap: a file meeting the read ranges is rewritten, its range read whole
        new = [f for f in files if f[0].file_path not in touched and _meets(read, f[1], f[2])]
        if not new:
            break
        touched.update((f[0].file_path, f) for f in new)
        read = merge(read + [(f[1], f[2]) for f in new])
    if head_max is not None and head_max > mirrored_max:  # appended above the mirrored max
        read = merge(read + [(mirrored_max + 1, head_max)])
    file_rows = sum(f[0].record_count for f in touched.values())
    if total_rows and file_rows > max_fraction * total_rows:
        return (
            f"rows were rewritten in {len(touched)} of {len(files)} data files holding {file_rows} of "
            f"{total_rows} rows (over {max_fraction:.0%}): full rewrite"
        )
    return PartialPlan(
        [f[0] for f in touched.values()],
        read,
        file_rows,
        f"rows were updated, deleted or inserted below the max: {len(touched)} of {len(files)} "
        f"data files rewritten ({file_rows} of {total_rows} rows)",
    )


# Compaction: every incremental sync appends a file of just its new rows, so a dataset the app appends to a few
# rows at a time grows one tiny file per sync, and every scan plan, identity check and digest opens them all.
# When the newest COMPACT_FILES appends were each small (from snapshot metadata alone: no I/O on the common
# path), the sync rewrites the run of small files at the top of the table together with its new rows as one
# partial rewrite (one commit, same rules). Safe only in a sync that would append: no row at or below the
# mirrored max changed since the mirrored version, so the rows Postgres has in those files' ranges are the
# rows the files hold. "Small" is below chunk_rows / 16, so a compacted file stops being rewritten once it
# holds that many rows (each row is rewritten a bounded number of times, and a table keeps at most about
# COMPACT_FILES small files plus one file per chunk_rows / 16 rows).
COMPACT_FILES = SNAPSHOTS_KEEP_MIN  # expiry keeps at least these snapshots (core/settings/)


def compaction_due(table: Table, chunk_rows: int) -> bool:
    """The last COMPACT_FILES snapshots are all appends of fewer than chunk_rows / 16 rows (metadata only)."""
    small, snap = max(1, chunk_rows // 16), table.current_snapshot()
    for _ in range(COMPACT_FILES):
        summary = snap.summary if snap is not None else None
        if snap is None or summary is None or summary.operation.value != "append":
            return False
        if int(summary.additional_properties.get("added-records", 0) or 0) >= small:
            return False
        snap = table.snapshot_by_id(snap.parent_snapshot_id) if snap.parent_snapshot_id is not None else None
    return True


def plan_compaction(
    files: list[tuple[DataFile, int, int]], mirrored_max: int, head_max: int | None, chunk_rows: int
) -> PartialPlan | None:
    """The run of small files at the top of the table (by __row_index) and the range that replaces them with
    the sync's new rows, or None when fewer than COMPACT_FILES files are small."""
    small = max(1, chunk_rows // 16)
    run = []
    for f in sorted(files, key=lambda f: f[1], reverse=True):
        if f[0].record_count >= small:
            break
        run.append(f)
    if len(run) < COMPACT_FILES:
        return None
    top = head_max if head_max is not None and head_max > mirrored_max else mirrored_max
    rows = sum(f[0].record_count for f in run)
    return PartialPlan(
        [f[0] for f in run],
        [(min(f[1] for f in run), top)],
        rows,
        f"only appends since the last mirrored version; the {len(run)} small data files at the top "
        f"of the table ({rows} rows) compacted with them",
    )
