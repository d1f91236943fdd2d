"""A routed read's rows as Arrow record batches of the projected schema, never the whole dataset in memory.

Postgres: the in-process read's typed projection (routing/pg_reader.py) through a server-side cursor in one
transaction (one snapshot), ``batch_rows`` rows per fetch. Iceberg: the snapshot's data files one at a time,
each read row group by row group (pyarrow), columns matched by Iceberg field id as lake/reader.py does; a file
with delete files goes through pyiceberg's own ArrowScan (one file at a time). pyiceberg's
``to_arrow_batch_reader`` is not used: it reads every file of the scan at once in a thread pool, so its peak is
the table's (pyiceberg 0.12). An ordered Iceberg read (``__row_index``) holds one data file at a time, or a group of
files whose ``__row_index`` ranges overlap (one group of every file when a file has no bounds); with a ``limit``
it holds at most the ``limit`` smallest rows seen so far plus one batch (a running top-k over the group's
batches), never the group.

``open`` does everything that can fail before the first byte is sent: the plan, every data file's existence
and the first batch, so an Iceberg error there can still fall back to Postgres (routing/read_router.py).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Generator, Iterator

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.conversions import from_bytes
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.types import LongType

from lakehouse_dagster.api.datasets import Dataset
from lakehouse_dagster.api.lake import columns_in_file
from lakehouse_dagster.api.reads import Projection, postgres_query, projected_schema

log = logging.getLogger("lakehouse_dagster.service")

ROW_INDEX = "__row_index"
Batches = Generator[pa.RecordBatch, None, None]


class BatchStream:
    """An iterator of record batches of ``schema`` that frees what it holds on ``close`` (idempotent)."""

    schema: pa.Schema
    rows = 0  # rows handed out so far

    def __init__(self, schema: pa.Schema, batches: Iterator[pa.RecordBatch], on_close: Callable[[], None]):
        self.schema = schema
        self._batches = batches
        self._on_close: Callable[[], None] | None = on_close
        self._first: pa.RecordBatch | None = None

    def prime(self) -> BatchStream:
        """Read the first batch now (errors surface here, before anything is sent); closed if that fails."""
        try:
            self._first = next(self._batches, None)
        except BaseException:
            self.close()
            raise
        return self

    def next_batch(self) -> pa.RecordBatch | None:
        """The next batch, None at the end."""
        if self._first is not None:
            batch, self._first = self._first, None
        else:
            batch = next(self._batches, None)
        if batch is not None:
            self.rows += batch.num_rows
        return batch

    def close(self) -> None:
        on_close, self._on_close = self._on_close, None
        if on_close is None:
            return
        try:
            close = getattr(self._batches, "close", None)
            if close is not None:
                close()
        finally:
            on_close()


def postgres_stream(
    conn: psycopg.Connection, dataset: Dataset, projection: Projection, batch_rows: int, release: Callable[[], None]
) -> BatchStream:
    """The rows through a server-side cursor; ``release`` is called once the cursor and transaction are gone."""
    schema = projected_schema(dataset, projection)
    query, params = postgres_query(dataset, projection)
    stack = contextlib.ExitStack()
    try:
        stack.enter_context(conn.transaction())
        cur = stack.enter_context(conn.cursor(name="lakehouse_service_read"))
        cur.itersize = batch_rows
        cur.execute(query, params)
    except BaseException:
        _close_quietly(stack)
        release()
        raise

    def batches() -> Iterator[pa.RecordBatch]:
        while True:
            rows = cur.fetchmany(batch_rows)
            if not rows:
                return
            cols = list(zip(*rows))
            yield pa.RecordBatch.from_arrays(
                [pa.array(col, type=field.type) for col, field in zip(cols, schema)], schema=schema
            )

    def close() -> None:
        try:
            _close_quietly(stack)
        finally:
            release()

    return BatchStream(schema, batches(), close).prime()


def _close_quietly(stack: contextlib.ExitStack) -> None:
    try:
        stack.close()
    except Exception as exc:  # noqa: BLE001 - a broken connection cannot close its cursor; the pool drops it
        log.debug("closing a read's cursor failed: %s", type(exc).__name__)


def iceberg_stream(
    table, snapshot_id: int | None, dataset: Dataset, projection: Projection, batch_rows: int
) -> BatchStream:
    """The snapshot's rows, file by file (see the module docstring)."""
    schema = projected_schema(dataset, projection)
    names = list(projection.columns)
    fields = tuple(dict.fromkeys([*names, ROW_INDEX])) if projection.order_by_row_index else tuple(names)
    scan = table.scan(selected_fields=fields, snapshot_id=snapshot_id)
    tasks = list(scan.plan_files())
    for task in tasks:  # a missing file fails now (a fallback can still happen), not mid-stream
        if not table.io.new_input(task.file.file_path).exists():
            raise FileNotFoundError(f"data file {task.file.file_path} of snapshot {snapshot_id} is missing")
    reader = _FileReader(table, scan, fields, schema, batch_rows)
    if projection.order_by_row_index:
        field_id = table.schema().find_field(ROW_INDEX).field_id
        batches = _ordered(reader, tasks, field_id, names, schema, batch_rows, projection.limit)
    else:
        batches = _every_file(reader, tasks)
    if projection.limit is not None:
        batches = _limited(batches, projection.limit)
    return BatchStream(schema, batches, lambda: None).prime()


def _every_file(reader: _FileReader, tasks: list) -> Batches:
    for task in tasks:
        yield from reader.batches(task)  # a close() reaches the open file's reader


