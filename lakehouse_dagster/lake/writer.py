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
import json
import logging
import os
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException, ValidationException
from pyiceberg.io.pyarrow import parquet_file_to_data_file
from pyiceberg.table import Table

from lakehouse_dagster.core.errors import (
    CommitOutcomeUnknown,
    DiskFull,
    ForeignCommit,
    GuardLost,
    SyncFailed,
    first_line,
    no_space,
)
from lakehouse_dagster.core.failpoints import failpoint
from lakehouse_dagster.core.settings import Settings, SyncSettings
from lakehouse_dagster.lake.catalog import ensure_namespace, load_table_or_none, table_identifier
from lakehouse_dagster.lake.foreign import FENCE as FENCE  # re-exported: the reaper's fence key lives with the marks
from lakehouse_dagster.lake.foreign import REVERTED, ROW_COUNT, SYNC_ID, foreign_since_project
from lakehouse_dagster.lake.schema import COLUMNS_PROPERTY, arrow_schema, columns_property, iceberg_schema, iceberg_type
from lakehouse_dagster.lake.write_commit import (
    _commit,
    _look_for,
    _max_row_index,
    _row_count,
    expirable_snapshots,
    find_sync_snapshot,
    snapshot_source_version,
    sync_snapshot,
)
from lakehouse_dagster.lake.write_files import FILES_LEFT, _file_schema, _FileRoller, _mark_files_left, files_left
from lakehouse_dagster.lake.write_plan import (
    COMMIT_ATTEMPTS,
    COMMIT_RETRIES,
    MAX_ROW_INDEX,
    MERGE_MANIFESTS,
    METADATA_FILES,
    SOURCE_VERSION,
    SYNC_FILE,
    TABLE_DEFAULTS,
    WRITE_MODE,
    WRITE_PATH,
    CommitEntries,
    TableWrite,
    WriteResult,
    _Staged,
)
from lakehouse_dagster.tracking.datasets import Dataset

# The writer's face: every name callers import from lake.writer, wherever it lives now.
__all__ = [
    "ABSENT",
    "COMMIT_ATTEMPTS",
    "COMMIT_RETRIES",
    "FENCE",
    "FILES_LEFT",
    "MAX_ROW_INDEX",
    "MERGE_MANIFESTS",
    "METADATA_FILES",
    "SOURCE_VERSION",
    "SYNC_FILE",
    "TABLE_DEFAULTS",
    "WRITE_MODE",
    "WRITE_PATH",
    "CommitEntries",
    "TableWrite",
    "WriteResult",
    "disk_full",
    "ensure_table",
    "expirable_snapshots",
    "files_left",
    "find_sync_snapshot",
    "snapshot_source_version",
    "sync_snapshot",
    "table_state",
    "write_arrow",
]


_log = logging.getLogger(__name__)


_log = logging.getLogger(__name__)


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
        ensure_namespace(catalog, settings.catalog.namespace)
        props = dict(TABLE_DEFAULTS)
        props[COLUMNS_PROPERTY] = columns_property(dataset.columns)
        try:
            return catalog.create_table(ident, schema=iceberg_schema(dataset.columns), properties=props)
        except Exception as exc:  # lost a creation race with another process
            table = load_table_or_none(catalog, ident)
            if table is None and no_space(exc) is not None:
                raise disk_full(
                    dataset.id, f"{settings.catalog.warehouse.rstrip('/')}/{settings.catalog.namespace}", exc
                ) from exc
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
    chunk_rows = plan.chunk_rows or settings.sync.chunk_rows
    roller = _FileRoller(table, file_schema, plan.sync_id, chunk_rows, digester, plan.lanes)
    try:  # nothing can have been committed in here: every failure deletes this write's files
        staged = _stage(table, dataset, batches, plan, roller, expected.names)
    except BaseException as exc:
        _mark_files_left(exc, roller.delete_all())
        if isinstance(exc, Exception) and no_space(exc) is not None:
            raise disk_full(dataset.id, table.location(), exc) from exc
        raise
    snapshot_id = _commit_or_settle(catalog, settings.sync, dataset, table, plan, staged, roller, native_run)
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
    sync: SyncSettings,
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
    expire = (sync.snapshots_keep, sync.snapshots_max_age_seconds)
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
