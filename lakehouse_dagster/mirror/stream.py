"""The mirror as a stream: one long-lived loop per shard of the datasets, syncing each changed dataset within about
a second of its write, instead of a Dagster run per batch of changes (docs/design/mirror.md "The stream").

The loop is plain Python (no Dagster): the ``mirror_stream`` job (dagster/defs/mirror/stream_job.py) runs it for a
bounded time and logs what it yields. It

* holds its shard's lock (a Postgres advisory lock keyed by the shard) for its whole life: a successor started
  before it ends waits on that lock while it finishes its last commit, so a shard is never streamed twice at once,
  and a killed run's lock goes with its connection;
* beats a heartbeat row (lakehouse_mirror_streams) from a thread, so the poller sees a run that died or hung;
* finds changed datasets in O(changed) from the poller's xid cursor (mirror/poller.py ``pending_syncs``), every
  ``LAKEHOUSE_MIRROR_POLL_MS``, and sweeps the datasets behind Postgres (``datasets_behind``: failed syncs past
  their backoff, changes made while no stream ran) at its start and every few seconds;
* coalesces the changes of one dataset seen within ``LAKEHOUSE_MIRROR_COMMIT_WINDOW_MS`` of its first into one sync;
* syncs through ``sync_dataset`` (mirror/sync.py), one dataset at a time: the same sync log, guards (G3 per dataset,
  G2 admission) and refusals (manifest and iceberg-native datasets) as every other mirror path;
* applies the native commits of the shard's datasets back to ``dataset_rows`` (the reverse mirror,
  mirror/reverse.py): each poll reads the native commits since its cursor (one index scan), its sweep asks
  ``due_datasets`` for the shard; ``apply_reverse`` runs on the same workers, never beside a sync of the dataset;
* in idle moments, compacts small files and expires snapshots of the datasets it synced, one dataset at a time in
  the background, each at most every ``LAKEHOUSE_MIRROR_STREAM_MAINTENANCE_SECONDS`` (mirror/stream_maintenance.py).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Generator, Iterator

import psycopg

from lakehouse_dagster.core.db import IdlePool, connect, fetch_value
from lakehouse_dagster.core.errors import Backpressure, LakehouseError, LockTimeout, first_line, is_transient
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.mirror.batch import BUSY_LOCK_WAIT_S, Failed
from lakehouse_dagster.mirror.poller import Cursor, Pending, datasets_behind, pending_syncs, record_requests
from lakehouse_dagster.mirror.stream_lease import (
    HEARTBEAT_EVERY_S,
    ShardLease,
    check_shard,
    shard_of,
)
from lakehouse_dagster.mirror.stream_maintenance import Maintained, StreamMaintenance
from lakehouse_dagster.mirror.stream_pacing import BUSY_RETRY_S, _Rest
from lakehouse_dagster.mirror.stream_reverse import REVERSE_BACKOFF_MAX_S, ReverseApplied, ReverseFailed, _Reverse
from lakehouse_dagster.mirror.sync import SyncResult, sync_dataset

# The stream's face: every name callers import from mirror.stream, wherever it lives now.
__all__ = [
    "BUSY_RETRY_S",
    "HEARTBEAT_EVERY_S",
    "PAGE",
    "REVERSE_BACKOFF_MAX_S",
    "SWEEP_EVERY_S",
    "Event",
    "Idle",
    "ReverseApplied",
    "ReverseFailed",
    "ShardLease",
    "Stopped",
    "_Reverse",  # test_reverse_driver drives the stream's reverse share directly
    "check_shard",
    "shard_of",
    "stream_shard",
    "stream_sync_id",
]


_log = logging.getLogger(__name__)


_log = logging.getLogger(__name__)


SWEEP_EVERY_S = 5.0  # how often a stream looks for datasets behind Postgres that the cursor did not bring


PAGE = 1000  # changed datasets read per cursor query (more: the next query pages on at once)


@dataclasses.dataclass(frozen=True)
class Idle:
    """Yielded when no sync is due: the caller may do deferred work (the glue evaluates checks) and come back."""

    backlog: int  # datasets changed and waiting for their commit window (none are due yet)


@dataclasses.dataclass(frozen=True)
class Stopped:
    """Yielded last when the loop ended before its deadline because the shard may be another run's now (its lock
    or its session to Postgres was lost): the caller says why; the supervisor starts the successor."""

    reason: str


def stream_sync_id(run_id: str, dataset_id: uuid.UUID, n: int) -> uuid.UUID:
    """The ``n``-th sync of a dataset by one stream run: a retry of that sync (a transient failure) reuses the id, so
    a commit that landed is found, not repeated; the next sync of the dataset gets a new one."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"lakehouse:stream:{run_id}:{dataset_id}:{n}")


