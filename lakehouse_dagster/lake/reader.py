"""The Iceberg read path: projection + limit, optionally ordered by __row_index, pinned to a snapshot.

An ordered read with a limit does not scan the whole table: from the data files' __row_index
bounds it finds the smallest threshold T such that the files entirely at or below T hold at
least ``limit`` rows, and scans with ``__row_index <= T`` (files above T are pruned by their
stats), then keeps the ``limit`` smallest. Tables with delete files fall back to a projected scan.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.conversions import from_bytes
from pyiceberg.expressions import AlwaysTrue, LessThanOrEqual
from pyiceberg.table import Table
from pyiceberg.types import LongType

from lakehouse_dagster.core.errors import NotFound
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.lake.catalog import load_table_or_none, table_identifier
from lakehouse_dagster.lake.parquet_ids import columns_in_file

ROW_INDEX = "__row_index"


def load_dataset_table(catalog: Catalog, settings: Settings, dataset_id: uuid.UUID) -> Table:
    ident = table_identifier(settings, dataset_id)
    table = load_table_or_none(catalog, ident)
    if table is None:
        raise NotFound(f"Iceberg table {'.'.join(ident)} for dataset {dataset_id} does not exist")
    return table


def read_iceberg(
    table: Table,
    columns: Sequence[str],
    *,
    limit: int | None = None,
    order_by_row_index: bool = False,
    snapshot_id: int | None = None,
) -> pa.Table:
    """Rows of ``columns`` (in that order) from the snapshot (default: current)."""
    if limit == 0:
        return _empty(table, columns)
    if not order_by_row_index:
        scan = table.scan(selected_fields=tuple(columns), limit=limit, snapshot_id=snapshot_id)
        return scan.to_arrow().select(list(columns))
    fields = tuple(dict.fromkeys([*columns, ROW_INDEX]))
    row_filter = AlwaysTrue() if limit is None else _row_index_threshold(table, limit, snapshot_id)
    data = table.scan(row_filter=row_filter, selected_fields=fields, snapshot_id=snapshot_id).to_arrow()
    if limit is not None and data.num_rows > limit:
        order = pc.select_k_unstable(data, k=limit, sort_keys=[(ROW_INDEX, "ascending")])
    else:
        order = pc.sort_indices(data, sort_keys=[(ROW_INDEX, "ascending")])
    return data.take(order).select(list(columns))


def _row_index_threshold(table: Table, limit: int, snapshot_id: int | None):
    """``__row_index <= T`` covering at least ``limit`` rows, from file stats; AlwaysTrue when unknown."""
    field_id = table.schema().find_field(ROW_INDEX).field_id
    bounds: list[tuple[Any, int]] = []
    for task in table.scan(selected_fields=(ROW_INDEX,), snapshot_id=snapshot_id).plan_files():
        upper = (task.file.upper_bounds or {}).get(field_id)
        if task.delete_files or upper is None:
            return AlwaysTrue()
        bounds.append((from_bytes(LongType(), upper), task.file.record_count))
    rows = 0
    for upper, count in sorted(bounds):
        rows += count
        if rows >= limit:
            return LessThanOrEqual(ROW_INDEX, upper)  # type: ignore[call-arg, arg-type]  # (term, literal), as pyiceberg takes them
    return AlwaysTrue()


def _empty(table: Table, columns: Sequence[str]) -> pa.Table:
    return table.scan(selected_fields=tuple(columns), limit=0).to_arrow().select(list(columns))


def read_files(table: Table, paths: Sequence[str], target: pa.Schema, batch_rows: int = 65_536):
    """The rows of these data files (no delete files apply: the chunked writer's tables have none) as
    ``target``-shaped batches, file by file (memory bounded by a batch). Columns are matched by Iceberg field
    id (lake/parquet_ids.py), so a renamed column, or one another engine wrote under a sanitised Parquet name,
    still reads; a column added after a file was written reads as nulls."""

    schema_ids = {f.name: f.field_id for f in table.schema().fields}
    wanted = {field.name: schema_ids[field.name] for field in target}
    for path in paths:
        with table.io.new_input(path).open() as f:
            pf = pq.ParquetFile(f)
            in_file = columns_in_file(pf.schema_arrow, wanted)
            for batch in pf.iter_batches(batch_size=batch_rows):
                cols = []
                for field in target:
                    name = in_file[field.name]
                    idx = batch.schema.get_field_index(name) if name is not None else -1
                    cols.append(
                        batch.column(idx).cast(field.type) if idx >= 0 else pa.nulls(batch.num_rows, field.type)
                    )
                yield pa.RecordBatch.from_arrays(cols, schema=target)
