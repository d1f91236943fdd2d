"""The source writers: sync.full, sync.append, sync.incremental, cdc.append — each a routed write.

``run_writer`` builds one ``WritePlan`` under the dataset lock — what to read past the dataset's stored state
(sources/), the row indexes, the sync id, the ingest state the commit also records — and runs it on the
path the writer's flag says (resolved once), converting the values to the dataset's declared types
(sources/convert.py, the mirror's strictness) as it reads:

* pg (``write_to_postgres``): COPYs the rows into ``dataset_rows`` with the new ingest state in one
  transaction (sources/pg_rows.py); the mirror carries them to Iceberg as before;
* iceberg_native (``write_to_iceberg``): writes them straight into the dataset's Iceberg table
  (routing/native_table.py over lake/writer.write_arrow: Parquet per chunk, one commit) with the ingest state
  and sync id in that same commit; ``dataset_rows`` is untouched, and the write router's native half
  (route_native) keeps ``iceberg_sync_log`` / ``datasets`` and fails loud.

Both return an ``IngestResult``. Identity is assigned the same way on both paths: ``row_index`` continues
from the highest index either store holds (0 for sync.full), so rows written on one path never collide with
rows of the other after a flip or a rollback. G3 (dataset lock) is held for the whole run, G2 (admission
slot) around the write.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import hashlib
import logging
import os
import time
import uuid
from collections.abc import Generator, Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.core.errors import BadInput, LakehouseError, NotFound, SyncFailed
from lakehouse_dagster.core.failpoints import failpoint
from lakehouse_dagster.core.failpoints import validate as validate_failpoints
from lakehouse_dagster.core.guards import admission_slot, dataset_lock
from lakehouse_dagster.core.ids import parse_uuid
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.flags.lifecycle_facts import lifecycle_of
from lakehouse_dagster.flags.registry import WRITE, get_flag
from lakehouse_dagster.flags.resolver import FlagResolver
from lakehouse_dagster.lake.catalog import load_table_or_none, table_identifier
from lakehouse_dagster.lake.writer import MAX_ROW_INDEX, WRITE_PATH, CommitEntries, TableWrite, table_state
from lakehouse_dagster.mirror.sync import reap_abandoned
from lakehouse_dagster.routing.native_table import write_native_table
from lakehouse_dagster.routing.write_router import WriteDecision, resolve_write_path, route_native
from lakehouse_dagster.sources.errors import SourceError
from lakehouse_dagster.sources.files import list_files, read_files
from lakehouse_dagster.sources.pg_rows import rows_transaction
from lakehouse_dagster.sources.pgsource import fingerprint, max_mark, read_postgres, scrub
from lakehouse_dagster.sources.spec import WRITERS, SourceSpec
from lakehouse_dagster.sources.stored import get_source
from lakehouse_dagster.tracking import ingest_state as source_state
from lakehouse_dagster.tracking.datasets import Dataset, get_dataset, lookup, stamps
from lakehouse_dagster.tracking.datasets.rows import max_row_index

_log = logging.getLogger("lakehouse_dagster.writers")


@dataclasses.dataclass(frozen=True)
class IngestResult:
    dataset_id: uuid.UUID
    writer: str
    path: str  # "pg" | "native"
    rows: int  # written by this run
    total_rows: int | None
    snapshot_id: int | None  # native only
    sync_id: uuid.UUID | None
    cursor: Any  # JSON-able: the cursor / position reached, or {"files": n seen}
    flag_reason: str
    seconds: float
    new: bool = True  # False: the source had nothing new, nothing was written
    compacted_rows: int = 0  # native: rows of the run's small files rewritten in the same commit (compaction)

    def to_json(self) -> dict:
        return {
            "dataset_id": str(self.dataset_id),
            "writer": self.writer,
            "path": self.path,
            "rows": self.rows,
            "total_rows": self.total_rows,
            "snapshot_id": self.snapshot_id,
            "sync_id": str(self.sync_id) if self.sync_id else None,
            "cursor": self.cursor,
            "flag_reason": self.flag_reason,
            "seconds": round(self.seconds, 3),
            "new": self.new,
            "compacted_rows": self.compacted_rows,
        }


def check_writer(writer: str) -> None:
    """A source writer, or BadInput naming why not (a locked writer says its ceiling's reason)."""
    if writer in WRITERS:
        return
    flag = get_flag(WRITE, writer)  # an unknown name is refused here with the known names
    raise BadInput(
        f"writer {writer} is locked to pg (maxMode={flag.ceiling}: {flag.ceiling_reason or flag.description}); "
        f"it is not a source writer — use one of {', '.join(WRITERS)}"
    )


@dataclasses.dataclass(frozen=True)
class WritePlan:
    """One run of a source writer, decided once under the dataset lock (G3) before a row is read; the two
    paths (``write_to_postgres``, ``write_to_iceberg``) run it as it is.

    What to read: ``files`` (a files source: those to read) or the rows past ``after`` (a Postgres source: its
    cursor / CDC position; None: from the start). ``start_index``: the first __row_index written (0 for
    sync.full; else one above the highest either store holds). ``seq``, ``sync_id`` and ``files_seen`` go into
    the ingest state the commit also records (``state``); ``nothing_new``: the source has nothing past the
    stored state (nothing is written); ``old_cursor``: the cursor before this run."""

    dataset: Dataset
    spec: SourceSpec
    decision: WriteDecision
    sync_id: uuid.UUID
    seq: int
    start_index: int
    after: Any = None
    files: tuple = ()
    files_seen: dict | None = None
    nothing_new: bool = False
    old_cursor: Any = None
    fingerprint: str | None = None  # a Postgres source without a cursor: what the poller compares (pgsource.py)

    @property
    def writer(self) -> str:
        return self.decision.writer

    @property
    def path(self) -> str:
        return "native" if self.decision.native else "pg"

    @property
    def replace(self) -> bool:
        return self.writer == "sync.full"

    def state(self, mark: Any) -> dict:
        """The ingest state this run leaves (tracking/ingest_state.py), once its read reached ``mark``."""
        return {
            "seq": self.seq,
            "sync_id": str(self.sync_id),
            "path": self.path,
            "writer": self.writer,
            "source": self.spec.to_json(),
            "mark": mark,
            "files": self.files_seen,
            **({"fingerprint": self.fingerprint} if self.fingerprint else {}),
        }

    def result(self, rows: int, total: int | None, snapshot_id: int | None, cursor: Any, **kw) -> IngestResult:
        """What the run reports (``seconds`` is run_writer's; ``kw``: IngestResult's other fields)."""
        fields = {"sync_id": self.sync_id, **kw}
        return IngestResult(
            self.dataset.id,
            self.writer,
            self.path,
            rows,
            total,
            snapshot_id,
            cursor=cursor,
            flag_reason=self.decision.flag.describe(),
            seconds=0.0,
            **fields,
        )


def plan_write(
    conn, settings: Settings, dsn: str, dataset: Dataset, spec: SourceSpec, decision: WriteDecision, table, sync_id
) -> WritePlan:
    """The run's plan from the stored ingest state (the newer of its two copies) and the source: which files are
    new, or whether any row is past the cursor (one max(), so the read itself happens inside the routed write).
    ``table``: the dataset's Iceberg table as loaded under the dataset lock, or None. SourceError when the source
    cannot be listed or asked."""
    ds_id, writer = dataset.id, decision.writer
    old = source_state.current_state(conn, ds_id, table, spec.to_json())
    seq = source_state.next_seq(conn, ds_id, table)
    replace = writer == "sync.full"
    plan = WritePlan(dataset, spec, decision, sync_id, seq, 0, old_cursor=source_state.public_cursor(old))
    if spec.type == "files":
        files = list_files(spec, settings.s3)
        seen = dict(old.get("files") or {}) if old else {}
        todo = files if replace else [f for f in files if seen.get(f.uri) != f.fingerprint]
        files_seen = (
            {f.uri: f.fingerprint for f in files} if replace else {**seen, **{f.uri: f.fingerprint for f in todo}}
        )
        plan = dataclasses.replace(plan, files=tuple(todo), files_seen=files_seen, nothing_new=not todo and not replace)
    else:
        after = None if replace or not old else old.get("mark")
        nothing_new = not replace and max_mark(spec, spec.dsn(dsn), after) is None
        # taken BEFORE the read: a change racing the read shows as a new fingerprint next visit (a second sync.full),
        # never as one already seen
        fp = fingerprint(spec, spec.dsn(dsn))[0] if spec.type == "postgres" and not spec.order_column else None
        plan = dataclasses.replace(plan, after=after, nothing_new=nothing_new, fingerprint=fp)
    if plan.nothing_new or replace:
        return plan
    pg_max = max_row_index(conn, ds_id)
    iceberg_max = table_state(table)["max_row_index"] if table is not None else -1
    return dataclasses.replace(plan, start_index=1 + max(pg_max, iceberg_max))


class _SourceRead:
    """The typed batches of one run's read of its source (iterated once); ``mark`` is the cursor / position the
    read has reached (a Postgres source; the plan's ``after`` until a batch moves it)."""

    def __init__(self, plan: WritePlan, settings: Settings, dsn: str):
        self.plan, self.settings, self.dsn = plan, settings, dsn
        self.mark = plan.after

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        plan = self.plan
        if plan.spec.type == "files":
            batch_rows = self.settings.sync.chunk_rows
            yield from read_files(plan.files, plan.spec, self.settings.s3, plan.dataset.columns, batch_rows)
        else:
            yield from read_postgres(plan.spec, plan.spec.dsn(self.dsn), plan.dataset.columns, plan.after, self._moved)

    def _moved(self, mark: Any) -> None:
        self.mark = mark


def uuid_texts(n: int) -> pa.Array:
    """n random (version 4) UUIDs as text, vectorised: measured here 0.5 s per million, against 8 s for
    str(uuid.uuid4()) per row (the native path would otherwise spend more on ids than on Parquet)."""
    raw = np.frombuffer(os.urandom(16 * n), dtype=np.uint8).reshape(n, 16).copy()
    raw[:, 6] = (raw[:, 6] & 0x0F) | 0x40
    raw[:, 8] = (raw[:, 8] & 0x3F) | 0x80
    hexed = np.frombuffer(raw.tobytes().hex().encode(), dtype="S1").reshape(n, 32)
    out = np.full((n, 36), b"-", dtype="S1")
    for src, dst in (
        (slice(0, 8), slice(0, 8)),
        (slice(8, 12), slice(9, 13)),
        (slice(12, 16), slice(14, 18)),
        (slice(16, 20), slice(19, 23)),
        (slice(20, 32), slice(24, 36)),
    ):
        out[:, dst] = hexed[:, src]
    offsets = np.arange(0, 36 * n + 1, 36, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(out.tobytes())])


