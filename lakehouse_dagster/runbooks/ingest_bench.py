"""The concurrency bench of the writer-flip runbook (Fase 4, step 2): validate the guards at the target
concurrency before routing real traffic to iceberg-native.

    distinct-dataset burst  --jobs N --rows R          expect error=0 (G1) and 503s only if N > max_concurrent_ingest (G2)
    same-dataset burst      --jobs N --same-dataset    expect error=0 (G3 serialises; no replace drop-race)

Each job is its own process (the guards must hold across processes, as Dagster runs are), started
together at one instant, writing R generated rows through the real write router and native writer
(route_write → write_arrow) into throwaway datasets of a bench workspace whose Iceberg tables live in
their own namespace. A Backpressure refusal is the runbook's HTTP 503: healthy, counted apart. Gate:
no other error, and the tables hold exactly what was written (distinct: R rows each; same dataset:
replace semantics, R rows and one snapshot per job). ``purge`` drops the bench tables, datasets and
workspace (the flag audit keeps its rows: it is append-only).
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import multiprocessing
import threading
import time
import uuid

import psycopg
import pyarrow as pa
from pyarrow import fs as pafs

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.core.errors import Backpressure, BadInput
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.flags.overrides import clear_override, set_override
from lakehouse_dagster.flags.registry import SERVABLE_READERS
from lakehouse_dagster.flags.resolver import FlagResolver
from lakehouse_dagster.lake.catalog import load_catalog, load_table_or_none, table_identifier
from lakehouse_dagster.lake.schema import arrow_schema
from lakehouse_dagster.parity.verdicts import delete_verdicts
from lakehouse_dagster.routing.write_router import native_write, route_write
from lakehouse_dagster.sources.files import filesystem
from lakehouse_dagster.tracking import datasets as app_tables
from lakehouse_dagster.tracking import sync_log
from lakehouse_dagster.tracking.datasets import row_writes, scopes

BENCH_SCHEMA = [
    {"name": "n", "type": "int64"},
    {"name": "label", "type": "string"},
    {"name": "x", "type": "float64"},
    {"name": "at", "type": "timestamp"},
]
WORKSPACE_PREFIX = "lakehouse-ingest-bench"
OK, BACKPRESSURE, ERROR = "ok", "503", "error"


@dataclasses.dataclass
class JobOutcome:
    job: int
    dataset_id: str
    status: str  # ok | 503 | error
    seconds: float
    rows: int = 0
    snapshot_id: int | None = None
    error: str | None = None
    started_at: float | None = None  # epoch seconds it left the barrier (comparable across processes)


@dataclasses.dataclass
class BenchReport:
    jobs: int
    rows: int
    same_dataset: bool
    max_concurrent_ingest: int
    namespace: str
    workspace_id: str
    outcomes: list[JobOutcome]
    seconds: float  # the ingests: from their common start (the barrier) to the last one's end
    table_problems: list[str]
    # the command's whole time and where it went (issue 33: "in 31.5 s" of a 3 min 44 s command said too little)
    wall_seconds: float = 0.0
    phases: dict[str, float] = dataclasses.field(default_factory=dict)

    def count(self, status: str) -> int:
        return sum(o.status == status for o in self.outcomes)

    @property
    def passed(self) -> bool:
        return self.count(ERROR) == 0 and not self.table_problems

    def summary_line(self, extra: dict[str, float] | None = None) -> str:
        """``extra``: phases the caller timed after the report was made (the CLI's purge), counted in the wall."""
        written = sum(o.rows for o in self.outcomes if o.status == OK)
        rate = f", {written / self.seconds:,.0f} rows/s" if self.seconds > 0 else ""
        verdict = "PASS" if self.passed else "FAIL"
        return (
            f"{verdict}: jobs={self.jobs} ok={self.count(OK)} 503={self.count(BACKPRESSURE)} "
            f"error={self.count(ERROR)} (max_concurrent_ingest={self.max_concurrent_ingest}"
            f"{', same dataset' if self.same_dataset else ''}): the ingests took {took(self.seconds)} from their "
            f"common start{rate}{self.wall_text(extra)}"
        )

    def wall_text(self, extra: dict[str, float] | None = None) -> str:
        """`` (wall 3 min 44 s, of which starting the 32 writer processes 2 min 50 s, …)``: the whole, and the
        phases other than the ingests themselves. ``extra``: phases the caller adds after (the purge)."""
        phases = {**self.phases, **(extra or {})}
        if not phases:
            return ""
        wall = self.wall_seconds + sum((extra or {}).values())
        parts = ", ".join(f"{what} {took(s)}" for what, s in phases.items() if what != INGESTS)
        return f" (wall {took(wall)}, of which {parts})"

    def as_dict(self) -> dict:
        return {
            **{k: v for k, v in dataclasses.asdict(self).items() if k != "outcomes"},
            "outcomes": [dataclasses.asdict(o) for o in self.outcomes],
            "counts": {s: self.count(s) for s in (OK, BACKPRESSURE, ERROR)},
            "passed": self.passed,
        }


def _batches(dataset, rows: int, job: int, chunk: int = 50_000):

    schema = arrow_schema(dataset.columns)
    start_ts = 1_700_000_000_000_000
    for lo in range(0, rows, chunk):
        n = min(chunk, rows - lo)
        idx = pa.array(range(lo, lo + n), pa.int64())
        yield pa.RecordBatch.from_arrays(
            [
                idx,
                pa.array([str(uuid.uuid4()) for _ in range(n)], pa.string()),
                pa.array([start_ts + i for i in range(lo, lo + n)], pa.timestamp("us", tz="UTC")),
                idx,
                pa.array([f"job {job} row {i}" for i in range(lo, lo + n)], pa.string()),
                pa.array([i / 7 for i in range(lo, lo + n)], pa.float64()),
                pa.array([start_ts + 1000 * i for i in range(lo, lo + n)], pa.timestamp("us", tz="UTC")),
            ],
            schema=schema,
        )


def _job(dsn: str, settings: Settings, job: int, dataset_id: str, rows: int, writer: str, barrier) -> JobOutcome:
    """One writer process: set up, wait until every job is ready, then write through the write router."""

    try:
        conn = connect(dsn)
        catalog = load_catalog(settings, dsn)
        dataset = app_tables.get_dataset(conn, dataset_id)
        batches = _batches(dataset, rows, job)
    except Exception as exc:  # release the others: nobody waits for a job that cannot start
        barrier.abort()
        return JobOutcome(job, dataset_id, ERROR, 0.0, error=f"setup failed: {type(exc).__name__}: {exc}")
    with conn:
        try:
            barrier.wait(timeout=300)  # the burst: every job leaves this line together
        except threading.BrokenBarrierError:
            return JobOutcome(job, dataset_id, ERROR, 0.0, error="another job failed to start; no burst")
        started_at, t = time.time(), time.perf_counter()
        try:
            out = route_write(
                conn,
                FlagResolver(conn, 0),
                writer,
                dataset.id,
                pg_write=lambda: (_ for _ in ()).throw(RuntimeError("bench datasets are written iceberg-native")),
                iceberg_write=native_write(catalog, settings, dataset, batches, writer=writer, conn=conn),
                settings=settings,
            )
        except Backpressure as exc:
            return JobOutcome(
                job, dataset_id, BACKPRESSURE, time.perf_counter() - t, error=str(exc), started_at=started_at
            )
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            return JobOutcome(job, dataset_id, ERROR, time.perf_counter() - t, error=error, started_at=started_at)
        seconds = time.perf_counter() - t
        return JobOutcome(job, dataset_id, OK, seconds, out.value.rows, out.value.snapshot_id, started_at=started_at)


def run_ingest_bench(
    dsn: str,
    settings: Settings,
    *,
    jobs: int,
    rows: int,
    same_dataset: bool = False,
    namespace: str = "bench",
    actor: str = "ingest-bench",
) -> BenchReport:
    if jobs < 1 or rows < 1:
        raise BadInput(f"--jobs and --rows must be at least 1 (got jobs={jobs}, rows={rows})")
    if namespace == settings.catalog.namespace:
        raise BadInput(
            f"--namespace {namespace} is the lakehouse's own namespace; the bench writes throwaway "
            "tables and purges them: give it its own (default bench)"
        )
    bench_settings = settings.replace(catalog={"namespace": namespace})
    began = time.time()
    writer = "sync.full" if same_dataset else "sync.append"
    with connect(dsn) as conn:
        ws = app_tables.create_workspace(
            conn, f"{WORKSPACE_PREFIX} {namespace} {time.strftime('%Y-%m-%dT%H:%M:%S')} {uuid.uuid4().hex[:6]}"
        )
        n_datasets = 1 if same_dataset else jobs
        ids = [str(app_tables.create_dataset(conn, ws, f"bench-{i}", BENCH_SCHEMA)) for i in range(n_datasets)]
        # Throwaway datasets with no readers: the flip gates' prerequisites are about consumers, so the
        # raw override is used on purpose, scoped to the bench workspace only (audited). The workspace is
        # read-flipped first, as the runbook asks: the write router refuses a native write into a new empty
        # dataset whose readers are still on Postgres (routing/native_guard.py).
        for reader in SERVABLE_READERS:
            set_override(conn, "read", reader.name, "iceberg", workspace=ws, note="ingest bench", actor=actor)
        set_override(conn, "write", writer, "iceberg_native", workspace=ws, note="ingest bench", actor=actor)
    set_up = time.time()
    ctx = multiprocessing.get_context("spawn")
    before = set(multiprocessing.active_children())
    with ctx.Manager() as manager, cf.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        barrier = manager.Barrier(jobs)
        futures = [
            pool.submit(_job, dsn, bench_settings, j, ids[0 if same_dataset else j], rows, writer, barrier)
            for j in range(jobs)
        ]
        try:
            outcomes = [f.result() for f in futures]
        except BaseException:  # Ctrl-C, a SIGTERM turned into an exception, a run termination
            _stop_writers(before)  # before the pool's exit, which would wait for them
            raise
    seconds = max(o.seconds for o in outcomes) if outcomes else 0.0  # the burst, from the common start
    written = time.time()
    starts = [o.started_at for o in outcomes if o.started_at is not None]
    burst_start = min(starts) if starts else written
    problems = _check_tables(dsn, bench_settings, ids, outcomes, rows, same_dataset)
    ended = time.time()
    phases = {
        "setting up the workspace and datasets": set_up - began,
        f"starting the {jobs} writer process(es)": max(0.0, burst_start - set_up),
        INGESTS: seconds,
        "the writers' exit": max(0.0, written - burst_start - seconds),
        "checking the tables": ended - written,
    }
    return BenchReport(
        jobs,
        rows,
        same_dataset,
        settings.sync.max_concurrent,
        namespace,
        str(ws),
        outcomes,
        seconds,
        problems,
        wall_seconds=ended - began,
        phases=phases,
    )


INGESTS = "the ingests"


def took(seconds: float) -> str:
    """``31.5 s``, ``3 min 44 s``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s"


def _stop_writers(keep: set) -> None:
    """Interrupted: kill the bench's writer processes (waiting at the barrier, writing, even frozen) before the
    caller purges, so nothing writes behind the purge. They are throwaway writers into throwaway tables."""
    for p in set(multiprocessing.active_children()) - keep:
        p.kill()
    for p in set(multiprocessing.active_children()) - keep:
        p.join(10)


def _check_tables(dsn, settings, ids, outcomes, rows, same_dataset) -> list[str]:

    catalog = load_catalog(settings, dsn)
    problems = []
    for ds_id in ids:
        mine = [o for o in outcomes if o.dataset_id == ds_id and o.status == OK]
        table = load_table_or_none(catalog, table_identifier(settings, uuid.UUID(ds_id)))
        if not mine:
            continue
        snap = table.current_snapshot() if table is not None else None
        if table is None or snap is None:
            problems.append(f"{ds_id}: {len(mine)} job(s) succeeded but the table has no snapshot")
            continue
        count = int((snap.summary.additional_properties if snap.summary else {}).get("total-records", -1))
        if count != rows:
            problems.append(f"{ds_id}: the table holds {count} rows, expected {rows}")
        snapshots = len(table.snapshots())
        if same_dataset and snapshots != len(mine):
            problems.append(f"{ds_id}: {snapshots} snapshots for {len(mine)} successful replace jobs")
    return problems


def purge(dsn: str, settings: Settings, *, namespace: str = "bench", actor: str = "ingest-bench") -> dict:
    """Drop every bench workspace's tables (in ``namespace``), datasets and the workspace itself."""

    bench_settings = settings.replace(catalog={"namespace": namespace})
    catalog = load_catalog(bench_settings, dsn)
    dropped = datasets = 0
    with connect(dsn) as conn:
        workspaces = app_tables.workspace_ids_named_like(conn, f"{WORKSPACE_PREFIX} {namespace} %")
        for ws in workspaces:
            for ds_id in scopes.ids_in_workspace(conn, ws):
                dropped += _purge_table(catalog, bench_settings, table_identifier(bench_settings, ds_id))
                datasets += 1
            for writer in ("sync.full", "sync.append"):
                clear_override(conn, "write", writer, workspace=ws, note="ingest bench purge", actor=actor)
            for reader in SERVABLE_READERS:
                clear_override(conn, "read", reader.name, workspace=ws, note="ingest bench purge", actor=actor)
            _delete_workspace(conn, ws)
    namespace_dropped = _purge_namespace(catalog, bench_settings, namespace)
    return {
        "namespace": namespace,
        "workspaces": len(workspaces),
        "datasets": datasets,
        "tables_dropped": dropped,
        "namespace_dropped": namespace_dropped,
    }


def _purge_namespace(catalog, settings: Settings, namespace: str) -> bool:
    """The bench namespace and its directory go too once no table is left in it (tables the bench did not make keep
    both); True when the namespace was dropped. Nothing of the bench stays behind, not even empty directories."""
    from pyiceberg.exceptions import NamespaceNotEmptyError, NoSuchNamespaceError  # lazy: the catalog's errors

    try:
        if catalog.list_tables(namespace):
            return False
        catalog.drop_namespace(namespace)
        dropped = True
    except (NoSuchNamespaceError, NamespaceNotEmptyError):
        dropped = False
    root = f"{settings.catalog.warehouse.rstrip('/')}/{namespace}"  # where the catalog put the bench tables
    try:
        fs, path = filesystem(root, settings.s3) if root.startswith("s3://") else pafs.FileSystem.from_uri(root)
        files = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
        if not any(f.type == pafs.FileType.File for f in files):
            fs.delete_dir(path)
    except OSError:  # gone already, or not ours to list: the tables and datasets are purged all the same
        pass
    return dropped


def _purge_table(catalog, settings: Settings, identifier) -> int:
    """Drop the table with its files, then its whole location: a writer killed mid-write (an interrupted bench)
    leaves data files no snapshot references, which ``purge_table`` does not know about. 1 if a table was dropped."""

    table = load_table_or_none(catalog, identifier)
    if table is None:  # never written (a 503, or killed before its first file)
        return 0
    location = table.location()
    catalog.purge_table(identifier)
    if settings.catalog.type == "rest":
        # A REST catalog's purge is the server's (purgeRequested): the location is its own, and a table bucket
        # (SeaweedFS, S3 Tables) refuses a client's request on a dropped table's keys (ACCESS_DENIED).
        return 1
    try:
        fs, root = (
            filesystem(location, settings.s3) if location.startswith("s3://") else pafs.FileSystem.from_uri(location)
        )
        fs.delete_dir(root)
    except FileNotFoundError:
        pass
    return 1


def _delete_workspace(conn: psycopg.Connection, ws: uuid.UUID) -> None:
    with conn.transaction():
        ids = scopes.ids_in_workspace(conn, ws)
        sync_log.delete_syncs(conn, ids)
        delete_verdicts(conn, ids)
        row_writes.delete_workspace_datasets(conn, ws, ids)
        app_tables.delete_workspace_row(conn, ws)