def _xmin_now(conn: psycopg.Connection) -> int:
    return fetch_value(
        conn.execute("select pg_snapshot_xmin(pg_current_snapshot())::text::bigint"), "the snapshot's xmin"
    )


@dataclasses.dataclass
class _Due:
    at: float  # when its commit window closes (or its busy retry is due)
    seen: float  # when its oldest unsynced change was first seen
    req: Pending  # the newest version seen for it (a Retry when the sweep brought a failed one back)
    busy: int = 0  # busy retries so far (lock held elsewhere, backpressure)


Event = SyncResult | Failed | Idle | Maintained | Stopped | ReverseApplied | ReverseFailed


def stream_shard(dsn: str, catalog, settings: Settings, **kw) -> Generator[Event, None, None]:
    """``_stream`` (below) run in a thread of its own, its results handed over through a queue: the caller's work on
    each result (the glue writes two materializations to Dagster's event log, ≈ 0.1-0.3 s here) never holds up the
    next syncs; an Idle is handed over only when nothing else waits. Leaving the generator (the deadline, an
    interruption, a closed generator) stops the loop and waits for the syncs in flight to finish (each is one
    commit, recorded by itself)."""
    stop = kw.pop("stop", None) or threading.Event()
    handed: queue.Queue = queue.Queue()
    done = object()

    def run() -> None:
        try:
            for item in _stream(dsn, catalog, settings, stop=stop, **kw):
                if isinstance(item, Idle) and not handed.empty():
                    continue
                handed.put(item)
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            handed.put(_Raised(exc))
        finally:
            handed.put(done)

    thread = threading.Thread(target=run, name="mirror-stream", daemon=True)
    thread.start()
    try:
        while True:
            item = handed.get()
            if item is done:
                return
            if isinstance(item, _Raised):
                raise item.exc
            yield item
    finally:
        stop.set()
        thread.join()


@dataclasses.dataclass(frozen=True)
class _Raised:
    exc: BaseException


