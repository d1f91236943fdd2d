"""The Iceberg executor of a structured read: the plan over a pinned snapshot, pushed down, computed by DuckDB.

1. Files: pyiceberg plans the snapshot's data files with a ``row_filter`` made from the plan — the ``__row_index``
   addressing and the predicates on int64 / string / date / timestamp columns (and/or of comparisons, ``in``,
   null tests: a superset of the rows asked for, so the stats only drop files that cannot match). Never on
   float64 columns (Parquet and Iceberg leave NaN out of min/max, where both SQL engines sort it above every
   number) nor under a ``not``.
2. Row groups: in each file only the row groups whose ``__row_index`` min/max meet the addressing are read.
3. Rows: the planned Parquet files are read with pyarrow, columns matched by Iceberg field id (a renamed or
   Java-sanitised column still reads; one added after a file was written reads as nulls), batch by batch, and
   handed to DuckDB as an Arrow stream: DuckDB filters, groups and sorts — over the stream, so memory is bounded
   by the result (groups, or the rows of a row read; a limited ordered read keeps its top rows), not the table.
   DuckDB is not let read the Parquet files itself: its Parquet reader prunes on the files' float statistics,
   which leave NaN out, and would drop a NaN that ``f > 1`` matches (parity/canonical.py saw the same).
4. A keyset page (``after_row_index`` / ``order: row_index`` with a limit) reads groups of row groups in
   ``__row_index`` order and stops once the page is full: O(row group), not O(table); in a row group sorted by
   ``__row_index`` it reads batch by batch from the page's first row and stops at the batch that fills the page.
   The mirror writes row groups of 16,384 rows (lake/write_files.py), so a page decodes at most that many first.
5. ``row_ids``: a ``__row_id`` is a random uuid, so no min/max prunes a file or a row group. Each row group's
   ``__row_id`` column is read alone first and matched in Arrow; only the row groups holding a wanted id are read
   further, and only their matching rows reach DuckDB. Still O(table) in that one column (the floor: decoding the
   ``__row_id`` strings of every row group), no longer in every column nor through DuckDB.

``iceberg_scan`` was not used: it reads the files by name through DuckDB's own Parquet reader (point 3), and needs
the avro and iceberg extensions installed. A snapshot with delete files is refused with the reason (the router
then falls back to Postgres where the mode allows it): the project's writers never write them.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.conversions import from_bytes
from pyiceberg.expressions import (
    AlwaysTrue,
    And,
    BooleanExpression,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNull,
    LessThan,
    LessThanOrEqual,
    NotNull,
    Or,
)
from pyiceberg.types import LongType

from lakehouse_dagster.core import duckdb_signals
from lakehouse_dagster.lake.schema import arrow_type
from lakehouse_dagster.routing import compute
from lakehouse_dagster.routing.compute_sql import DUCKDB, Frag, T, conditions, rows_query
from lakehouse_dagster.routing.errors import CannotServe
from lakehouse_dagster.routing.request import ROW_INDEX, Bound, Cmp, Logic, Plan, referenced

ROW_ID = "__row_id"

BATCH_ROWS = 65_536
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


_databases: dict[int | None, Any] = {}
_databases_lock = threading.Lock()


def _cursor(threads: int | None):
    """A connection of the process's in-memory DuckDB database (one per ``threads``): a cursor costs ~0.3 ms where a
    new database costs ~11 ms; each has its own registered stream, so concurrent reads do not meet."""
    with _databases_lock:
        db = _databases.get(threads)
        if db is None:
            db = _databases[threads] = duckdb_signals.connect(threads)  # Ctrl-C mid-query stays a Ctrl-C
    return db.cursor()


def read_iceberg_compute(table, snapshot_id: int | None, plan: Plan, *, threads: int | None = None) -> pa.Table:
    names = referenced(plan)
    in_snapshot = {f.name for f in table.scan(snapshot_id=snapshot_id).projection().fields}
    missing = [n for n in names if n not in in_snapshot]
    if missing:
        raise CannotServe(f"snapshot {snapshot_id} has no column {', '.join(missing)} (not mirrored yet)")
    scan = table.scan(row_filter=prune_filter(plan), selected_fields=names, snapshot_id=snapshot_id)
    projected = scan.projection()
    field_ids = {n: projected.find_field(n).field_id for n in names}
    tasks = list(scan.plan_files())
    if any(t.delete_files for t in tasks):
        raise CannotServe(f"snapshot {snapshot_id} has delete files; compute over it is not supported yet")
    target = pa.schema([pa.field(n, arrow_type(plan.types[n])) for n in names])
    files = _Files(table, tasks, field_ids, target, plan)
    con = _cursor(threads)
    try:
        con.execute("set TimeZone = 'UTC'")
        conds = conditions(DUCKDB, plan)

        def run_on(batches: Callable[[], Iterable[pa.RecordBatch]]):
            def run(frag: Frag) -> list[tuple]:
                con.register("src", pa.RecordBatchReader.from_batches(target, batches()))
                try:
                    text, params = DUCKDB.render(frag)
                    return con.execute(text, params).fetchall()
                finally:
                    con.unregister("src")

            return run

        if plan.order == ((ROW_INDEX, False),) and plan.limit is not None and not plan.is_aggregate:
            return _keyset(files, plan, conds, run_on)
        units = files.units()
        if plan.row_ids is not None:  # at most one row per id: collected first, DuckDB is handed them at once
            found = list(files.batches(units))
            return compute.answer(DUCKDB, plan, T("src"), conds, run_on(lambda: found))
        return compute.answer(DUCKDB, plan, T("src"), conds, run_on(lambda: files.batches(units)))
    finally:
        con.close()


# Rows per batch a keyset page reads from a row group sorted by __row_index: it stops at the batch that fills it.
PAGE_BATCH_ROWS = 8192


def _keyset(files: _Files, plan: Plan, conds, run_on) -> pa.Table:
    """Groups of row groups in __row_index order (their ranges do not overlap), until the page is full. A group that
    is one row group sorted by __row_index (the mirror writes them so) is read batch by batch from the page's first
    row and left as soon as the page is full; any other group is read whole."""
    schema = compute.result_schema(plan)
    rows: list[tuple] = []
    left = plan.limit or 0
    for group in files.ordered_groups():
        if left <= 0:
            break
        batches = files.sorted_from(group, plan.after_row_index)
        if batches is None:
            got = run_on(lambda: files.batches(group))(rows_query(DUCKDB, plan, T("src"), conds, limit=left))
            rows += got
            left -= len(got)
            continue
        try:
            for batch in batches:  # ascending batches of ascending rows: each batch's first rows come next
                got = run_on(lambda: [batch])(rows_query(DUCKDB, plan, T("src"), conds, limit=left))
                rows += got
                left -= len(got)
                if left <= 0:
                    break
        finally:
            batches.close()  # the file is closed with it
    return compute.to_table(schema, rows)


class _Unit:
    """A data file's row groups to read (all of them when ``row_groups`` is None)."""

    def __init__(self, path: str, row_groups: list[int] | None, lo: int | None, hi: int | None):
        self.path, self.row_groups, self.lo, self.hi = path, row_groups, lo, hi


