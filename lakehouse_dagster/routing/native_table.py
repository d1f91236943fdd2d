"""A native commit onto a dataset's table: the chunked writer (parity/write_digests.write_digested over
lake/writer.write_arrow) with what every native commit carries.

* The totals of its run of native snapshots (mirror/native_run.py), summed on the table state each attempt
  of the commit's compare-and-swap retry commits on (write_arrow's ``native_run``): with them a native
  commit may expire old snapshots, and the rollback still counts every Iceberg-only row.
* An append compacts the run's small files (routing/native_compaction.py): planned here on the table the
  write starts from, it turns the commit into a partial rewrite (the small files removed, their rows and
  the new ones added) — unless the sync's snapshot is already there (a retry: nothing is written).

Used by both callers of native writes: the source writers (sources/writers.py) and route_write's
``native_write`` (the CLI, the ops, the bench and the tests).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

import psycopg
import pyarrow as pa

from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.lake.writer import TableWrite, WriteResult, ensure_table, sync_snapshot
from lakehouse_dagster.mirror.native_run import native_run
from lakehouse_dagster.parity.write_digests import write_digested
from lakehouse_dagster.routing.native_compaction import plan_native_compaction
from lakehouse_dagster.tracking.datasets import Dataset


def write_native_table(
    catalog,
    settings: Settings,
    dataset: Dataset,
    batches: Iterable[pa.RecordBatch],
    plan: TableWrite,
    *,
    conn: psycopg.Connection,
    table=None,
) -> WriteResult:
    """``batches`` committed natively as ``plan`` says (its mode "replace" or "append"), with the run's totals
    and, for an append, the run's small files rewritten in the same commit. ``conn``: the writer's (autocommit)
    session, read by the run totals. ``table``: as ensure_table (None: loaded here)."""
    table = ensure_table(catalog, settings, dataset, table)
    if plan.mode == "append" and sync_snapshot(table, plan.sync_id) is None:
        compaction = plan_native_compaction(settings.sync, dataset, table)
        if compaction is not None:
            files, rows_before = compaction
            plan = dataclasses.replace(plan, mode="partial", delete_files=tuple(files))
            batches = _then(rows_before, batches)
    return write_digested(
        catalog, settings, dataset, batches, plan, table=table, native_run=native_run(conn, settings, dataset.id)
    )


def _then(first: Iterable[pa.RecordBatch], rest: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``first``'s batches, then ``rest``'s, returning what ``rest`` returns (write_arrow's CommitEntries)."""
    yield from first
    return (yield from rest)