class _FileReader:
    """One data file's rows as batches of ``fields`` (cast to ``schema``'s types, plus __row_index for ordering)."""

    def __init__(self, table, scan, fields: tuple[str, ...], schema: pa.Schema, batch_rows: int):
        self.table, self.scan, self.fields, self.batch_rows = table, scan, fields, batch_rows
        self.projection = scan.projection()  # the snapshot's schema, projected
        by_name = {f.name: f for f in schema}
        by_name.setdefault(ROW_INDEX, pa.field(ROW_INDEX, pa.int64(), nullable=False))
        self.target = pa.schema([by_name[n] for n in fields])

    def batches(self, task, batch_rows: int | None = None) -> Iterator[pa.RecordBatch]:
        batch_rows = batch_rows or self.batch_rows
        if task.delete_files:
            yield from self._through_pyiceberg(task, batch_rows)
            return
        with self.table.io.new_input(task.file.file_path).open() as f:
            pf = pq.ParquetFile(f)
            found = columns_in_file(pf.schema_arrow, {n: self.projection.find_field(n).field_id for n in self.fields})
            # by field id (lake/parquet_ids.py); a column the file lacks reads as NULL ("" is no Parquet name)
            in_file = [found[n] or "" for n in self.fields]
            wanted = [c for c in dict.fromkeys(in_file) if c]
            for batch in pf.iter_batches(batch_size=batch_rows, columns=wanted, use_threads=True):
                yield self._shape(batch, in_file)

    def _shape(self, batch: pa.RecordBatch, in_file: list[str]) -> pa.RecordBatch:
        cols = []
        for name, field in zip(in_file, self.target):
            idx = batch.schema.get_field_index(name)
            cols.append(batch.column(idx).cast(field.type) if idx >= 0 else pa.nulls(batch.num_rows, field.type))
        return pa.RecordBatch.from_arrays(cols, schema=self.target)

    def _through_pyiceberg(self, task, batch_rows: int) -> Iterator[pa.RecordBatch]:
        scan = self.scan
        arrow_scan = ArrowScan(scan.table_metadata, scan.io, self.projection, AlwaysTrue(), scan.case_sensitive)
        for batch in arrow_scan.to_record_batches([task]):
            for piece in pa.Table.from_batches([batch]).to_batches(max_chunksize=batch_rows):
                yield self._shape(piece, list(self.fields))


# Rows per batch a limited ordered read scans: its memory is the limit's rows plus one such batch (pyarrow's
# Parquet reader holds about a batch's worth of decoded pages: 3.4 MB at 1,024 rows of ~330 B, 8.9 MB at 8,192).
TOP_K_SCAN_ROWS = 1024


def _ordered(
    reader: _FileReader,
    tasks: list,
    field_id: int,
    names: list[str],
    schema: pa.Schema,
    batch_rows: int,
    limit: int | None = None,
) -> Batches:
    """Ascending __row_index: groups of files whose ranges overlap, in order, each group sorted in memory — or,
    with ``limit``, only the group's ``limit`` smallest rows kept (the groups' ranges do not overlap: once the
    groups so far gave ``limit`` rows, no later group has a smaller one)."""
    left = limit
    for group in _overlapping_groups(tasks, field_id):
        if left is not None:
            if left <= 0:
                return
            data = _smallest(reader, group, left)
            left -= data.num_rows
        else:
            data = pa.Table.from_batches([b for task in group for b in reader.batches(task)], schema=reader.target)
            data = data.take(pc.sort_indices(data, sort_keys=[(ROW_INDEX, "ascending")]))
        data = data.select(names).cast(schema)
        yield from data.to_batches(max_chunksize=batch_rows)
        del data


def _smallest(reader: _FileReader, group: list, k: int) -> pa.Table:
    """The ``k`` rows of smallest __row_index in ``group``'s files, sorted: a running top-k, so at most ``k`` rows
    plus one scanned batch are held (rows past the k-th smallest so far are dropped before they are kept)."""
    kept = pa.Table.from_batches([], schema=reader.target)
    scan_rows = max(TOP_K_SCAN_ROWS, min(k, reader.batch_rows))
    for task in group:
        for batch in reader.batches(task, scan_rows):
            if kept.num_rows >= k:  # only rows below the k-th smallest so far can enter
                worst = kept.column(ROW_INDEX)[k - 1]
                batch = batch.filter(pc.less(batch.column(ROW_INDEX), worst))
                if batch.num_rows == 0:
                    continue
            kept = pa.concat_tables([kept, pa.Table.from_batches([batch], schema=reader.target)])
            kept = kept.take(pc.sort_indices(kept, sort_keys=[(ROW_INDEX, "ascending")])[:k])
    return kept.combine_chunks()


def _overlapping_groups(tasks: list, field_id: int) -> list[list]:
    ranges = []
    for task in tasks:
        lower = (task.file.lower_bounds or {}).get(field_id)
        upper = (task.file.upper_bounds or {}).get(field_id)
        if lower is None or upper is None:
            return [tasks] if tasks else []
        ranges.append((from_bytes(LongType(), lower), from_bytes(LongType(), upper), task))
    groups: list[list] = []
    high = None
    for lo, hi, task in sorted(ranges, key=lambda r: (r[0], r[1])):
        if groups and high is not None and lo <= high:
            groups[-1].append(task)
            high = max(high, hi)
        else:
            groups.append([task])
            high = hi
    return groups


def _limited(batches: Batches, limit: int) -> Batches:
    """The first ``limit`` rows; the source is closed as soon as they are out (no file is read further)."""
    left = limit
    try:
        while left > 0:
            batch = next(batches, None)
            if batch is None:
                return
            if batch.num_rows > left:
                batch = batch.slice(0, left)
            left -= batch.num_rows
            yield batch
    finally:
        batches.close()