class _Files:
    def __init__(self, table, tasks: list, field_ids: dict[str, int], target: pa.Schema, plan: Plan):
        self.table, self.tasks, self.field_ids, self.target = table, tasks, field_ids, target
        self.spans = _row_index_spans(plan)  # inclusive (lo, hi) spans the addressing allows; None: all
        # row_ids: only these rows are read (point 5 of the module docstring); DuckDB still applies the condition
        self.row_ids = None if plan.row_ids is None else pa.array(plan.row_ids, pa.string())
        self.row_id_field = table.schema().find_field(ROW_ID).field_id

    def _meets(self, lo: int | None, hi: int | None) -> bool:
        if self.spans is None or lo is None or hi is None:
            return True
        return any(a <= hi and lo <= b for a, b in self.spans)

    def units(self) -> list[_Unit]:
        """Every planned file, its row groups pruned when it is opened."""
        return [_Unit(t.file.file_path, None, *self._file_bounds(t)) for t in self.tasks]

    def _file_bounds(self, task) -> tuple[int | None, int | None]:
        fid = self.field_ids[ROW_INDEX]
        lo, hi = (task.file.lower_bounds or {}).get(fid), (task.file.upper_bounds or {}).get(fid)
        if lo is None or hi is None:
            return None, None
        return int(from_bytes(LongType(), lo)), int(from_bytes(LongType(), hi))

    def ordered_groups(self) -> Iterator[list[_Unit]]:
        """Row groups in ascending __row_index ranges, overlapping ones together (a file without bounds: one group
        of everything). Files are opened for their row-group statistics only as the page reaches them."""
        bounds = [(self._file_bounds(t), t) for t in self.tasks]
        if any(lo is None for (lo, _), _ in bounds):
            yield self.units()
            return
        for file_group in _overlapping([(lo or 0, hi or 0, t) for (lo, hi), t in bounds]):
            rgs: list[tuple[int, int, _Unit]] = []
            for task in file_group:
                for i, lo, hi in self._row_groups(task.file.file_path):
                    if lo is None or hi is None:
                        rgs = [(0, 0, _Unit(t.file.file_path, None, None, None)) for t in file_group]
                        break
                    rgs.append((lo, hi, _Unit(task.file.file_path, [i], lo, hi)))
                else:
                    continue
                break
            yield from _overlapping(rgs)

    def _row_groups(self, path: str) -> list[tuple[int, Any, Any]]:
        with self.table.io.new_input(path).open() as f:
            pf = pq.ParquetFile(f)
            return self._row_groups_of(pf, _file_column(pf, self.field_ids[ROW_INDEX], ROW_INDEX))

    def batches(self, units: list[_Unit]) -> Iterator[pa.RecordBatch]:
        for unit in units:
            if not self._meets(unit.lo, unit.hi):
                continue
            with self.table.io.new_input(unit.path).open() as f:
                pf = pq.ParquetFile(f)
                in_file = {n: _file_column(pf, fid, n) for n, fid in self.field_ids.items()}
                present = set(pf.schema_arrow.names)
                wanted = [c for c in dict.fromkeys(in_file.values()) if c in present]
                groups = unit.row_groups
                if groups is None:
                    groups = [i for i, _lo, _hi in self._row_groups_of(pf, in_file.get(ROW_INDEX))]
                if not groups:
                    continue
                if self.row_ids is not None:
                    yield from self._by_row_id(pf, groups, wanted, in_file)
                    continue
                for batch in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=groups, columns=wanted):
                    yield self._shape(batch, in_file)

    def _by_row_id(self, pf: pq.ParquetFile, groups: list[int], wanted: list, in_file: dict) -> Iterator:
        """The rows of ``groups`` whose __row_id is asked for: the __row_id column first (decoded once), the other
        columns only of the row groups where it matched."""
        col = _file_column(pf, self.row_id_field, ROW_ID)
        if col is None or col not in pf.schema_arrow.names:
            return  # no __row_id in this file: none of its rows can match
        rest = [c for c in wanted if c != col]
        for rg in groups:
            ids = pf.read_row_group(rg, columns=[col]).column(0)
            mask = pc.is_in(ids, value_set=self.row_ids)
            if not pc.any(mask).as_py():
                continue
            found = pf.read_row_group(rg, columns=rest).filter(mask)
            if col in wanted:
                found = found.append_column(col, ids.filter(mask))
            yield self._shape(found.combine_chunks().to_batches()[0], in_file)

    def _row_groups_of(self, pf: pq.ParquetFile, col: str | None) -> list[tuple[int, Any, Any]]:
        idx = pf.schema_arrow.get_field_index(col) if col is not None else -1
        out = []
        for i in range(pf.metadata.num_row_groups):
            stats = pf.metadata.row_group(i).column(idx).statistics if idx >= 0 else None
            lo, hi = (stats.min, stats.max) if stats is not None and stats.has_min_max else (None, None)
            if self._meets(lo, hi):
                out.append((i, lo, hi))
        return out

    def sorted_from(self, group: list[_Unit], after: int | None) -> Generator[pa.RecordBatch, None, None] | None:
        """The batches of a one-row-group ``group`` from its first row above ``after``, when the row group is sorted
        by __row_index (its __row_index column is read first to know); None otherwise."""
        if len(group) != 1 or group[0].row_groups is None or len(group[0].row_groups) != 1:
            return None
        unit, rg = group[0], group[0].row_groups[0]
        f = self.table.io.new_input(unit.path).open()
        try:
            pf = pq.ParquetFile(f)
            in_file = {n: _file_column(pf, fid, n) for n, fid in self.field_ids.items()}
            index_col = in_file[ROW_INDEX]
            if index_col is None or index_col not in pf.schema_arrow.names:
                f.close()
                return None
            index = pf.read_row_group(rg, columns=[index_col]).column(0).to_numpy()
            if len(index) > 1 and not bool((index[1:] > index[:-1]).all()):
                f.close()
                return None
            start = 0 if after is None else int(np.searchsorted(index, after, side="right"))
        except BaseException:
            f.close()
            raise
        return self._from_row(f, pf, rg, in_file, start)

    def _from_row(self, f, pf: pq.ParquetFile, rg: int, in_file: dict, start: int) -> Generator[pa.RecordBatch]:
        present = set(pf.schema_arrow.names)
        wanted = [c for c in dict.fromkeys(in_file.values()) if c in present]
        try:
            offset = 0
            for batch in pf.iter_batches(batch_size=PAGE_BATCH_ROWS, row_groups=[rg], columns=wanted):
                end = offset + batch.num_rows
                if end > start:  # (the batches before the page's first row are decoded, not queried)
                    yield self._shape(batch.slice(max(0, start - offset)), in_file)
                offset = end
        finally:
            f.close()

    def _shape(self, batch: pa.RecordBatch, in_file: dict[str, str | None]) -> pa.RecordBatch:
        cols = []
        for field in self.target:
            name = in_file[field.name]
            idx = batch.schema.get_field_index(name) if name is not None else -1
            cols.append(batch.column(idx).cast(field.type) if idx >= 0 else pa.nulls(batch.num_rows, field.type))
        return pa.RecordBatch.from_arrays(cols, schema=self.target)