def _stream(  # noqa: C901
    dsn: str,
    catalog,
    settings: Settings,
    *,
    shard: int,
    shard_count: int,
    run_id: str,
    deadline: float,
    wait_until: float | None = None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    on_lease: Callable[[ShardLease], None] | None = None,
    stop: threading.Event | None = None,
    pace_log: list[tuple[str, uuid.UUID, float, float]] | None = None,
) -> Iterator[Event]:
    """Stream one shard until ``deadline`` (epoch seconds): yields each SyncResult as it lands, a Failed for a sync
    that failed (not retried here unless a retry may help at once: a busy lock, backpressure; the sweep asks again
    after the poller's backoff), an Idle whenever nothing is due, a Maintained when a background maintenance round
    (started in an idle moment) ended, a ReverseApplied / ReverseFailed for each reverse apply (``_Reverse``),
    and a Stopped last if the lease or the session was lost. Waits for the shard's lock until ``wait_until`` (default: the deadline) and returns at once if it never came. The sync in progress at the
    deadline finishes; nothing is cut. ``stop``: ends the loop early as the deadline would (tests, benches).
    ``pace_log``: gets ("started", dataset, now, now) as each sync is handed to a worker and ("landed", dataset, now,
    rested until) as each lands, on ``clock``: the pacing's own account (tests; no wall clock to compare).
    Interruptions propagate (each sync records what is true). Long on purpose: the lock wait, the coalescing
    window, the sync and its retry-at-once cases are one loop whose order is the exactly-once argument."""
    stop = stop or threading.Event()
    window = settings.stream.commit_window_ms / 1000.0
    poll = settings.stream.poll_ms / 1000.0
    mine = lambda ds: shard_of(ds, shard_count) == shard  # noqa: E731 - the shard's filter, passed to the poller
    with ShardLease(dsn, shard, shard_count, run_id, deadline) as lease:
        if not lease.acquire(until=wait_until if wait_until is not None else deadline, clock=clock):
            _log.info("shard %s/%s: its lock did not come before the deadline; nothing streamed", shard, shard_count)
            return
        if on_lease is not None:
            on_lease(lease)
        workers = max(1, settings.stream.workers)
        with (
            contextlib.closing(connect(dsn)) as conn,
            contextlib.closing(StreamMaintenance(dsn, catalog, settings, clock=clock)) as upkeep,
            IdlePool(keep=2 * workers) as pool,
            concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix=f"stream-{shard}") as executor,
        ):

            def sync(ds: uuid.UUID, sync_id: uuid.UUID) -> SyncResult:
                return sync_dataset(
                    dsn,
                    catalog,
                    settings,
                    ds,
                    sync_id=sync_id,
                    run_id=run_id,
                    lock_timeout_s=BUSY_LOCK_WAIT_S,
                    pool=pool,
                )

            flying: dict[concurrent.futures.Future, tuple[uuid.UUID, _Due]] = {}
            # Everything committed below this xid is visible to the first sweep; the cursor brings the rest.
            cursor = Cursor(_xmin_now(conn))
            due: dict[uuid.UUID, _Due] = {}
            synced: dict[uuid.UUID, int] = {}  # syncs concluded per dataset (the sync ids' counter)
            rest = _Rest(settings.stream.sync_share)  # when each dataset's next sync may start
            reverse = _Reverse(dsn, catalog, settings, mine, cursor.xid)  # native commits back to dataset_rows
            next_sweep = 0.0
            gone: str | None = None  # why the loop ends early: its session to Postgres was lost
            while lease.lost is None and gone is None and clock() < deadline and not stop.is_set():
                try:
                    ended = upkeep.finished()
                    if ended is not None:
                        yield ended
                    now = clock()
                    if now >= next_sweep:
                        behind = datasets_behind(
                            conn,
                            after_seconds=settings.mirror.retry_failed_after_seconds,
                            max_retries=settings.mirror.retry_failed_max,
                            limit=100_000,
                            keep=mine,
                        )
                        for p in [*behind.fresh, *behind.due]:
                            _note(due, p, now, 0.0)
                        reverse.sweep(conn, now)
                        next_sweep = now + SWEEP_EVERY_S
                    while True:  # page through everything changed since the cursor
                        before = cursor
                        pending, cursor, scanned = pending_syncs(conn, cursor, limit=PAGE)
                        for p in pending:
                            if mine(p.dataset_id):
                                _note(due, p, now, window)
                        if scanned < PAGE or cursor == before:
                            break
                    if reverse.poll(conn, now):  # more native commits than a page: the sweep finds them all
                        next_sweep = now
                    # A dataset is synced or reverse-applied by one worker at a time, never both at once
                    in_flight = {d for d, _ in flying.values()} | reverse.in_flight()
                    if upkeep.busy_with is not None:  # nor while a maintenance round holds it
                        in_flight.add(upkeep.busy_with)
                    ready = sorted(
                        (d for d, x in due.items() if rest.due_at(d, x.at) <= now and d not in in_flight),
                        key=lambda d: due[d].at,
                    )
                    reverse_ready = reverse.ready(now, in_flight)
                    lease.stats.backlog = len(due) + len(flying)
                    lease.stats.lag_seconds = round(max((now - x.seen for x in due.values()), default=0.0), 3)
                    if not ready and not flying and not reverse_ready and not reverse.flying:
                        upkeep.start(exclude=set(due) | set(reverse.due))  # a change waiting goes first
                        yield Idle(len(due))
                        nearest = min(
                            (rest.due_at(d, x.at) for d, x in due.items() if d not in in_flight), default=now + poll
                        )
                        at = reverse.nearest(in_flight)
                        nearest = nearest if at is None else min(nearest, at)
                        sleep(max(0.0, min(poll, nearest - clock())))
                        continue
                    # Reverse applies first (few, and a rollback waits on them), then syncs, as workers are free
                    for ds in reverse_ready[: max(0, workers - len(flying) - len(reverse.flying))]:
                        reverse.start(executor, ds)
                    for ds in ready:
                        if len(flying) + len(reverse.flying) >= workers:
                            break
                        if ds in reverse.in_flight():
                            continue
                        item = due.pop(ds)
                        sync_id = stream_sync_id(run_id, ds, synced.get(ds, 0))
                        flying[executor.submit(sync, ds, sync_id)] = (ds, item)
                        if pace_log is not None:
                            pace_log.append(("started", ds, now, now))
                    # Wait for a sync to land, at most a poll interval: changes keep being found meanwhile.
                    done, _ = concurrent.futures.wait(
                        [*flying, *reverse.flying], timeout=poll, return_when=concurrent.futures.FIRST_COMPLETED
                    )
                    for fut in done:
                        if fut in reverse.flying:
                            landed = reverse.outcome(fut, clock(), lease, shard)
                            if landed is not None:
                                yield landed
                            continue
                        ds, item = flying.pop(fut)
                        got = _outcome(fut, ds, item, due, synced, lease, conn, clock, shard)
                        if isinstance(got, SyncResult):
                            upkeep.synced(got)
                            landed_at = clock()
                            until = rest.synced(ds, got.seconds, landed_at)
                            if pace_log is not None:
                                pace_log.append(("landed", ds, landed_at, until))
                        if got is not None:
                            yield got
                except psycopg.OperationalError as exc:
                    # A restart, a failover or a dropped connection: the shard's lock went with the lease's session
                    # just as likely, so another run may own the shard now. End as a lost lease does (the syncs in
                    # flight finish or fail by themselves); the supervisor starts the successor once Postgres answers.
                    gone = f"its session to Postgres was lost ({type(exc).__name__}: {first_line(exc)})"
            # the deadline, a stop or a lost lease: the syncs in flight finish (each one is atomic), nothing new starts
            for fut in concurrent.futures.as_completed(list(reverse.flying)):
                landed = reverse.outcome(fut, clock(), lease, shard)
                if landed is not None:
                    yield landed
            for fut in concurrent.futures.as_completed(list(flying)):
                ds, item = flying.pop(fut)
                try:
                    got = _outcome(fut, ds, item, due, synced, lease, conn, clock, shard)
                except psycopg.OperationalError as exc:  # recording a failure on the lost session
                    gone = gone or f"its session to Postgres was lost ({type(exc).__name__}: {first_line(exc)})"
                    failure = fut.exception()
                    got = Failed(ds, failure) if isinstance(failure, LakehouseError) else None
                if got is not None:
                    yield got
            ended = upkeep.close()  # the round running, if any, ends (one or two commits)
            if ended is not None:
                yield ended
            reason = lease.lost or gone
            if reason is not None:
                _log.warning("shard %s/%s: stopping: %s", shard, shard_count, reason)
                yield Stopped(reason)


