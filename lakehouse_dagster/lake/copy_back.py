"""Iceberg rows back into ``dataset_rows``: what the backfill (runbooks/backfill.py) and the reverse mirror
(mirror/reverse.py) share, here so that both layers may use it.

  * ``snapshot_batches``: a snapshot's rows (or only some of its data files) as a bounded stream of Arrow batches,
    strings as utf8 (what ADBC's binary COPY maps to text);
  * ``data_expr``: the jsonb the pg path builds from typed staged columns (sources/pg_rows.py), so a row copied
    back holds the value the mirror types back to the same Iceberg value;
  * ``counted``: a data-changing statement as a query returning how many rows it changed.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
from psycopg import sql
from pyiceberg.io.pyarrow import schema_to_pyarrow

from lakehouse_dagster.lake.reader import read_files
from lakehouse_dagster.tracking.datasets import Column

IDENTITY = ("__row_index", "__row_id", "__created_at")
BATCH_ROWS = 65_536


def snapshot_batches(
    table, snapshot_id: int, names: list[str], only: tuple[str, ...] | None = None
) -> pa.RecordBatchReader:
    """The snapshot's rows as a stream of ``BATCH_ROWS``-row batches (strings as utf8, what ADBC's COPY maps
    to text). The chunked writer's files carry Iceberg field ids and no delete files exist, so each data
    file is read with pyarrow's batch iterator (memory bounded by a batch; a column added after a file was
    written reads as nulls); a snapshot with delete files goes through pyiceberg's reader instead.
    ``only``: just these data files (those native appends added)."""
    iceberg = table.scan(snapshot_id=snapshot_id, selected_fields=tuple(names))
    tasks = [t for t in iceberg.plan_files() if only is None or t.file.file_path in only]
    arrow = schema_to_pyarrow(table.schema().select(*names), include_field_ids=False)
    target = pa.schema(
        [
            pa.field(
                f.name, pa.string() if pa.types.is_large_string(f.type) or pa.types.is_string_view(f.type) else f.type
            )
            for f in arrow
        ]
    )
    if only is None and any(t.delete_files for t in tasks):
        reader = iceberg.to_arrow_batch_reader()
        return pa.RecordBatchReader.from_batches(target, (b.cast(target) for b in reader))

    return pa.RecordBatchReader.from_batches(
        target, read_files(table, [t.file.file_path for t in tasks], target, batch_rows=BATCH_ROWS)
    )


def data_expr(columns: Sequence[Column]) -> sql.Composable:
    """jsonb of the staged typed columns; jsonb_build_object takes at most 100 arguments, so groups of 50."""
    groups = []
    for i in range(0, len(columns), 50):
        pairs = []
        for c in columns[i : i + 50]:
            value = sql.SQL("s.{}::jsonb" if c.type == "json" else "s.{}").format(sql.Identifier(c.name))
            pairs.append(sql.SQL("{}, {}").format(sql.Literal(c.name), value))
        groups.append(sql.SQL("jsonb_build_object({})").format(sql.SQL(", ").join(pairs)))
    return sql.SQL(" || ").join(groups) if groups else sql.SQL("'{}'::jsonb")


def counted(stmt: sql.Composable) -> sql.Composable:
    """A data-changing statement as a query returning how many rows it changed (any driver, exactly)."""
    return sql.SQL("with changed as ({} returning 1) select count(*) from changed").format(stmt)