def _file_column(pf: pq.ParquetFile, field_id: int, name: str) -> str | None:
    """The file's column holding the Iceberg field (by field id; by name in a file written without ids)."""
    has_ids = False
    for field in pf.schema_arrow:
        fid = (field.metadata or {}).get(b"PARQUET:field_id")
        if fid is not None:
            has_ids = True
            if int(fid) == field_id:
                return field.name
    return None if has_ids else name


def _overlapping(ranges: Sequence[tuple[int, int, Any]]) -> list[list]:
    groups: list[list] = []
    high = None
    for lo, hi, item in sorted(ranges, key=lambda r: (r[0], r[1])):
        if groups and high is not None and lo <= high:
            groups[-1].append(item)
            high = max(high, hi)
        else:
            groups.append([item])
            high = hi
    return groups


def _row_index_spans(plan: Plan) -> list[tuple[int, int]] | None:
    spans: list[tuple[int, int]] | None = None
    if plan.row_ranges:
        spans = [(lo, hi) for lo, hi in plan.row_ranges]
    if plan.after_row_index is not None:
        after = plan.after_row_index
        base = spans if spans is not None else [(after + 1, 2**63 - 1)]
        spans = [(max(lo, after + 1), hi) for lo, hi in base if hi > after]
    return spans


# --- the pyiceberg row filter: a superset of the rows asked for -------------------------------------------------