def _outcome(fut, ds, item: _Due, due, synced, lease: ShardLease, conn, clock, shard) -> SyncResult | Failed | None:
    """What a finished sync means for the loop: its result, a Failed, or None when it is tried again soon (a busy
    lock, backpressure, a transient failure: same sync id, so a commit that landed is found)."""
    try:
        r = fut.result()
    except (LockTimeout, Backpressure) as exc:
        # Another sync holds the dataset (a batch run, a CLI sync) or the G2 bound is reached: try again soon; a
        # change seen meanwhile keeps its place.
        item.busy += 1
        item.at = clock() + min(8.0, BUSY_RETRY_S * 2 ** (item.busy - 1))
        _merge(due, ds, item)
        _log.info("shard %s: dataset %s busy (%s); again in a moment", shard, ds, first_line(exc))
        return None
    except LakehouseError as exc:
        if is_transient(exc) and item.busy < 3:
            item.busy += 1
            item.at = clock() + BUSY_RETRY_S * 2 ** (item.busy - 1)
            _merge(due, ds, item)
            return None
        synced[ds] = synced.get(ds, 0) + 1
        lease.stats.failures += 1
        # Asked for and failed: the sweep asks again only after the poller's backoff, as for a batch run (what is
        # still due at the deadline is not recorded: the successor's sweep finds it at once).
        record_requests(conn, [item.req])
        return Failed(ds, exc)
    synced[ds] = synced.get(ds, 0) + 1
    seen = due.get(ds)
    if seen is not None and seen.req.rows_version <= r.source_version:
        del due[ds]  # noted again while in flight (the sweep), and this sync covered it
    lease.stats.syncs += 1
    lease.stats.last_commit_at = time.time()
    lease.stats.last_dataset_id = ds
    return r


def _merge(due: dict[uuid.UUID, _Due], ds: uuid.UUID, item: _Due) -> None:
    """Put a dataset tried too early back; a change seen while it was in flight keeps the newer version."""
    seen = due.get(ds)
    if seen is not None and seen.req.rows_version > item.req.rows_version:
        item.req = seen.req
    due[ds] = item


def _note(due: dict[uuid.UUID, _Due], p: Pending, now: float, window: float) -> None:
    """A change of ``p``'s dataset seen now: due when its window closes; a dataset already due keeps its time."""
    got = due.get(p.dataset_id)
    if got is None:
        due[p.dataset_id] = _Due(now + window, now, p)
    elif p.rows_version > got.req.rows_version:
        got.req = p
