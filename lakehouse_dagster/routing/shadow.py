"""Shadow reads: in read mode ``shadow`` the router serves Postgres, and for a sample of reads the same read also
runs against Iceberg, off the request path, and the two results are compared order-independently.

The served read only pays a random draw and a non-blocking ``put`` on a bounded queue: a full queue drops the
comparison (counted, and recorded as ``dropped`` by the next comparison that lands), and nothing a worker does —
a slow catalog, a failed Iceberg read, a lost database — reaches the caller. A few daemon threads per process
(``LAKEHOUSE_SHADOW_WORKERS``) take the queue (``LAKEHOUSE_SHADOW_QUEUE``); ``LAKEHOUSE_SHADOW_SAMPLE`` is the
fraction of reads compared.

Comparison: each row becomes the parity contract's canonical text (parity/canonical.py: one text per typed
value, nulls, floats by their bits, timestamps as epoch microseconds, json as its jsonb text), and the two
multisets of texts must be equal: same rows, same values, any order. Which rows: a full read (no limit, or fewer
rows than the limit) against the same read of the pinned snapshot; an ordered limited read likewise; an unordered
limited read against the Iceberg rows with the same ``__row_index`` values (when the projection has it; otherwise
``not-comparable``). Only reads at caught-up versions count: the snapshot must cover the Postgres version the
router saw, and Postgres must not have moved by the time the worker looks (``lagging`` otherwise).

A structured read (routing/request.py: where, order, aggregate, addressing; issue 43) is compared the same way
but whole: the worker computes the same plan over the pinned snapshot with the Iceberg executor and the two answers
must be equal by ``compute.compare``'s rule (same schema; same rows, in order when the plan is ordered — an
aggregate always is —, as multisets otherwise; floats by value, NaN equal to NaN, -0.0 to 0.0; no tolerance). Every
structured plan is comparable: a limit without an order is ordered by ``__row_index`` at bind time.

On a native dataset whose reverse mirror keeps ``dataset_rows``, a compute reader in mode shadow is served that copy
(``pg@reverse``): it is compared with the snapshot the copy holds (``lakehouse_reverse_position``), and is ``lagging``
when the reverse applied another one around the read (``shadowed``).

Each comparison is a row of ``lakehouse_shadow_reads``: reader, dataset, outcome (match | mismatch | lagging |
no-snapshot | not-comparable | error | dropped), both versions (Postgres rows_version; the snapshot and the
Postgres version it covers), for a mismatch the first differing row (or group) from each side, the structured
request (``query``; null for a projection read) and the digest of the dataset's schema it ran against (read with
the version check: flags/proof.py counts only the comparisons since the last change of schema).
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import datetime as dt
import json
import logging
import math
import queue
import random
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
import pyarrow as pa
from psycopg.types.json import Jsonb
from pyiceberg.expressions import In

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.core.settings import ShadowSettings
from lakehouse_dagster.flags.proof import outcomes_since, record_dropped, record_shadow_read
from lakehouse_dagster.lake.reader import read_iceberg
from lakehouse_dagster.mirror.reverse_lag import held_snapshot
from lakehouse_dagster.parity.canonical import SEP, canonical_value
from lakehouse_dagster.routing import compute
from lakehouse_dagster.routing.iceberg_compute import read_iceberg_compute
from lakehouse_dagster.routing.projection import Projection
from lakehouse_dagster.routing.read_router import ReadDecision, ReadResult
from lakehouse_dagster.routing.request import Plan, Query
from lakehouse_dagster.tracking.datasets import Dataset, lookup

log = logging.getLogger("lakehouse_dagster.read_router")

MATCH, MISMATCH, LAGGING, NO_SNAPSHOT = "match", "mismatch", "lagging", "no-snapshot"
NOT_COMPARABLE, ERROR, DROPPED = "not-comparable", "error", "dropped"
ROW_INDEX = "__row_index"
# A streamed read (the service) is copied for its comparison only up to this many rows; a longer one is not compared
# (counted as too-large in the pool's counts): whole-table parity is the canary's, shadow reads sample what callers
# read.
MAX_STREAMED_ROWS = 100_000
_IDENTITY_TYPES = {"__row_index": "int64", "__row_id": "string", "__created_at": "timestamp"}

# (snapshot id, the __row_index values to read or None for the read as it was asked) → the Iceberg rows
IcebergRead = Callable[[int, "list[int] | None"], pa.Table]
# snapshot id → a structured plan's answer computed by the Iceberg executor over that snapshot
IcebergAnswer = Callable[[int], pa.Table]


@dataclasses.dataclass(frozen=True)
class ShadowJob:
    reader: str
    dataset_id: uuid.UUID
    columns: tuple[tuple[str, str], ...]  # (name, canonical type) in the projection's order
    limit: int | None
    ordered: bool
    pg_version: int  # datasets.rows_version the router saw
    snapshot_id: int | None
    iceberg_version: int | None  # the Postgres version the snapshot covers
    pg_rows: pa.Table
    iceberg: IcebergRead | None  # a projection read's Iceberg side
    answer: IcebergAnswer | None = None  # a structured read's Iceberg side (then ``ordered`` is the plan's)
    query: dict | None = None  # the structured request, as recorded
    reverse_snapshot: int | None = None  # read from the reverse mirror's copy: the snapshot it held (pg@reverse)


@dataclasses.dataclass(frozen=True)
class Compared:
    outcome: str
    pg_rows: int | None = None
    iceberg_rows: int | None = None
    pg_row: dict | None = None
    iceberg_row: dict | None = None
    detail: str | None = None
    schema_digest: str | None = None  # md5 of datasets.schema when the comparison was made (caught-up ones)


def _texts(table: pa.Table, columns: Sequence[tuple[str, str]]) -> list[tuple[str, dict]]:
    rows = table.select([c for c, _ in columns]).to_pylist()
    return [(SEP.join(canonical_value(r[c], t) for c, t in columns), r) for r in rows]


def compare_tables(pg: pa.Table, ice: pa.Table, columns: Sequence[tuple[str, str]]) -> Compared:
    """Order-independent: the multisets of canonical row texts. A mismatch names the first differing row of each
    side (lowest __row_index when the projection has it)."""
    left, right = _texts(pg, columns), _texts(ice, columns)
    lc, rc = collections.Counter(t for t, _ in left), collections.Counter(t for t, _ in right)
    if lc == rc:
        return Compared(MATCH, len(left), len(right))
    only_pg, only_ice = lc - rc, rc - lc
    first_pg = _first([r for t, r in left if t in only_pg])
    first_ice = None
    if first_pg is not None and ROW_INDEX in first_pg:
        first_ice = next((r for t, r in right if t in only_ice and r.get(ROW_INDEX) == first_pg[ROW_INDEX]), None)
    if first_ice is None:
        first_ice = _first([r for t, r in right if t in only_ice])
    detail = (
        f"{sum(only_pg.values())} row(s) only in Postgres, {sum(only_ice.values())} only in Iceberg "
        f"(of {len(left)} and {len(right)})"
    )
    return Compared(MISMATCH, len(left), len(right), _jsonable(first_pg), _jsonable(first_ice), detail)


def _first(rows: list[dict]) -> dict | None:
    if not rows:
        return None
    if ROW_INDEX in rows[0]:
        return min(rows, key=lambda r: (r[ROW_INDEX] is None, r[ROW_INDEX] or 0))
    return rows[0]


def _json_value(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):  # jsonb has no NaN/Infinity: the words the reads use
        return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
    return v


def _jsonable(row: dict | None) -> dict | None:
    if row is None:
        return None
    return json.loads(json.dumps({k: _json_value(v) for k, v in row.items()}, default=str))


def compare_answers(pg: pa.Table, ice: pa.Table, ordered: bool) -> Compared:
    """Two answers of one structured plan, by ``compute.compare``'s rule; a mismatch names the first differing row
    (group) of each side."""
    d = compute.difference(pg, ice, ordered)
    if d is None:
        return Compared(MATCH, pg.num_rows, ice.num_rows)
    detail = f"Postgres vs Iceberg: {d.detail}"[:1000]
    return Compared(MISMATCH, pg.num_rows, ice.num_rows, _jsonable(d.first), _jsonable(d.second), detail)


def run_job(conn: psycopg.Connection, job: ShadowJob) -> Compared:
    """The Iceberg side and the comparison of one sampled read (in a worker)."""
    if job.snapshot_id is None:
        return Compared(NO_SNAPSHOT, job.pg_rows.num_rows, detail="Iceberg has no snapshot of it")
    if job.reverse_snapshot is not None:
        held = held_snapshot(conn, job.dataset_id)
        if held is None or held[0] != job.reverse_snapshot:
            return Compared(
                LAGGING,
                job.pg_rows.num_rows,
                detail=f"the reverse mirror moved dataset_rows from snapshot {job.reverse_snapshot} to "
                f"{held[0] if held else 'none'} around the read",
            )
    if job.iceberg_version is None or job.iceberg_version < job.pg_version:
        return Compared(
            LAGGING,
            job.pg_rows.num_rows,
            detail=f"the snapshot covers Postgres version {job.iceberg_version}, the read saw {job.pg_version}",
        )
    names = [c for c, _ in job.columns]
    whole = job.limit is None or job.pg_rows.num_rows < job.limit
    if job.answer is not None:
        ice = job.answer(job.snapshot_id)
    elif job.iceberg is None:
        raise ValueError("a shadow job without an Iceberg side")
    elif whole or job.ordered:
        ice = job.iceberg(job.snapshot_id, None)
    elif ROW_INDEX in names:
        indexes = [i for i in job.pg_rows.column(ROW_INDEX).to_pylist() if i is not None]
        ice = job.iceberg(job.snapshot_id, indexes)
    else:
        return Compared(
            NOT_COMPARABLE,
            job.pg_rows.num_rows,
            detail="a limited read in no order without __row_index: the two sides return different rows by design",
        )
    # a change of schema moves rows_version too: the digest read here is the schema both sides ran against
    now = lookup.version_and_schema_digest(conn, job.dataset_id)
    if now is None or now[0] != job.pg_version:
        return Compared(
            LAGGING,
            job.pg_rows.num_rows,
            ice.num_rows,
            detail=f"Postgres moved from version {job.pg_version} to {now[0] if now else 'gone'} around the read",
        )
    if job.answer is not None:
        compared = compare_answers(job.pg_rows, ice, job.ordered)
    else:
        compared = compare_tables(job.pg_rows, ice, job.columns)
    return dataclasses.replace(compared, schema_digest=now[1])


def record(conn: psycopg.Connection, job: ShadowJob, c: Compared, seconds: float) -> None:
    record_shadow_read(
        conn,
        (
            job.reader,
            job.dataset_id,
            c.outcome,
            job.pg_version,
            job.snapshot_id,
            job.iceberg_version,
            c.pg_rows,
            c.iceberg_rows,
            Jsonb(c.pg_row) if c.pg_row is not None else None,
            Jsonb(c.iceberg_row) if c.iceberg_row is not None else None,
            c.detail,
            round(seconds, 4),
            Jsonb(job.query) if job.query is not None else None,
            c.schema_digest,
        ),
    )


class ShadowPool:
    """A bounded queue and a few daemon worker threads, each with its own connection."""

    def __init__(
        self,
        dsn: str,
        *,
        workers: int = 2,
        queue_size: int = 64,
        sample: float = 0.1,
        draw: Callable[[], float] = random.random,
    ):
        self.dsn, self.sample, self._draw = dsn, sample, draw
        self._queue: queue.Queue[ShadowJob | None] = queue.Queue(maxsize=queue_size)
        self._workers = workers
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.counts: collections.Counter[str] = collections.Counter()
        self._dropped: collections.Counter[tuple[str, uuid.UUID]] = collections.Counter()

    def draw(self) -> bool:
        """Is this read one of the sample? (A streaming caller asks first, so it copies only the reads compared.)"""
        try:
            return self.sample > 0 and self._draw() < self.sample
        except Exception:  # the draw is a callable of the caller's: losing a comparison must not fail the read
            return False

    def offer(self, job: ShadowJob, *, drawn: bool = False) -> bool:
        """Called on the request path: never blocks, never raises. True when the comparison was queued. ``drawn``:
        the caller already drew this read into the sample (``draw``)."""
        try:
            if not drawn and not self.draw():
                return False
            self._start()
            try:
                self._queue.put_nowait(job)
            except queue.Full:
                with self._lock:
                    self.counts[DROPPED] += 1
                    self._dropped[(job.reader, job.dataset_id)] += 1
                    n = self.counts[DROPPED]
                if n == 1 or n % 100 == 0:
                    log.warning(f"[read-router] shadow queue full: {n} sampled read(s) dropped so far (not compared)")
                return False
            with self._lock:
                self.counts["queued"] += 1
            return True
        except Exception as exc:  # the caller's read was served: losing a comparison must not fail it
            log.warning(f"[read-router] shadow read not queued: {type(exc).__name__}: {exc}")
            return False

    def _start(self) -> None:
        if len(self._threads) >= self._workers:
            return
        with self._lock:
            while len(self._threads) < self._workers:
                t = threading.Thread(target=self._work, name=f"lakehouse-shadow-{len(self._threads)}", daemon=True)
                t.start()
                self._threads.append(t)

    def _work(self) -> None:
        conn: psycopg.Connection | None = None
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                started = time.perf_counter()
                if conn is None or conn.closed:
                    conn = connect(self.dsn)
                try:
                    compared = run_job(conn, job)
                except Exception as exc:  # the Iceberg side failed: recorded, never a match
                    compared = Compared(ERROR, job.pg_rows.num_rows, detail=f"{type(exc).__name__}: {exc}"[:1000])
                record(conn, job, compared, time.perf_counter() - started)
                self._flush_dropped(conn)
                with self._lock:
                    self.counts[compared.outcome] += 1
            except Exception as exc:  # the database is gone: count it, reconnect for the next one
                with self._lock:
                    self.counts["unrecorded"] += 1
                log.warning(f"[read-router] shadow comparison not recorded: {type(exc).__name__}: {exc}")
                if conn is not None:
                    conn.close()
                conn = None
            finally:
                self._queue.task_done()

    def _flush_dropped(self, conn: psycopg.Connection) -> None:
        with self._lock:
            dropped, self._dropped = self._dropped, collections.Counter()
        for (reader, ds), n in dropped.items():
            record_dropped(conn, reader, ds, n, f"{n} sampled read(s) not compared: the shadow queue was full")

    def drain(self, timeout: float = 30.0) -> bool:
        """Wait until every queued comparison is recorded (tests, process exit); False on timeout."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def close(self) -> None:
        for _ in self._threads:
            try:
                self._queue.put_nowait(None)
            except queue.Full:
                break