_PRUNABLE = ("int64", "string", "date", "timestamp")
_ICE_OPS: dict[str, Any] = {
    "eq": EqualTo,
    "lt": LessThan,
    "le": LessThanOrEqual,
    "gt": GreaterThan,
    "ge": GreaterThanOrEqual,
}


def prune_filter(plan: Plan) -> BooleanExpression:
    parts: list[BooleanExpression] = []
    spans = _row_index_spans(plan)
    if spans is not None:
        # pyiceberg's expressions take (term, literal) positionally; its stubs declare keyword fields only
        ge, le = GreaterThanOrEqual, LessThanOrEqual
        parts.append(_or([_and([ge(ROW_INDEX, lo), le(ROW_INDEX, hi)]) for lo, hi in spans]))  # type: ignore[call-arg, arg-type]
    if plan.where is not None:
        parts.append(_prune(plan.where))
    return _and(parts)


def _prune(p: Bound) -> BooleanExpression:
    if isinstance(p, Logic):
        if p.op == "and":
            return _and([_prune(a) for a in p.args])
        if p.op == "or":
            return _or([_prune(a) for a in p.args])
        return AlwaysTrue()
    assert isinstance(p, Cmp)
    if p.type not in _PRUNABLE or p.op == "ne":
        return AlwaysTrue()
    if p.op == "is_null":
        return IsNull(p.column)  # type: ignore[call-arg, arg-type]
    if p.op == "not_null":
        return NotNull(p.column)  # type: ignore[call-arg, arg-type]
    values = [_ice_value(v) for v in p.values]
    if p.op == "in":
        return In(p.column, set(values))  # type: ignore[call-arg, arg-type]
    return _ICE_OPS[p.op](p.column, values[0])


def _ice_value(v: Any) -> Any:
    if isinstance(v, dt.datetime):
        return (v - _EPOCH) // dt.timedelta(microseconds=1)
    if isinstance(v, dt.date):
        return (v - dt.date(1970, 1, 1)).days
    return v


def _and(parts: list[BooleanExpression]) -> BooleanExpression:
    parts = [p for p in parts if p != AlwaysTrue()]
    if not parts:
        return AlwaysTrue()
    out = parts[0]
    for p in parts[1:]:
        out = And(out, p)
    return out


def _or(parts: list[BooleanExpression]) -> BooleanExpression:
    if not parts or any(p == AlwaysTrue() for p in parts):
        return AlwaysTrue() if parts else _nothing()
    out = parts[0]
    for p in parts[1:]:
        out = Or(out, p)
    return out


def _nothing() -> BooleanExpression:
    from pyiceberg.expressions import AlwaysFalse  # lazy: only a request that can match no row needs it

    return AlwaysFalse()
