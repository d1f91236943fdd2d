"""The chunked Iceberg writer: Parquet files streamed chunk by chunk, then ONE commit.

Rows arrive as Arrow record batches and go straight into a ParquetWriter (pyarrow's writer is faster
than pyiceberg's own and its files smaller, measured when it was chosen); a file is closed every
``chunk_rows`` rows. Nothing is committed until every file is written, so a failure or a killed
process leaves no snapshot, only files this module deletes (or the next sync of the dataset does).
The files carry Iceberg field ids, so they are native data files: no name mapping, and a later
schema change still reads them by id.

One commit = one snapshot: an overwrite (full) or a merging append (incremental), with the table
properties that make the watermark durable (source version, max row index, row count) set in the
same transaction, and the sync id + source version in the snapshot summary.

Commit outcome. Files are deleted only when the commit is known not to have happened: a failure
before the commit started, a lost compare-and-swap (CommitFailedException), a failed validation
(ValidationException), a guard lock lost before the commit (GuardLost), or the warehouse's disk full (ENOSPC:
every file a commit writes comes before the catalog's swap; DiskFull, exit 75). Any other failure around
the commit (a connection lost after the swap, a REST CommitStateUnknown, an interruption inside the
call) may have landed: the table is reloaded and searched for the sync id; found, the commit
happened; not found, the files are left where they are and CommitOutcomeUnknown is raised, so the
next sync of the dataset decides with the table in hand (mirror/reaper.py). Deleting them instead
could leave the table pointing at missing files for good. A delete that fails (the object store failing as the
write did) leaves the file: the write's exception carries how many (``files_left``), its sync is recorded unsettled,
and the next sync of the dataset removes them.

Another engine's commits. A mirror commit (Postgres is the truth) checks each attempt's table state for data changes
another Iceberg engine committed since the project's last snapshot (lake/foreign.py) and refuses them
(ForeignCommit: known not committed, the files are deleted) unless the plan reverts them (``revert_foreign``).

G4 is ours alone: pyiceberg's own commit retry is switched off per table (commit.retry.num-retries=0),
because it rebuilds a commit on a newer table state without asking whether this sync still holds its
dataset lock; our loop re-checks the guard locks (ingest/guards.check_held) before every attempt.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import random
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException, ValidationException
from pyiceberg.io.pyarrow import parquet_file_to_data_file
from pyiceberg.table import Table, Transaction
from pyiceberg.table.update import update_table_metadata
from pyiceberg.table.update.snapshot import ExpireSnapshots

from lakehouse_dagster.core import private_apis
from lakehouse_dagster.core.errors import (
    CommitOutcomeUnknown,
    DiskFull,
    ForeignCommit,
    GuardLost,
    SyncFailed,
    first_line,
    no_space,
)
from lakehouse_dagster.core.failpoints import failpoint, is_armed
from lakehouse_dagster.core.guards import check_held
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.lake.catalog import ensure_namespace, load_table_or_none, table_identifier
from lakehouse_dagster.lake.foreign import FENCE as FENCE  # re-exported: the reaper's fence key lives with the marks
from lakehouse_dagster.lake.foreign import REVERTED, ROW_COUNT, SYNC_ID, foreign_since_project, table_row_count
from lakehouse_dagster.lake.schema import COLUMNS_PROPERTY, arrow_schema, columns_property, iceberg_schema, iceberg_type
from lakehouse_dagster.tracking.datasets import Dataset

_log = logging.getLogger(__name__)

SOURCE_VERSION = "lakehouse.source-version"
MAX_ROW_INDEX = "lakehouse.max-row-index"
WRITE_PATH = "lakehouse.path"
WRITE_MODE = "lakehouse.mode"  # replace | append | partial (the snapshot summary; a sync reports it)

COMMIT_RETRIES = "commit.retry.num-retries"
COMMIT_ATTEMPTS = 6  # our G4: attempts of one commit after lost compare-and-swaps (backoff with jitter)
# The name of every data file this writer writes (_FileRoller._open): the sync it belongs to, then its number.
SYNC_FILE = re.compile(r"^lakehouse-([0-9a-f-]{36})-\d+\.parquet$")

# An incremental sync appends a manifest; without merging, a long-lived mirror's current snapshot lists one
# per append and every scan plan reads them all (400 appends: planning 7.4× slower, bench_snapshot_growth.py).
# Set on every commit, so tables created before it merge too: at 16 manifests they are merged into files of up
# to 8 MB (pyiceberg's default); 100, the default count, still left planning ~80 ms for a 1,000-row table.
MERGE_MANIFESTS = {"commit.manifest-merge.enabled": "true", "commit.manifest.min-count-to-merge": "16"}

# Old metadata files: every commit writes a new one holding the whole history, so without this a long-lived
# table's metadata directory grows with the square of its commits; Iceberg's own defaults once enabled.
METADATA_FILES = {"write.metadata.delete-after-commit.enabled": "true", "write.metadata.previous-versions-max": "100"}


def expirable_snapshots(metadata, keep: int, max_age_seconds: float, now_ms: int) -> list[int]:
    """The snapshots a mirror commit removes from the table metadata (every snapshot adds ~0.8 KB that each
    later commit writes and each load parses): those past the newest ``keep`` (``metadata`` is the commit's
    staged state, its own new snapshot among them) AND older than ``max_age_seconds``, never a branch or tag
    head; ``keep`` 0: none. Only the metadata goes: data and manifest files stay, so a reader that chose a
    snapshot before it was expired and holds its table still reads it. A native commit expires only when
    it carries its run's totals (mirror/native_run.py): the rollback's walk over native snapshots ends
    at the newest commit that carries them, so it needs none of the snapshots they sum."""
    if keep <= 0:
        return []
    protected = {ref.snapshot_id for ref in metadata.refs.values()}
    by_age = sorted(metadata.snapshots, key=lambda s: (s.timestamp_ms, s.sequence_number or 0))
    cutoff = now_ms - max_age_seconds * 1000
    return [
        s.snapshot_id
        for s in by_age[: max(0, len(by_age) - keep)]
        if s.timestamp_ms < cutoff and s.snapshot_id not in protected
    ]


TABLE_DEFAULTS = {
    "format-version": "2",
    "write.parquet.compression-codec": "zstd",
    COMMIT_RETRIES: "0",  # see the module docstring: retries are ours, guard-checked
}


@dataclasses.dataclass(frozen=True)
class WriteResult:
    snapshot_id: int | None
    rows: int  # rows written by this call
    bytes: int
    files: int
    total_rows: int  # rows in the table after the commit
    committed: bool  # False when the sync's snapshot was already there (a retry) or nothing was written
    source_version: int | None = None  # the version the snapshot covers (a retry: what attempt 1 wrote)
    rewritten: int = 0  # of ``rows``, those of the files a partial rewrite (or a compaction) replaced
    # What the caller's ``digester`` folded per written file (data file path -> its digest); the caller stores it
    # (parity/write_digests.py: write_digested).
    file_digests: dict = dataclasses.field(default_factory=dict)
    location: str | None = None  # the table's location (Table.location()): where its files live


class _Absent:
    def __repr__(self) -> str:
        return "ABSENT"


ABSENT = _Absent()  # ensure_table/write_arrow ``table=ABSENT``: the caller just loaded it and found no table


def ensure_table(catalog: Catalog, settings: Settings, dataset: Dataset, table: Table | _Absent | None = None) -> Table:
    """Create the dataset's table, or evolve it to the dataset's current schema (new columns added,
    removed ones kept, nullable). A type change that Iceberg cannot promote is refused loudly. ``table``: the
    caller's load of it (the sync loaded it to choose its mode, under the dataset lock; ABSENT: there was
    none), not loaded again; None: loaded here."""
    ident = table_identifier(settings, dataset.id)
    if table is None:
        table = load_table_or_none(catalog, ident)
    elif isinstance(table, _Absent):
        table = None
    if table is None:
        ensure_namespace(catalog, settings.namespace)
        props = dict(TABLE_DEFAULTS)
        props[COLUMNS_PROPERTY] = columns_property(dataset.columns)
        try:
            return catalog.create_table(ident, schema=iceberg_schema(dataset.columns), properties=props)
        except Exception as exc:  # lost a creation race with another process
            table = load_table_or_none(catalog, ident)
            if table is None and no_space(exc) is not None:
                raise disk_full(dataset.id, f"{settings.warehouse.rstrip('/')}/{settings.namespace}", exc) from exc
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
    if (
        missing
        or table.properties.get(COLUMNS_PROPERTY) != columns_property(dataset.columns)
        or table.properties.get(COMMIT_RETRIES) != TABLE_DEFAULTS[COMMIT_RETRIES]
    ):
        with table.transaction() as tx:
            if missing:
                with tx.update_schema() as update:
                    update.union_by_name(iceberg_schema(dataset.columns))
            tx.set_properties(
                {COLUMNS_PROPERTY: columns_property(dataset.columns), COMMIT_RETRIES: TABLE_DEFAULTS[COMMIT_RETRIES]}
            )
        table = table.refresh()
    return table


def sync_snapshot(table: Table, sync_id: uuid.UUID):
    """The snapshot a sync already committed, or None (a retry after a lost response must not append twice)."""
    wanted = str(sync_id)
    for snap in reversed(table.snapshots()):
        if snap.summary is not None and snap.summary.additional_properties.get(SYNC_ID) == wanted:
            return snap
    return None


def find_sync_snapshot(table: Table, sync_id: uuid.UUID) -> int | None:
    snap = sync_snapshot(table, sync_id)
    return snap.snapshot_id if snap is not None else None


def snapshot_source_version(snap) -> int | None:
    """The source version a snapshot covers (its summary), None when it does not say."""
    raw = snap.summary.additional_properties.get(SOURCE_VERSION) if snap is not None and snap.summary else None
    try:
        return int(raw) if raw is not None and int(raw) >= 0 else None
    except ValueError:
        return None


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
    ):
        self.table = table
        self.schema = schema
        self.sync_id = sync_id
        self.chunk_rows = chunk_rows
        self.lanes = list(lanes or [])
        self.paths: list[str] = []
        self.rows = 0
        self._open_files: dict[int, list] = {}  # lane -> [ParquetWriter, stream, rows in file, path]
        self._closed = 0
        self.digester = digester  # the caller's (parity/maintained.py): each file's digest, from the rows in hand
        self.digests: dict = {}

    def _open(self, lane: int) -> list:
        path = f"{self.table.location()}/data/lakehouse-{self.sync_id}-{len(self.paths):05d}.parquet"
        stream = self.table.io.new_output(path).create(overwrite=True)
        writer = pq.ParquetWriter(stream, self.schema, compression="zstd", write_statistics=True)
        self.paths.append(path)
        self._open_files[lane] = entry = [writer, stream, 0, path]
        return entry

    def _close_file(self, lane: int) -> None:
        entry = self._open_files.pop(lane, None)
        if entry is not None:
            entry[0].close()
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
        while offset < batch.num_rows:
            entry = self._open_files.get(lane) or self._open(lane)
            take = min(batch.num_rows - offset, self.chunk_rows - entry[2])
            piece = batch.slice(offset, take)
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
                self._close_file(lane)
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


@dataclasses.dataclass(frozen=True)
class CommitEntries:
    """Table properties and snapshot-summary entries a commit records besides the writer's own. A source writer
    knows them only once its rows are read (its cursor, its highest __row_index): its batch generator returns
    them (``write_arrow``)."""

    props: Mapping[str, str] = dataclasses.field(default_factory=dict)
    summary: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class TableWrite:
    """What one ``write_arrow`` call commits, decided by the caller before the first row is written.

    ``mode``: "replace" makes the table hold exactly the rows written; "append" adds them; "partial" removes
    ``delete_files`` (DataFiles of the current snapshot) and adds the rows in the same snapshot (the mirror's
    rewrite, tracking/row_changes.py; a native compaction, routing/native_table.py). ``sync_id`` names the
    commit (a retry finds it); ``source_version`` is the version the snapshot covers; ``path`` "mirror" or
    "native" (every commit records it, mirror/native_run.py). ``max_row_index``: the table's highest
    __row_index after the commit (None: the table's until now, -1 for a replace). ``chunk_rows``: rows per data
    file (None: settings.ingest_chunk_rows). ``lanes``: _FileRoller. ``revert_foreign`` (a mirror replace only):
    commit even when another engine changed the table's rows since the project's last commit (lake/foreign.py),
    reverting that change; the commit names the snapshots it reverted in its summary. Without it a mirror commit
    refuses them (ForeignCommit)."""

    mode: str
    sync_id: uuid.UUID
    source_version: int | None
    path: str = "mirror"
    max_row_index: int | None = None
    chunk_rows: int | None = None
    delete_files: Sequence = ()
    lanes: Sequence[int] | None = None
    revert_foreign: bool = False

    def __post_init__(self):
        if self.mode not in ("replace", "append", "partial"):
            raise ValueError(f"mode must be 'replace', 'append' or 'partial', not {self.mode!r}")
        if self.revert_foreign and (self.mode != "replace" or self.path != "mirror"):
            raise ValueError("only a mirror replace reverts another engine's commits (revert_foreign)")

    @property
    def replaces(self) -> bool:
        return self.mode == "replace"

    @property
    def rewritten(self) -> int:
        """Rows of the files a partial commit removes (their rows are among the rows it writes)."""
        return sum(f.record_count for f in self.delete_files) if self.mode == "partial" else 0


@dataclasses.dataclass(frozen=True)
class _Staged:
    """Every file of a write, closed and described, and what its commit records; nothing committed yet."""

    data_files: list
    nbytes: int
    total_rows: int  # rows in the table after the commit
    props: dict
    summary: dict


def write_arrow(
    catalog: Catalog,
    settings: Settings,
    dataset: Dataset,
    batches: Iterable[pa.RecordBatch],
    plan: TableWrite,
    *,
    table: Table | _Absent | None = None,
    digester: Any = None,
    native_run: Callable[[Table, int, bool], dict] | None = None,
) -> WriteResult:
    """Write ``batches`` (laid out as ``arrow_schema(dataset.columns)``) into the dataset's table and commit
    once, as ``plan`` says. A sync id whose snapshot is already in the table (a retry) writes nothing and
    reports that snapshot. ``batches`` may be a generator that returns a ``CommitEntries``: what the same
    commit also records, known once every row is read (a source writer's ingest state, sources/writers.py).
    ``table``: the caller's load of the table, or ABSENT (ensure_table; None: loaded here); a commit that lost
    a compare-and-swap still reloads it (_commit). ``digester`` (the caller's; parity/maintained.py): folds each
    written file's rows into a digest, returned in ``WriteResult.file_digests`` for the caller to store.

    ``native_run(table, rows, replaces)`` (a native write: mirror/native_run.native_run) is the one callback:
    the totals of the run of native snapshots the commit extends depend on the exact table state each attempt
    of the commit's compare-and-swap retry commits on, so they are summed inside that loop (_commit); with it,
    a native commit expires snapshots too. A native partial commit (a compaction) must carry them: the
    rollback's walk would read the rewrite as a replace."""
    if plan.mode == "partial" and plan.path == "native" and native_run is None:
        raise ValueError("a native partial commit needs native_run: a compaction must carry its native run's totals")
    table = ensure_table(catalog, settings, dataset, table)
    already = sync_snapshot(table, plan.sync_id)
    if already is not None:
        return WriteResult(
            already.snapshot_id,
            0,
            0,
            0,
            _row_count(table),
            committed=False,
            source_version=snapshot_source_version(already),
            location=table.location(),
        )
    expected = arrow_schema(dataset.columns)
    file_schema = _file_schema(table, expected.names, expected)
    chunk_rows = plan.chunk_rows or settings.ingest_chunk_rows
    roller = _FileRoller(table, file_schema, plan.sync_id, chunk_rows, digester, plan.lanes)
    try:  # nothing can have been committed in here: every failure deletes this write's files
        staged = _stage(table, dataset, batches, plan, roller, expected.names)
    except BaseException as exc:
        _mark_files_left(exc, roller.delete_all())
        if isinstance(exc, Exception) and no_space(exc) is not None:
            raise disk_full(dataset.id, table.location(), exc) from exc
        raise
    snapshot_id = _commit_or_settle(catalog, settings, dataset, table, plan, staged, roller, native_run)
    return WriteResult(
        snapshot_id,
        roller.rows,
        staged.nbytes,
        len(staged.data_files),
        staged.total_rows,
        committed=True,
        source_version=plan.source_version,
        rewritten=plan.rewritten,
        file_digests=roller.digests,
        location=table.location(),
    )


def _write_batches(batches: Iterable[pa.RecordBatch], roller: _FileRoller, names: list, dataset_id) -> Any:
    """Every batch into the roller; returns what a generator of batches returned (None for any other iterable)."""
    it = iter(batches)
    while True:
        try:
            batch = next(it)
        except StopIteration as done:
            return done.value
        if batch.schema.names != names:
            raise SyncFailed(
                f"dataset {dataset_id}: batch columns {batch.schema.names} do not match the schema {names}"
            )
        roller.write(batch)


def _stage(
    table: Table, dataset: Dataset, batches: Iterable[pa.RecordBatch], plan: TableWrite, roller: _FileRoller, names
) -> _Staged:
    """The rows into closed data files, and the properties and summary their commit records (with the
    ``CommitEntries`` the batches returned); fires 'before-commit'. Commits nothing: the caller deletes the
    files on any failure."""
    late = _write_batches(batches, roller, names, dataset.id)
    roller.close()
    data_files = [parquet_file_to_data_file(table.io, table.metadata, p) for p in roller.paths]
    previous_rows = 0 if plan.replaces else _row_count(table) - sum(f.record_count for f in plan.delete_files)
    total = previous_rows + roller.rows
    version = str(plan.source_version if plan.source_version is not None else -1)
    max_row_index = plan.max_row_index if plan.max_row_index is not None else _max_row_index(table, plan.mode)
    props = {SOURCE_VERSION: version, MAX_ROW_INDEX: str(max_row_index), ROW_COUNT: str(total), WRITE_PATH: plan.path}
    summary = {SYNC_ID: str(plan.sync_id), SOURCE_VERSION: version, WRITE_PATH: plan.path, WRITE_MODE: plan.mode}
    if isinstance(late, CommitEntries):
        props.update(late.props)
        summary.update(late.summary)
    failpoint("before-commit")
    return _Staged(data_files, sum(df.file_size_in_bytes for df in data_files), total, props, summary)


def _commit_or_settle(
    catalog: Catalog,
    settings: Settings,
    dataset: Dataset,
    table: Table,
    plan: TableWrite,
    staged: _Staged,
    roller: _FileRoller,
    native_run: Callable[[Table, int, bool], dict] | None,
) -> int:
    """The commit (_commit), and what its failure means (the module docstring's commit outcome): known not
    committed, the files are deleted; otherwise the table is searched for the sync id — found, it landed;
    not found, the files are kept and CommitOutcomeUnknown is raised (an interruption propagates as is)."""
    run = None if native_run is None else (lambda t: native_run(t, roller.rows - plan.rewritten, plan.replaces))
    expire = (settings.snapshots_keep, settings.snapshots_max_age_seconds)
    try:
        return _commit(
            table,
            staged.data_files,
            replace=plan.replaces,
            summary=staged.summary,
            props=staged.props,
            sync_id=plan.sync_id,
            delete_files=plan.delete_files if plan.mode == "partial" else None,
            expire=expire if plan.path == "mirror" or run is not None else None,
            run_entries=run,
            foreign=_foreign_check(dataset.id, plan) if plan.path == "mirror" else None,
        )
    except (CommitFailedException, ValidationException, GuardLost, ForeignCommit) as exc:
        _mark_files_left(exc, roller.delete_all())  # known not committed
        raise
    except BaseException as exc:
        landed, unread = _look_for(catalog, table, plan.sync_id)
        if landed is None and isinstance(exc, Exception) and no_space(exc) is not None:
            # ENOSPC comes from the files a commit writes (manifests, manifest list, the new metadata file), all
            # written before the catalog's swap (the SqlCatalog's is a Postgres update that writes no file here):
            # known not committed, so this write's files go now and free the space they took.
            _mark_files_left(exc, roller.delete_all())
            raise disk_full(dataset.id, table.location(), exc) from exc
        if landed is None:
            # The error raised below says it all in one line; an interruption propagates as is, so it is logged.
            if not isinstance(exc, Exception):
                _log.warning(
                    "commit of sync %s: outcome unknown (%s); its %d files are left for the next sync%s",
                    plan.sync_id,
                    type(exc).__name__,
                    len(roller.paths),
                    unread,
                )
                raise  # the caller looks at the table itself
            raise CommitOutcomeUnknown(
                f"dataset {dataset.id}: commit outcome unknown for sync {plan.sync_id} ({type(exc).__name__}: "
                f"{first_line(exc)}){unread}; its files are kept, the next sync of the dataset settles it"
            ) from exc
        if not isinstance(exc, Exception):
            raise  # an interruption: the caller looks at the table itself
        _log.warning(
            "commit of sync %s raised %s but its snapshot %s is in the table: it landed",
            plan.sync_id,
            type(exc).__name__,
            landed,
        )
        return landed


def _foreign_check(dataset_id, plan: TableWrite) -> Callable[[Table], dict]:
    """A mirror commit's check of each attempt's table state (Postgres is the truth): a data change another engine
    committed since the project's last snapshot (lake/foreign.py) is refused, or, when the plan reverts it, named in
    the commit's summary and logged as a warning. Pure maintenance (a rewrite keeping the rows, expiry) passes."""

    def check(table: Table) -> dict:
        chain = foreign_since_project(table)
        if chain.problem is None:
            return {}
        if not plan.revert_foreign:
            raise ForeignCommit(chain.refusal(dataset_id))
        reverted = ",".join(str(f.snapshot_id) for f in chain.changes) or "rollback"
        _log.warning("dataset %s: sync %s reverts what another engine did: %s", dataset_id, plan.sync_id, chain.problem)
        return {REVERTED: reverted}

    return check


def disk_full(dataset_id, location: str, exc: BaseException) -> DiskFull:
    """The one line an operator reads when the warehouse's filesystem is full: what, where (the table's location
    and, on a local warehouse, the space left there once this write's files are gone), that nothing was committed,
    and what to do. Called after the write's files were deleted."""
    path = unquote(urlparse(location).path) if location.startswith("file:") else None
    room = ""
    if path is not None:
        probe = path
        while probe and not os.path.exists(probe):
            probe = os.path.dirname(probe)
        with contextlib.suppress(OSError):
            st = os.statvfs(probe or "/")
            room = f" (leaving {st.f_bavail * st.f_frsize:,} of {st.f_blocks * st.f_frsize:,} bytes free there)"
    return DiskFull(
        f"dataset {dataset_id}: the warehouse's disk is full (ENOSPC, no space left on device) writing its Iceberg "
        f"table at {path or location}; nothing was committed and this write's files were removed{room}: free space "
        "on that volume or grow it (lakehouse orphans --delete removes files no snapshot references), then run it again"
    )


def _look_for(catalog: Catalog, table: Table, sync_id: uuid.UUID) -> tuple[int | None, str]:
    """Reload the table and look for the sync's snapshot: (its id or None, "" or why the table could not be
    read, as a clause of one line)."""
    try:
        return find_sync_snapshot(catalog.load_table(table.name()), sync_id), ""
    except Exception as exc:  # noqa: BLE001 - unknown stays unknown
        return None, f" and the table could not be reloaded ({type(exc).__name__}: {first_line(exc)})"


def _row_count(table: Table) -> int:
    return table_row_count(table)  # another engine's commit does not move our property (lake/foreign.py)


def _max_row_index(table: Table, mode: str) -> int:
    return -1 if mode == "replace" else int(table.properties.get(MAX_ROW_INDEX, -1))


class _Transaction(Transaction):
    """pyiceberg's Transaction, with ``table_metadata`` computed once per staged state instead of on every
    access: pyiceberg rebuilds it (the updates applied to the base, then a deep copy of the whole metadata,
    every snapshot included) each time, and one fast append reads it about 14 times (~40% of a small commit).
    The value depends only on the base metadata and the staged updates, and pyiceberg treats it as read-only
    (frozen models, containers copied on update), so the same object is handed out until either changes."""

    _memo: tuple | None = None

    @property
    def table_metadata(self):
        base, updates = private_apis.pyiceberg_staged_state(self)  # pyiceberg keeps both private
        memo = self._memo
        if memo is None or memo[0] is not base or memo[1] is not updates:
            memo = self._memo = (base, updates, update_table_metadata(base, updates))
        return memo[2]


def _commit(  # noqa: C901 - one commit's retry loop: each conflict kind and its recovery beside the catalog call
    table: Table,
    data_files,
    *,
    replace: bool,
    summary: dict,
    props: dict,
    sync_id: uuid.UUID,
    delete_files: Sequence | None = None,
    expire: tuple[int, float] | None = None,
    run_entries: Callable[[Table], dict] | None = None,
    foreign: Callable[[Table], dict] | None = None,
) -> int:
    """One transaction: properties + one snapshot. Long on purpose: each attempt's re-checks (guards, another
    engine's commits) sit beside the commit they guard. G4: a lost compare-and-swap is retried from a fresh
    table state (a replace re-plans which files it removes) with backoff, after re-checking that this
    sync still holds its guard locks; past the attempts CommitFailedException propagates (transient).
    ``delete_files`` (a partial rewrite): an overwrite removing exactly those files, which must all still
    be live (else ValidationException: the plan is stale, nothing is committed). ``expire``: (keep, max age
    in seconds) of ``expirable_snapshots``, removed in the same commit. ``run_entries(table)``: a native
    commit's run totals (rollback/iceberg_only.native_run), summed on each attempt's own table state.
    ``foreign(table)`` (a mirror commit: _foreign_check): refuses another engine's data change on each attempt's own
    table state (one that landed while this commit was being prepared wins the compare-and-swap, and the retry sees
    it), or returns the summary entries that name what the commit reverts."""
    for attempt in range(COMMIT_ATTEMPTS):
        check_held()
        extra = foreign(table) if foreign is not None else {}
        tx = _Transaction(table)
        tx.set_properties({**MERGE_MANIFESTS, **METADATA_FILES, **props})
        snapshot_update = tx.update_snapshot(
            snapshot_properties={**summary, **extra, **(run_entries(table) if run_entries is not None else {})}
        )
        if delete_files is not None:
            live = {task.file.file_path for task in table.scan().plan_files()} if delete_files else set()
            gone = [f.file_path for f in delete_files if f.file_path not in live]
            if gone:
                stale = ValidationException(
                    f"{len(gone)} file(s) to rewrite are no longer in the table (first: "
                    f"{gone[0]}); the partial rewrite was planned on a stale snapshot"
                )
                stale.transient = True  # type: ignore[attr-defined]  # the next sync plans on the table as it is
                raise stale
            with snapshot_update.overwrite() as producer:
                for f in delete_files:
                    producer.delete_data_file(f)
                for df in data_files:
                    producer.append_data_file(df)
        elif replace:
            with snapshot_update.overwrite() as producer:
                for task in table.scan().plan_files():
                    producer.delete_data_file(task.file)
                for df in data_files:
                    producer.append_data_file(df)
        else:
            with snapshot_update.merge_append() as producer:
                for df in data_files:
                    producer.append_data_file(df)
        expired = expirable_snapshots(tx.table_metadata, *expire, now_ms=int(time.time() * 1000)) if expire else []
        if expired:
            ExpireSnapshots(tx).by_ids(expired).commit()  # staged in this transaction: one commit
        try:
            with _commit_failpoints(table):
                tx.commit_transaction()
            break
        except (CommitFailedException, ValueError) as exc:
            fresh = table.refresh()
            if isinstance(exc, ValueError) and not _expired_meanwhile(fresh, expired, sync_id):
                raise
            table = fresh  # a lost compare-and-swap, or snapshots expired meanwhile: nothing committed either way
            found = find_sync_snapshot(table, sync_id)
            if found is not None:
                return found
            if attempt == COMMIT_ATTEMPTS - 1:
                if isinstance(exc, ValueError):
                    raise CommitFailedException(f"commit of sync {sync_id}: {first_line(exc)[:200]}") from exc
                raise
            time.sleep(min(5.0, 0.1 * (2**attempt)) * random.uniform(0.5, 1.5))
    # The commit left ``table`` at the metadata it swapped in (pyiceberg's _do_commit): no reload needed to see it.
    found = find_sync_snapshot(table, sync_id)
    if found is None:
        raise SyncFailed(f"commit of sync {sync_id} reported success but its snapshot is not in the table")
    return found


def _expired_meanwhile(fresh: Table, expired: Sequence[int], sync_id: uuid.UUID) -> bool:
    """Whether a commit refused with a ValueError was refused because another writer expired snapshots this commit
    also expires: the SqlCatalog applies a commit's updates to the table as it is at commit time, and pyiceberg's
    snapshot removal refuses an id the table no longer has (``Snapshot with snapshot id … does not exist``), before
    any file is written or swapped in. Then nothing was committed, and the commit is retried as after a lost
    compare-and-swap (G4); any other ValueError propagates."""
    if not expired or find_sync_snapshot(fresh, sync_id) is not None:
        return False
    return not set(expired) <= {s.snapshot_id for s in fresh.snapshots()}


@contextlib.contextmanager
def _commit_failpoints(table: Table):
    """Fire 'commit-start' / 'in-commit' inside the catalog's commit call, around its compare-and-swap
    (only when one of them is armed: otherwise the catalog is left untouched)."""
    if not (is_armed("commit-start") or is_armed("in-commit")):
        yield
        return
    real = table.catalog

    class _Hooked:
        def __getattr__(self, name):
            return getattr(real, name)

        def commit_table(self, *args, **kwargs):
            failpoint("commit-start")
            response = real.commit_table(*args, **kwargs)
            failpoint("in-commit")
            return response

    table.catalog = _Hooked()  # type: ignore[assignment]  # duck-types the catalog: every other name passes through
    try:
        yield
    finally:
        table.catalog = real


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