_pools: dict[str, ShadowPool] = {}
_pools_lock = threading.Lock()


def pool_for(shadow: ShadowSettings, dsn: str) -> ShadowPool:
    """The process's pool for this database (created on first use, drained for a few seconds at exit)."""
    pool = _pools.get(dsn)
    if pool is not None:
        return pool
    with _pools_lock:
        if dsn not in _pools:
            _pools[dsn] = ShadowPool(dsn, workers=shadow.workers, queue_size=shadow.queue, sample=shadow.sample)
            if len(_pools) == 1:
                atexit.register(_drain_all)
        return _pools[dsn]


def _drain_all() -> None:
    for pool in list(_pools.values()):
        pool.drain(timeout=5.0)


def shadowed(d: ReadDecision) -> tuple[int | None, int | None, int | None] | None:
    """Is a read the router served from Postgres compared with Iceberg, and against what: (snapshot, the Postgres
    version it covers, the reverse copy's snapshot) — None when not. Read mode shadow serves Postgres: ``pg@shadow``
    against the latest snapshot; on a native dataset whose reverse mirror keeps ``dataset_rows`` a compute reader in
    mode shadow is served the reverse copy (``pg@reverse``), compared with the very snapshot that copy holds."""
    if d.freshness is None:
        return None
    if d.reason == "pg@shadow":
        return d.freshness.snapshot_id, d.freshness.source_version, None
    if d.reason == "pg@reverse" and d.mode == "shadow" and d.reverse_snapshot is not None:
        return d.reverse_snapshot, d.freshness.rows_version, d.reverse_snapshot
    return None