def _with_identity(batch: pa.RecordBatch, first: int, created_us: int) -> pa.RecordBatch:
    """Identity columns in front: __row_index from ``first`` on, a random __row_id, __created_at (µs)."""
    n = batch.num_rows
    index = pa.array(np.arange(first, first + n, dtype=np.int64))
    created = pa.array(np.full(n, created_us, dtype=np.int64)).cast(pa.timestamp("us", tz="UTC"))
    return pa.RecordBatch.from_arrays(
        [index, uuid_texts(n), created, *batch.columns],
        names=["__row_index", "__row_id", "__created_at", *batch.schema.names],
    )


def _failpoint_after_first(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for i, b in enumerate(batches):
        yield b
        if i == 0:
            failpoint("after-first-batch")


def _native_rows(
    plan: WritePlan, read: _SourceRead, created_at: dt.datetime
) -> Generator[pa.RecordBatch, None, CommitEntries]:
    """The source's batches with identity (__row_index from ``plan.start_index`` on, one __created_at for the
    whole write, as the pg path's now()); returns what their commit also records (lake/writer.write_arrow),
    known only once every row is read: the ingest state (with the cursor reached) and the highest __row_index."""
    next_index = plan.start_index
    created_us = int(created_at.timestamp() * 1_000_000)
    for b in _failpoint_after_first(read):
        if b.num_rows:
            yield _with_identity(b, next_index, created_us)
            next_index += b.num_rows
    props, summary = source_state.commit_entries(plan.state(read.mark))
    return CommitEntries({**props, MAX_ROW_INDEX: str(next_index - 1)}, summary)


def write_to_postgres(plan: WritePlan, conn, settings: Settings, dsn: str, lg) -> IngestResult:
    """The pg path: the rows COPYed into ``dataset_rows`` with the ingest state and the row count in one
    transaction (sources/pg_rows.py), under an admission slot (G2). A failure marks the dataset errored and
    raises SyncFailed (nothing committed); the mirror carries the rows to Iceberg later."""
    ds_id = plan.dataset.id
    lg.info(plan.decision.log_line())  # as route_write logs it on either path
    read = _SourceRead(plan, settings, dsn)
    lifecycle_of(conn, [ds_id])  # a recorded state for the check below to read
    with admission_slot(conn, settings.sync.max_concurrent):
        try:
            with rows_transaction(dsn, conn, ds_id, plan.dataset.columns, replace=plan.replace) as tx:
                tx.check_authority(plan.decision.writer)  # a native writer beside this one: refused, nothing written
                rows = tx.copy(_failpoint_after_first(read), start_index=plan.start_index)
                state = plan.state(read.mark)
                tx.execute(
                    [
                        source_state.save_statement(ds_id, state),
                        stamps.ready_after_pg_ingest_statement(ds_id, rows, replace=plan.replace),
                    ]
                )
            failpoint("after-commit-before-log")  # rows and ingest state committed together
        except SourceError as exc:
            raise _failed(conn, ds_id, exc) from None
        except LakehouseError:
            raise
        except Exception as exc:
            raise _failed(conn, ds_id, exc, dsn) from exc
    total = lookup.row_count(conn, ds_id, NotFound(f"dataset {ds_id} was deleted during its ingest"))
    lg.info(f"pg: {ds_id} ({rows} rows → dataset_rows, sync {plan.sync_id})")
    return plan.result(rows, total, None, source_state.public_cursor(state))


def write_to_iceberg(
    plan: WritePlan, conn, catalog, settings: Settings, dsn: str, lg, run_id: str | None = None
) -> IngestResult:
    """The native path: the rows straight into the dataset's Iceberg table, with the ingest state and sync id in
    that same commit (routing/native_table.py: the run's totals, a compaction of its small files), through the
    write router's native half (route_native: flip gates, G3 + G2, ``iceberg_sync_log``, fail-loud). Then the
    state is copied into Postgres for cheap readers (tracking/ingest_state.py). A retry whose snapshot had
    landed reports the state the table holds."""
    ds_id = plan.dataset.id
    lg.info(plan.decision.log_line())  # as route_write logs it on either path
    read = _SourceRead(plan, settings, dsn)
    commit = functools.partial(_commit_natively, plan, read, conn, catalog, settings)
    # catalog None: abandoned syncs were settled above, under this lock; an interruption is settled by the next run
    result = route_native(
        conn, plan.decision, commit, settings=settings, logger=lg, sync_id=plan.sync_id, run_id=run_id
    ).value
    state: dict | None
    if result.committed:
        state = plan.state(read.mark)
    else:
        state = source_state.current_state(conn, ds_id, load_table_or_none(catalog, table_identifier(settings, ds_id)))
    if state:
        source_state.save_pg_state(conn, ds_id, state)
    rows = result.rows - result.rewritten
    cursor = source_state.public_cursor(state)
    return plan.result(rows, result.total_rows, result.snapshot_id, cursor, compacted_rows=result.rewritten)


def _commit_natively(plan: WritePlan, read: _SourceRead, conn, catalog, settings: Settings, sync_id, source_version):
    """route_native's ``iceberg_write(sync_id, source_version)``: the source version is known only once the
    router has recorded the sync (route_write's after-commit-before-log failpoint follows)."""
    rows = _native_rows(plan, read, dt.datetime.now(dt.UTC))
    mode = "replace" if plan.replace else "append"
    return write_native_table(
        catalog, settings, plan.dataset, rows, TableWrite(mode, sync_id, source_version, path="native"), conn=conn
    )


def run_writer(
    dsn: str,
    catalog,
    settings: Settings,
    flags: FlagResolver,
    dataset_id,
    writer: str,
    *,
    sync_id: uuid.UUID | None = None,
    run_id: str | None = None,
    logger=None,
) -> IngestResult:
    """Run one source writer for one dataset; see the module docstring. BadInput for a locked or unknown
    writer, a dataset with no source or a writer the source cannot feed; SyncFailed when the write fails
    (nothing committed on either path; a native failure also marks the dataset errored)."""
    lg = logger or _log
    check_writer(writer)
    validate_failpoints()  # an armed typo is refused before anything is written
    ds_id = parse_uuid(dataset_id, "dataset id")
    started = time.perf_counter()
    with connect(dsn) as conn:
        dataset, spec = _dataset_and_source(conn, ds_id, writer)
        decision = resolve_write_path(flags, writer, ds_id)  # once: the path planned is the path written
        with dataset_lock(conn, ds_id):
            reap_abandoned(conn, catalog, settings, ds_id)
            table = load_table_or_none(catalog, table_identifier(settings, ds_id))
            total_now = _converge_row_count(conn, ds_id, table)
            try:
                plan = plan_write(conn, settings, dsn, dataset, spec, decision, table, sync_id or uuid.uuid4())
            except SourceError as exc:
                raise _failed(conn, ds_id, exc) from None
            if plan.nothing_new:
                result = plan.result(0, total_now, None, plan.old_cursor, sync_id=None, new=False)
            elif decision.native:
                result = write_to_iceberg(plan, conn, catalog, settings, dsn, lg, run_id)
            else:
                result = write_to_postgres(plan, conn, settings, dsn, lg)
    return dataclasses.replace(result, seconds=time.perf_counter() - started)


def _dataset_and_source(conn, ds_id: uuid.UUID, writer: str) -> tuple[Dataset, SourceSpec]:
    """The tabular dataset and its source, which must take ``writer``; BadInput naming how to fix it."""
    dataset = get_dataset(conn, ds_id)
    if dataset.kind != "tabular":
        raise BadInput(f"dataset {ds_id} is a {dataset.kind} dataset; source writers write tabular datasets")
    spec = get_source(conn, ds_id)
    if spec is None:
        raise BadInput(
            f"dataset {ds_id} has no source; set one with: lakehouse sources set --dataset {ds_id} "
            "(--files <path|glob|s3-uri> | --postgres-table <schema.table> | --postgres-query <sql> "
            "| --cdc-table <schema.table> ...)"
        )
    if writer not in spec.writers:
        raise BadInput(
            f"writer {writer} cannot run on dataset {ds_id}'s source ({spec.describe()}); "
            f"it takes {', '.join(spec.writers)}"
        )
    return dataset, spec


def _converge_row_count(conn, ds_id: uuid.UUID, table) -> int | None:
    """datasets.row_count after a process died between its native commit and its bookkeeping: when the
    table's last commit was native, Iceberg is the truth, so the count is taken from it."""
    if table is not None and table.properties.get(WRITE_PATH) == "native":
        count = table_state(table)["row_count"]
        stamps.converge_row_count(conn, ds_id, count)
        return count
    return lookup.row_count(conn, ds_id, NotFound(f"dataset {ds_id} was deleted during its ingest"))


def _failed(conn, ds_id: uuid.UUID, exc: BaseException, dsn: str | None = None) -> SyncFailed:
    """Mark the dataset errored (fail loud) and say what failed; nothing was committed."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if dsn:
        text = scrub(text, dsn)
    message = f"dataset {ds_id} {text}" if isinstance(exc, SourceError) else f"dataset {ds_id}: ingest failed: {text}"
    stamps.mark_errored(conn, ds_id, message)
    return SyncFailed(message + "; nothing was committed")


def pending_source_changes(dsn: str, settings: Settings, dataset_id) -> str | None:
    """A short stable token naming what is new in the dataset's source since its last ingest (for a sensor's
    run key), or None. Cheap: lists files / asks one max() / compares a cursor-less table's change counters — never
    reads rows, but for a cursor-less query or view, whose fingerprint digests every row (sources/pgsource.py). It reads the Postgres copy
    of the ingest state (tracking/ingest_state.py); if a crash lost that copy after a native commit, the token
    names changes already ingested and the run it triggers finds nothing new and writes nothing."""
    ds_id = parse_uuid(dataset_id, "dataset id")
    with connect(dsn) as conn:
        spec = get_source(conn, ds_id)
        if spec is None:
            return None
        state = source_state.pg_state(conn, ds_id)
    if state is not None and state.get("source") != spec.to_json():
        state = None
    if spec.type == "files":
        seen = (state or {}).get("files") or {}
        new = [f for f in list_files(spec, settings.s3) if seen.get(f.uri) != f.fingerprint]
        if not new:
            return None
        digest = hashlib.sha256("\n".join(f"{f.uri}\t{f.fingerprint}" for f in new).encode()).hexdigest()[:16]
        return f"files:{len(new)}:{digest}"
    if not spec.order_column:  # a full-sync source: its fingerprint against the one the last ingest stored
        if not state:
            return "initial"
        fp, _ = fingerprint(spec, spec.dsn(dsn))
        return None if state.get("fingerprint") == fp else f"changed:{fp}"
    mark = max_mark(spec, spec.dsn(dsn), (state or {}).get("mark"))
    return None if mark is None else f"mark:{mark}"
