"""Compaction of a native writer's small files: after the writer flip each native append adds one data file,
and nothing merged them, so a dataset written every few seconds had thousands of files for every reader,
check and digest to open. The mirror compacts with rows it reads from Postgres (tracking/row_changes.py); a
native table's rows exist only in Iceberg, so here the small files are read back and rewritten together with
the next append, in that append's one commit (routing/native_table.py: mode "partial", lake/writer.py).

Same trigger as the mirror's: the newest COMPACT_FILES snapshots are all appends of fewer than
chunk_rows / 16 rows (snapshot metadata only: the common path reads nothing). Only files of the current
native run are taken (data sequence number above the run's ``after-sequence``, mirror/native_run.py):
the compacted file then holds rows only Iceberg has, so the rollback's count and the files a backfill copies
stay exactly the run's. A file stops being rewritten once it holds chunk_rows / 16 rows.
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
from pyiceberg.table import Table

from lakehouse_dagster.core.settings import SyncSettings
from lakehouse_dagster.lake.reader import read_files
from lakehouse_dagster.lake.schema import arrow_schema
from lakehouse_dagster.mirror.native_run import run_files, run_totals
from lakehouse_dagster.tracking.datasets import Dataset
from lakehouse_dagster.tracking.row_changes import COMPACT_FILES, compaction_due


def plan_native_compaction(
    sync: SyncSettings, dataset: Dataset, table: Table
) -> tuple[list, Iterable[pa.RecordBatch]] | None:
    """For a native append onto ``table`` (the state the write starts from): None, or (the run's small data files,
    their rows as batches, read lazily) to rewrite together with the append's rows in its one commit."""
    chunk_rows = sync.chunk_rows
    if not compaction_due(table, chunk_rows):
        return None
    current = table.current_snapshot()
    totals = run_totals(current)
    if totals is None:  # a commit without run totals: which files are the run's is not known here
        return None
    small = max(1, chunk_rows // 16)
    files = sorted(
        (f for f in run_files(table, current, totals.after_sequence) if f.record_count < small),
        key=lambda f: f.file_path,
    )
    if len(files) < COMPACT_FILES:
        return None
    return files, read_files(table, [f.file_path for f in files], arrow_schema(dataset.columns))