def offer_read(
    pool: ShadowPool,
    result: ReadResult,
    dataset: Dataset,
    projection: Projection,
    iceberg: IcebergRead,
    *,
    drawn: bool = False,
) -> bool:
    """After a read the router served from Postgres in shadow mode: offer it for comparison (else do nothing)."""
    d = result.decision
    against = shadowed(d)
    if against is None or d.freshness is None or not isinstance(result.value, pa.Table):
        return False
    types = {c.name: c.type for c in dataset.columns} | _IDENTITY_TYPES
    job = ShadowJob(
        reader=d.reader,
        dataset_id=d.dataset_id,
        columns=tuple((c, types[c]) for c in projection.columns),
        limit=projection.limit,
        ordered=projection.order_by_row_index,
        pg_version=d.freshness.rows_version,
        snapshot_id=against[0],
        iceberg_version=against[1],
        pg_rows=result.value,
        iceberg=iceberg,
        reverse_snapshot=against[2],
    )
    return pool.offer(job, drawn=drawn)


def offer_query(
    pool: ShadowPool,
    result: ReadResult,
    plan: Plan,
    query: Query,
    answer: IcebergAnswer,
    *,
    drawn: bool = False,
) -> bool:
    """After a structured read the router served from Postgres in shadow mode: offer its answer for comparison with
    the same plan computed over the snapshot the router saw (``answer``, run by the worker)."""
    d = result.decision
    against = shadowed(d)
    if against is None or d.freshness is None or not isinstance(result.value, pa.Table):
        return False
    job = ShadowJob(
        reader=d.reader,
        dataset_id=d.dataset_id,
        columns=(),
        limit=plan.limit,
        ordered=plan.ordered,
        pg_version=d.freshness.rows_version,
        snapshot_id=against[0],
        iceberg_version=against[1],
        pg_rows=result.value,
        iceberg=None,
        answer=answer,
        query=query.model_dump(mode="json", exclude_none=True),
        reverse_snapshot=against[2],
    )
    return pool.offer(job, drawn=drawn)


