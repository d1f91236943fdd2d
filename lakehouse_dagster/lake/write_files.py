"""A write's Parquet data files (lake/writer.py): rolled every ``chunk_rows`` rows, per lane, with Iceberg field ids;
deleted when the commit is known not to have happened, and how many could not be (``files_left``).

Row groups of ``ROW_GROUP_ROWS`` rows whatever the size of the batches that arrive (a file's last one smaller): a
reader that addresses rows by ``__row_index`` (a keyset page, a ``row_index`` range, routing/iceberg_compute.py)
prunes row groups on its min/max and decodes at most one row group's rows before the ones it wants. Before, each
incoming batch became one row group (100k-250k rows), so a page in the middle of a file decoded ~125k rows first.
16,384 rows: a page's worst case is ~16k rows decoded, while a full scan and the files' size stay within noise of
the larger groups (docs/benchmarks.md, "Structured reads": the layouts compared in one run).

No dictionary encoding for ``__row_index`` and ``__row_id``: every value is distinct, so the writer hashed each one
into a dictionary it then threw away at 1 MB (the first ~130,000 values of a row group) — in row groups of 16,384
rows it never reaches that limit and would keep a dictionary as large as the column. Plain, the files are ~7 % smaller,
the writer spends no more CPU than with the large groups it had, and a ``row_ids`` read decodes ``__row_id`` faster.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.table import Table

from lakehouse_dagster.core.errors import (
    first_line,
)
from lakehouse_dagster.core.failpoints import failpoint

_log = logging.getLogger("lakehouse_dagster.lake.writer")  # the writer's one logger, as before the split

ROW_GROUP_ROWS = 16_384  # rows per Parquet row group (the module docstring says why); 0: one per incoming batch
NO_DICTIONARY = ("__row_index", "__row_id")  # every value distinct: a dictionary only costs (module docstring)


def _file_schema(table: Table, names: Sequence[str], source: pa.Schema) -> pa.Schema:
    ids = {f.name: f.field_id for f in table.schema().fields}
    fields = []
    for name in names:
        f = source.field(name)
        fields.append(
            pa.field(
                name, f.type, nullable=(name != "__row_index"), metadata={b"PARQUET:field_id": str(ids[name]).encode()}
            )
        )
    return pa.schema(fields)


class _FileRoller:
    """Writes batches into Parquet files of at most ``chunk_rows`` rows each. With ``lanes`` (ascending
    __row_index lower bounds of the ranges read after the first: source.reader_parts) a batch goes to the
    open file of its range's lane, so interleaved ordered readers still give files of disjoint ranges."""

    def __init__(
        self,
        table: Table,
        schema: pa.Schema,
        sync_id: uuid.UUID,
        chunk_rows: int,
        digester=None,
        lanes: Sequence[int] | None = None,
        row_group_rows: int | None = None,
    ):
        self.table = table
        self.schema = schema
        self.sync_id = sync_id
        self.chunk_rows = chunk_rows
        self.lanes = list(lanes or [])
        self.row_group_rows = ROW_GROUP_ROWS if row_group_rows is None else row_group_rows
        # no dictionary for the identity columns whose values are all distinct (the module docstring says why)
        self.dictionary = [n for n in schema.names if n not in NO_DICTIONARY] if self.row_group_rows else True
        self.paths: list[str] = []
        self.rows = 0
        self._open_files: dict[int, list] = {}  # lane -> [ParquetWriter, stream, rows in file, path, pending batches]
        self._closed = 0
        self.digester = digester  # the caller's (parity/maintained.py): each file's digest, from the rows in hand
        self.digests: dict = {}

    def _open(self, lane: int) -> list:
        path = f"{self.table.location()}/data/lakehouse-{self.sync_id}-{len(self.paths):05d}.parquet"
        stream = self.table.io.new_output(path).create(overwrite=True)
        writer = pq.ParquetWriter(
            stream, self.schema, compression="zstd", write_statistics=True, use_dictionary=self.dictionary
        )
        self.paths.append(path)
        self._open_files[lane] = entry = [writer, stream, 0, path, []]
        return entry

    def _flush(self, entry: list) -> None:
        """The lane's pending rows as one row group."""
        if entry[4]:
            entry[0].write_table(
                pa.Table.from_batches(entry[4]), row_group_size=max(1, sum(b.num_rows for b in entry[4]))
            )
            entry[4] = []

    def _close_file(self, lane: int, *, flush: bool = True) -> None:
        entry = self._open_files.pop(lane, None)
        if entry is not None:
            try:
                if flush:
                    self._flush(entry)
                entry[0].close()
            finally:  # the stream too when the writer's close failed (a full disk): not left to its destructor
                entry[1].close()
            self._closed += 1
            if self._closed == 1:
                failpoint("after-first-file")

    def write(self, batch: pa.RecordBatch) -> None:
        batch = batch.cast(self.schema)
        if not self.lanes or not batch.num_rows:
            self._write_lane(batch, 0)
            return
        # A reader's batches come in row_index order but one batch may span several ranges: cut it there.
        cuts = np.searchsorted(batch.column("__row_index").to_numpy(), self.lanes, side="left")
        start = 0
        for lane, cut in enumerate([*cuts.tolist(), batch.num_rows]):
            if cut > start:
                self._write_lane(batch.slice(start, cut - start), lane)
                start = cut

    def _write_lane(self, batch: pa.RecordBatch, lane: int) -> None:
        offset = 0
        group = self.row_group_rows
        while offset < batch.num_rows:
            entry = self._open_files.get(lane) or self._open(lane)
            take = min(batch.num_rows - offset, self.chunk_rows - entry[2])
            if group:  # up to the row group's end: a full group is written at once, a part waits for the rest
                take = min(take, group - entry[2] % group)
            piece = batch.slice(offset, take)
            if group:
                entry[4].append(piece)
                if (entry[2] + take) % group == 0:
                    self._flush(entry)
            else:
                entry[0].write_batch(piece)
            if self.digester is not None:
                self.digester.add(self.digests.setdefault(entry[3], self.digester.empty()), piece)
            entry[2] += take
            self.rows += take
            offset += take
            if entry[2] >= self.chunk_rows:
                self._close_file(lane)

    def close(self) -> None:
        for lane in sorted(self._open_files):
            self._close_file(lane)

    def delete_all(self) -> int:
        """Delete this write's files (known not committed); how many could not be (an object store failing, as
        the write did): their sync is recorded unsettled, and the next sync of the dataset removes them."""
        for lane in sorted(self._open_files):
            try:  # a file still open is flushed on close, which fails again on a full disk: delete it anyway
                self._close_file(lane, flush=False)
            except Exception as exc:  # noqa: BLE001 - the write's own error is the one to raise
                _log.debug("could not close abandoned file of sync %s: %s", self.sync_id, first_line(exc))
        left = 0
        for path in self.paths:
            try:
                self.table.io.delete(path)
            except Exception as exc:  # noqa: BLE001 - the write's own error is the one to raise; files_left says it
                left += 1
                _log.debug("could not delete abandoned file %s: %s", path, first_line(exc))
        return left


FILES_LEFT = "lakehouse_files_left"  # set on a failed write's exception: files of it that could not be deleted


def _mark_files_left(exc: BaseException, left: int) -> None:
    if left:
        try:
            setattr(exc, FILES_LEFT, left)
        except AttributeError:  # an exception type with __slots__: say it here instead
            _log.warning("%d data file(s) of a failed write could not be deleted; the orphan sweep removes them", left)


def files_left(exc: BaseException | None) -> int:
    """How many data files of the failed write behind ``exc`` (or what it was raised from) are still stored."""
    for _ in range(10):
        if exc is None:
            return 0
        left = getattr(exc, FILES_LEFT, 0)
        if left:
            return int(left)
        exc = exc.__cause__ or exc.__context__
    return 0
