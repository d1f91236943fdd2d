"""The chunked Iceberg writer: Parquet files streamed chunk by chunk, then ONE commit.

Rows arrive as Arrow record batches and go straight into a ParquetWriter (pyarrow's writer is faster
than pyiceberg's own and its files smaller — FIELD-NOTES); a file is closed every
``chunk_rows`` rows. Nothing is committed until every file is written, so a failure or a killed
process leaves no snapshot, only files this module deletes (or the next sync of the dataset does).
The files carry Iceberg field ids, so they are native data files: no name mapping, and a later
schema change still reads them by id.

One commit = one snapshot: an overwrite (full) or a fast append (incremental), with the table
properties that make the watermark durable (source version, max row index, row count) set in the
same transaction, and the sync id + source version in the snapshot summary.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import uuid
from typing import Callable, Iterable, Sequence

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.io.pyarrow import parquet_file_to_data_file
from pyiceberg.table import Table

from ..errors import SyncFailed
from ..settings import Settings
from ..store.datasets import Dataset
from .catalog import ensure_namespace, load_table_or_none, table_identifier
from .schema import COLUMNS_PROPERTY, arrow_schema, columns_property, iceberg_schema, iceberg_type

_log = logging.getLogger(__name__)

SYNC_ID = "lakehouse.sync-id"
SOURCE_VERSION = "lakehouse.source-version"
MAX_ROW_INDEX = "lakehouse.max-row-index"
ROW_COUNT = "lakehouse.row-count"
WRITE_PATH = "lakehouse.path"

TABLE_DEFAULTS = {
    "format-version": "2",
    "write.parquet.compression-codec": "zstd",
}


@dataclasses.dataclass(frozen=True)
class WriteResult:
    snapshot_id: int | None
    rows: int  # rows written by this call
    bytes: int
    files: int
    total_rows: int  # rows in the table after the commit
    committed: bool  # False when the sync's snapshot was already there (a retry) or nothing was written


def ensure_table(catalog: Catalog, settings: Settings, dataset: Dataset) -> Table:
    """Create the dataset's table, or evolve it to the dataset's current schema (new columns added,
    removed ones kept, nullable). A type change that Iceberg cannot promote is refused loudly."""
    ident = table_identifier(settings, dataset.id)
    table = load_table_or_none(catalog, ident)
    if table is None:
        ensure_namespace(catalog, settings.namespace)
        props = dict(TABLE_DEFAULTS)
        props[COLUMNS_PROPERTY] = columns_property(dataset.columns)
        try:
            return catalog.create_table(ident, schema=iceberg_schema(dataset.columns), properties=props)
        except Exception as exc:  # lost a creation race with another process
            table = load_table_or_none(catalog, ident)
            if table is None:
                raise SyncFailed(f"dataset {dataset.id}: cannot create Iceberg table {'.'.join(ident)}: {exc}") from exc
    existing = {f.name: f for f in table.schema().fields}
    missing = [c for c in dataset.columns if c.name not in existing]
    changed = [c for c in dataset.columns if c.name in existing and existing[c.name].field_type != iceberg_type(c.type)]
    if changed:
        c = changed[0]
        raise SyncFailed(
            f"dataset {dataset.id}: column {c.name!r} changed type to {c.type} but the Iceberg table has "
            f"{existing[c.name].field_type}; Iceberg cannot convert it in place — add a new column instead"
        )
    if missing or table.properties.get(COLUMNS_PROPERTY) != columns_property(dataset.columns):
        with table.transaction() as tx:
            if missing:
                with tx.update_schema() as update:
                    update.union_by_name(iceberg_schema(dataset.columns))
            tx.set_properties({COLUMNS_PROPERTY: columns_property(dataset.columns)})
        table = table.refresh()
    return table


def find_sync_snapshot(table: Table, sync_id: uuid.UUID) -> int | None:
    """The snapshot a sync already committed (a retry after a lost response must not append twice)."""
    wanted = str(sync_id)
    for snap in reversed(table.snapshots()):
        if snap.summary is not None and snap.summary.additional_properties.get(SYNC_ID) == wanted:
            return snap.snapshot_id
    return None


def _file_schema(table: Table, names: Sequence[str], source: pa.Schema) -> pa.Schema:
    ids = {f.name: f.field_id for f in table.schema().fields}
    fields = []
    for name in names:
        f = source.field(name)
        fields.append(
            pa.field(name, f.type, nullable=(name != "__row_index"), metadata={b"PARQUET:field_id": str(ids[name]).encode()})
        )
    return pa.schema(fields)


class _FileRoller:
    """Writes batches into Parquet files of at most ``chunk_rows`` rows each."""

    def __init__(self, table: Table, schema: pa.Schema, sync_id: uuid.UUID, chunk_rows: int):
        self.table = table
        self.schema = schema
        self.sync_id = sync_id
        self.chunk_rows = chunk_rows
        self.paths: list[str] = []
        self.rows = 0
        self._writer: pq.ParquetWriter | None = None
        self._stream = None
        self._in_file = 0

    def _open(self) -> None:
        path = f"{self.table.location()}/data/lakehouse-{self.sync_id}-{len(self.paths):05d}.parquet"
        self._stream = self.table.io.new_output(path).create(overwrite=True)
        self._writer = pq.ParquetWriter(self._stream, self.schema, compression="zstd", write_statistics=True)
        self.paths.append(path)
        self._in_file = 0

    def _close_file(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._stream.close()
            self._writer = None
            self._stream = None

    def write(self, batch: pa.RecordBatch) -> None:
        batch = batch.cast(self.schema)
        offset = 0
        while offset < batch.num_rows:
            if self._writer is None:
                self._open()
            take = min(batch.num_rows - offset, self.chunk_rows - self._in_file)
            self._writer.write_batch(batch.slice(offset, take))
            self._in_file += take
            self.rows += take
            offset += take
            if self._in_file >= self.chunk_rows:
                self._close_file()

    def close(self) -> None:
        self._close_file()

    def delete_all(self) -> None:
        self.close()
        for path in self.paths:
            try:
                self.table.io.delete(path)
            except Exception as exc:  # leave it; the next sync's cleanup retries
                _log.warning("could not delete abandoned file %s: %s", path, exc)


def write_arrow(
    catalog: Catalog,
    settings: Settings,
    dataset: Dataset,
    batches: Iterable[pa.RecordBatch],
    *,
    mode: str,
    sync_id: uuid.UUID,
    source_version: int | None,
    max_row_index: int | None = None,
    path: str = "mirror",
    chunk_rows: int | None = None,
    commit_entries: Callable[[], tuple[dict, dict]] | None = None,
) -> WriteResult:
    """Write ``batches`` (laid out as ``arrow_schema(dataset.columns)``) into the dataset's table and
    commit once. mode="replace" makes the table hold exactly these rows; mode="append" adds them.
    ``commit_entries()`` — called once every batch is written (a source writer's cursor is known only
    then) — returns extra (table properties, snapshot summary) for the same commit."""
    if mode not in ("replace", "append"):
        raise ValueError(f"mode must be 'replace' or 'append', not {mode!r}")
    table = ensure_table(catalog, settings, dataset)
    already = find_sync_snapshot(table, sync_id)
    if already is not None:
        return WriteResult(already, 0, 0, 0, _row_count(table), committed=False)

    expected = arrow_schema(dataset.columns)
    file_schema = _file_schema(table, expected.names, expected)
    roller = _FileRoller(table, file_schema, sync_id, chunk_rows or settings.ingest_chunk_rows)
    try:
        for batch in batches:
            if batch.schema.names != expected.names:
                raise SyncFailed(
                    f"dataset {dataset.id}: batch columns {batch.schema.names} do not match the schema "
                    f"{expected.names}"
                )
            roller.write(batch)
        roller.close()
        data_files = [parquet_file_to_data_file(table.io, table.metadata, p) for p in roller.paths]
        nbytes = sum(df.file_size_in_bytes for df in data_files)
        previous_rows = 0 if mode == "replace" else _row_count(table)
        total = previous_rows + roller.rows
        props = {
            SOURCE_VERSION: str(source_version if source_version is not None else -1),
            MAX_ROW_INDEX: str(max_row_index if max_row_index is not None else _max_row_index(table, mode)),
            ROW_COUNT: str(total),
            WRITE_PATH: path,
        }
        summary = {SYNC_ID: str(sync_id), SOURCE_VERSION: props[SOURCE_VERSION], WRITE_PATH: path}
        if commit_entries is not None:
            extra_props, extra_summary = commit_entries()
            props.update(extra_props)
            summary.update(extra_summary)
        snapshot_id = _commit(table, data_files, replace=(mode == "replace"), summary=summary, props=props, sync_id=sync_id)
    except BaseException:
        roller.delete_all()
        raise
    return WriteResult(snapshot_id, roller.rows, nbytes, len(data_files), total, committed=True)


def _row_count(table: Table) -> int:
    raw = table.properties.get(ROW_COUNT)
    if raw is not None:
        return int(raw)
    snap = table.current_snapshot()
    if snap is None or snap.summary is None:
        return 0
    return int(snap.summary.additional_properties.get("total-records", 0))


def _max_row_index(table: Table, mode: str) -> int:
    return -1 if mode == "replace" else int(table.properties.get(MAX_ROW_INDEX, -1))


def _commit(table: Table, data_files, *, replace: bool, summary: dict, props: dict, sync_id: uuid.UUID) -> int:
    """One transaction: properties + one snapshot. pyiceberg retries a lost compare-and-swap itself
    (G4); past its retries we refresh and look for our own snapshot before giving up."""
    attempts = 3
    for attempt in range(attempts):
        try:
            tx = table.transaction()
            tx.set_properties(props)
            snapshot_update = tx.update_snapshot(snapshot_properties=summary)
            if replace:
                with snapshot_update.overwrite() as producer:
                    for task in table.scan().plan_files():
                        producer.delete_data_file(task.file)
                    for df in data_files:
                        producer.append_data_file(df)
            else:
                with snapshot_update.fast_append() as producer:
                    for df in data_files:
                        producer.append_data_file(df)
            tx.commit_transaction()
            break
        except CommitFailedException:
            table = table.refresh()
            found = find_sync_snapshot(table, sync_id)
            if found is not None:
                return found
            if attempt == attempts - 1:
                raise
            time.sleep(0.2 * (2**attempt))
    table = table.refresh()
    found = find_sync_snapshot(table, sync_id)
    if found is None:
        raise SyncFailed(f"commit of sync {sync_id} reported success but its snapshot is not in the table")
    return found


def table_state(table: Table) -> dict:
    """The durable watermark of a table (what the last commit covered)."""
    snap = table.current_snapshot()
    return {
        "snapshot_id": snap.snapshot_id if snap else None,
        "source_version": int(table.properties.get(SOURCE_VERSION, -1)),
        "max_row_index": int(table.properties.get(MAX_ROW_INDEX, -1)),
        "row_count": _row_count(table),
        "columns": json.loads(table.properties.get(COLUMNS_PROPERTY, "[]")),
    }