def iceberg_answer(load_table: Callable[[], Any], plan: Plan) -> IcebergAnswer:
    """The Iceberg half of a structured read's comparison: the plan over a snapshot, by the Iceberg executor."""

    def run(snapshot_id: int) -> pa.Table:
        return read_iceberg_compute(load_table(), snapshot_id, plan)

    return run


def iceberg_side(load_table: Callable[[], Any], projection: Projection) -> IcebergRead:
    """The Iceberg half of a shadow comparison: the same read of the pinned snapshot, or (an unordered limited read)
    the rows with the served rows' ``__row_index`` values. ``load_table``: the dataset's table, loaded by the worker."""

    def read(snapshot_id: int, row_indexes: list[int] | None) -> pa.Table:
        table = load_table()
        if row_indexes is not None:
            return read_rows(table, projection.columns, row_indexes, snapshot_id)
        return read_iceberg(
            table,
            projection.columns,
            limit=projection.limit,
            order_by_row_index=projection.order_by_row_index,
            snapshot_id=snapshot_id,
        )

    return read


def read_rows(table, columns: Sequence[str], row_indexes: list[int], snapshot_id: int) -> pa.Table:
    """The rows of the snapshot with these __row_index values (the other side of an unordered limited read)."""
    if not row_indexes:
        return table.scan(selected_fields=tuple(columns), limit=0, snapshot_id=snapshot_id).to_arrow()
    fields = tuple(dict.fromkeys([*columns, ROW_INDEX]))
    row_filter = In(ROW_INDEX, set(row_indexes))  # type: ignore[call-arg, arg-type]  # (term, literals), as pyiceberg takes them
    scan = table.scan(row_filter=row_filter, selected_fields=fields, snapshot_id=snapshot_id)
    return scan.to_arrow().select(list(columns))


def since(conn: psycopg.Connection, reader: str, at: dt.datetime) -> list[tuple]:
    """(dataset id, outcome, count) of a reader's shadow reads since ``at`` (for people and tests)."""
    return outcomes_since(conn, reader, at)
