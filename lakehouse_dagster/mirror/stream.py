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
import hashlib
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Generator, Iterator

import psycopg

from lakehouse_dagster.core import locks
from lakehouse_dagster.core.db import IdlePool, close_quietly, connect, fetch_value
from lakehouse_dagster.core.errors import Backpressure, BadInput, LakehouseError, LockTimeout, first_line, is_transient
from lakehouse_dagster.core.guards import guard_connection
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.mirror import shards
from lakehouse_dagster.mirror.batch import BUSY_LOCK_WAIT_S, Failed
from lakehouse_dagster.mirror.poller import Cursor, Pending, datasets_behind, pending_syncs, record_requests
from lakehouse_dagster.mirror.reverse import (
    NOOP,
    CommitCursor,
    ReverseResult,
    apply_reverse,
    due_datasets,
    native_commits,
)
from lakehouse_dagster.mirror.stream_maintenance import Maintained, StreamMaintenance
from lakehouse_dagster.mirror.sync import SyncResult, sync_dataset

_log = logging.getLogger(__name__)

_NS_SHARD = locks.STREAM_SHARD  # advisory lock class of a stream shard: (namespace, shard_count << 16 | shard)
SWEEP_EVERY_S = 5.0  # how often a stream looks for datasets behind Postgres that the cursor did not bring
HEARTBEAT_EVERY_S = 1.0
PAGE = 1000  # changed datasets read per cursor query (more: the next query pages on at once)
BUSY_RETRY_S = 0.5  # a dataset another sync holds (or past the G2 bound) is tried again after this, doubling to 8 s


def shard_of(dataset_id: uuid.UUID, shard_count: int) -> int:
    """The shard of a dataset: a stable hash of its id's bytes (the same in every process and release), mod
    ``shard_count``. Hashed, not the id's leading bytes: time-ordered ids (v1, v7) would otherwise bunch up."""
    if shard_count <= 1:
        return 0
    return int.from_bytes(hashlib.blake2b(dataset_id.bytes, digest_size=8).digest(), "big") % shard_count


def check_shard(shard: int, shard_count: int) -> None:
    if shard_count < 1 or shard_count > 1024:
        raise BadInput(f"shard count {shard_count} is out of range; use 1 to 1024 (LAKEHOUSE_MIRROR_SHARDS)")
    if not 0 <= shard < shard_count:
        raise BadInput(f"shard {shard} is out of range for {shard_count} shards; use 0 to {shard_count - 1}")


def _lock_key(shard: int, shard_count: int) -> int:
    return (shard_count << 16) | shard


@dataclasses.dataclass(frozen=True)
class Idle:
    """Yielded when no sync is due: the caller may do deferred work (the glue evaluates checks) and come back."""

    backlog: int  # datasets changed and waiting for their commit window (none are due yet)


@dataclasses.dataclass(frozen=True)
class Stopped:
    """Yielded last when the loop ended before its deadline because the shard may be another run's now (its lock
    or its session to Postgres was lost): the caller says why; the supervisor starts the successor."""

    reason: str


@dataclasses.dataclass
class _Stats:
    syncs: int = 0
    failures: int = 0
    last_commit_at: float | None = None
    last_dataset_id: uuid.UUID | None = None
    backlog: int = 0
    lag_seconds: float = 0.0


class ShardLease:
    """The shard's lock and heartbeat row, on a connection of their own (TCP keepalives, no idle timeout). After
    ``acquire`` a thread beats the heartbeat every ``HEARTBEAT_EVERY_S`` and notices a lost lock (``lost``);
    ``close`` marks the row ended and releases the lock (closing the connection releases it too)."""

    def __init__(self, dsn: str, shard: int, shard_count: int, run_id: str, deadline: float):
        check_shard(shard, shard_count)
        self.dsn, self.shard, self.shard_count, self.run_id, self.deadline = dsn, shard, shard_count, run_id, deadline
        self.stats = _Stats()
        self.lost: str | None = None  # why the lease was lost (its session died, its lock gone)
        self._conn: psycopg.Connection | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._held = False

    def acquire(self, *, until: float, clock: Callable[[], float] = time.time, poll_s: float = 0.1) -> bool:
        """Wait for the shard's lock until ``until`` (the predecessor finishing its last commit); False if it never
        came. Polls with pg_try_advisory_lock so an interruption (a run termination) is never stuck in the server."""
        self._conn = guard_connection(self.dsn)
        key = _lock_key(self.shard, self.shard_count)
        while True:
            if fetch_value(
                self._conn.execute("select pg_try_advisory_lock(%s, %s)", (_NS_SHARD, key)), "the lock's answer"
            ):
                break
            if clock() >= until:
                return False
            time.sleep(poll_s)
        self._held = True
        self._beat(started=True)
        self._thread = threading.Thread(target=self._beating, name=f"stream-shard-{self.shard}-heartbeat", daemon=True)
        self._thread.start()
        return True

    def _beat(self, *, started: bool = False, ended: bool = False) -> None:
        assert self._conn is not None
        s = self.stats
        shards.record_beat(
            self._conn,
            {
                "count": self.shard_count,
                "shard": self.shard,
                "run": self.run_id,
                "deadline": self.deadline,
                "ended": ended,
                "started": started,
                "commit": s.last_commit_at,
                "last": s.last_dataset_id,
                "syncs": s.syncs,
                "failures": s.failures,
                "backlog": s.backlog,
                "lag": s.lag_seconds,
            },
        )

    def _still_held(self) -> bool:
        assert self._conn is not None
        return fetch_value(
            self._conn.execute(
                "select exists(select 1 from pg_locks where locktype = 'advisory' and pid = pg_backend_pid() and granted"
                " and objsubid = 2 and classid = %s::bigint::oid and objid = %s::bigint::oid)",
                (_NS_SHARD, _lock_key(self.shard, self.shard_count)),
            ),
            "the shard lock's state",
        )

    def _beating(self) -> None:
        while not self._stop.wait(HEARTBEAT_EVERY_S):
            try:
                if not self._still_held():
                    self.lost = "the shard's lock is no longer held by its session"
                    return
                self._beat()
            except psycopg.Error as exc:
                self.lost = f"the session holding the shard's lock died ({type(exc).__name__}: {first_line(exc)})"
                return

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        conn = self._conn
        if conn is None:
            return
        try:
            if self._held and self.lost is None:
                self._beat(ended=True)
                conn.execute("select pg_advisory_unlock(%s, %s)", (_NS_SHARD, _lock_key(self.shard, self.shard_count)))
        except psycopg.Error:
            pass  # the session is gone: so is its lock
        finally:
            self._conn = None
            close_quietly(conn)

    def __enter__(self) -> ShardLease:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


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


@dataclasses.dataclass(frozen=True)
class ReverseApplied:
    """A native commit (or several) of a dataset applied to dataset_rows by the reverse mirror (never a no-op)."""

    result: ReverseResult

    @property
    def dataset_id(self) -> uuid.UUID:
        return self.result.dataset_id


@dataclasses.dataclass(frozen=True)
class ReverseFailed:
    """A reverse apply that failed; tried again after ``retry_in`` seconds (LAKEHOUSE_RETRY_FAILED_AFTER_SECONDS,
    doubling per failure, at most an hour), not sooner. Nothing was half-applied (one transaction)."""

    dataset_id: uuid.UUID
    error: str  # one line, with the exception's type
    attempts: int
    retry_in: float


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


def _stream(  # noqa: C901 - the stream's main loop: each wake-up reason and its handling share the loop's state
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
    window = settings.mirror_commit_window_ms / 1000.0
    poll = settings.mirror_poll_ms / 1000.0
    mine = lambda ds: shard_of(ds, shard_count) == shard  # noqa: E731 - the shard's filter, passed to the poller
    with ShardLease(dsn, shard, shard_count, run_id, deadline) as lease:
        if not lease.acquire(until=wait_until if wait_until is not None else deadline, clock=clock):
            _log.info("shard %s/%s: its lock did not come before the deadline; nothing streamed", shard, shard_count)
            return
        if on_lease is not None:
            on_lease(lease)
        workers = max(1, settings.mirror_stream_workers)
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
            rest = _Rest(settings.mirror_sync_share)  # when each dataset's next sync may start
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
                            after_seconds=settings.retry_failed_after_seconds,
                            max_retries=settings.retry_failed_max,
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


class _Rest:
    """A dataset's syncs take at most ``share`` of the time (Settings.mirror_sync_share): after a sync of T seconds,
    its next one waits T × (1/share − 1). Cheap syncs are hardly delayed; a dataset written without pause whose
    syncs are heavy is synced at a batch run's pace instead of back to back, leaving the CPU to the live app."""

    def __init__(self, share: float):
        self._factor = 1.0 / share - 1.0
        self._until: dict[uuid.UUID, float] = {}

    def synced(self, ds: uuid.UUID, seconds: float, now: float) -> float:
        """Note a sync of ``seconds`` that landed at ``now``; when the dataset's next sync may start."""
        if self._factor <= 0:
            return now
        self._until[ds] = now + seconds * self._factor
        return self._until[ds]

    def due_at(self, ds: uuid.UUID, at: float) -> float:
        until = self._until.get(ds)
        if until is None:
            return at
        if until <= at:  # rested already: forgotten, so the map holds only the datasets resting now
            del self._until[ds]
            return at
        return until


REVERSE_BACKOFF_MAX_S = 3600.0  # a reverse apply that keeps failing is tried again at most this far apart


class _Reverse:
    """The stream's share of the reverse mirror (mirror/reverse.py) for its shard: which native datasets are due
    for an apply, the applies in flight, and the backoff of the failed ones.

    Found two ways: each poll, the native commits since the cursor (``native_commits``: one index scan of the sync
    log by transaction id, nothing read when nothing was committed), checked by ``due_datasets`` for the shard's
    datasets among them (three small queries, only when a native commit of the shard landed); and at each sweep,
    ``due_datasets`` over every native dataset of the shard (what was committed while no stream ran, a reverse
    turned on, a failure past its backoff). Exactly once rests on ``apply_reverse`` itself: rows and position in
    one transaction, a dataset already at its snapshot a no-op; the stream only decides when to ask."""

    def __init__(self, dsn: str, catalog, settings: Settings, mine: Callable[[uuid.UUID], bool], xid: int):
        self.dsn, self.catalog, self.settings, self.mine = dsn, catalog, settings, mine
        self.cursor = CommitCursor(xid)
        self.due: dict[uuid.UUID, float] = {}  # dataset -> when its apply may start
        self.busy: dict[uuid.UUID, int] = {}  # busy or transient retries of its pending apply
        self.failures: dict[uuid.UUID, int] = {}  # failed applies in a row
        self.until: dict[uuid.UUID, float] = {}  # not asked again before (a failure's backoff, a table not there yet)
        self.flying: dict[concurrent.futures.Future, uuid.UUID] = {}
        # A dataset's applies take at most LAKEHOUSE_MIRROR_SYNC_SHARE of the time, as its forward syncs do: a
        # dataset committed natively without pause is applied in batches (one apply takes every commit since the
        # last), leaving the CPU to the live app (bench/bench_reverse_app_writes.py)
        self.rest = _Rest(settings.mirror_sync_share)

    def _note(self, ds: uuid.UUID, now: float) -> None:
        if self.until.get(ds, 0.0) > now:
            return  # backing off: the sweep or a commit asks again only once it passed
        self.until.pop(ds, None)
        self.due.setdefault(ds, now)

    def sweep(self, conn: psycopg.Connection, now: float) -> None:
        for ds in due_datasets(conn, keep=self.mine):
            self._note(ds, now)

    def poll(self, conn: psycopg.Connection, now: float) -> bool:
        """The native commits since the cursor; True when the read was cut (the caller sweeps at once)."""
        found, self.cursor, cut = native_commits(conn, self.cursor)
        mine = [ds for ds in found if self.mine(ds)]
        if mine:
            for ds in due_datasets(conn, mine):
                self._note(ds, now)
        return cut

    def ready(self, now: float, busy: set[uuid.UUID]) -> list[uuid.UUID]:
        return sorted(
            (d for d, at in self.due.items() if self.rest.due_at(d, at) <= now and d not in busy),
            key=lambda d: self.due[d],
        )

    def nearest(self, busy: set[uuid.UUID]) -> float | None:
        return min((self.rest.due_at(d, at) for d, at in self.due.items() if d not in busy), default=None)

    def in_flight(self) -> set[uuid.UUID]:
        return set(self.flying.values())

    def start(self, executor: concurrent.futures.Executor, ds: uuid.UUID) -> None:
        del self.due[ds]
        fut = executor.submit(apply_reverse, self.dsn, self.catalog, self.settings, ds, lock_timeout_s=BUSY_LOCK_WAIT_S)
        self.flying[fut] = ds

    def outcome(
        self, fut: concurrent.futures.Future, now: float, lease: ShardLease, shard: int
    ) -> ReverseApplied | ReverseFailed | None:
        """What a finished apply means: its result (None for a no-op), a failure (backed off), or None when it is
        tried again soon (the dataset's lock held by a native write or a sync, a transient failure)."""
        ds = self.flying.pop(fut)
        try:
            r = fut.result()
        except (LockTimeout, Backpressure) as exc:
            n = self.busy[ds] = self.busy.get(ds, 0) + 1
            self.due[ds] = now + min(8.0, BUSY_RETRY_S * 2 ** (n - 1))
            _log.info("shard %s: reverse of dataset %s busy (%s); again in a moment", shard, ds, first_line(exc))
            return None
        except Exception as exc:  # noqa: BLE001 - a reverse apply never stops the stream's forward mirror
            n = self.busy.get(ds, 0)
            if is_transient(exc) and n < 3:
                self.busy[ds] = n + 1
                self.due[ds] = now + BUSY_RETRY_S * 2**n
                return None
            self.busy.pop(ds, None)
            attempts = self.failures[ds] = self.failures.get(ds, 0) + 1
            wait = min(REVERSE_BACKOFF_MAX_S, max(1, self.settings.retry_failed_after_seconds) * 2.0 ** (attempts - 1))
            self.until[ds] = now + wait
            lease.stats.failures += 1
            return ReverseFailed(ds, f"{type(exc).__name__}: {first_line(exc)}", attempts, wait)
        self.busy.pop(ds, None)
        self.failures.pop(ds, None)
        if r.how == NOOP:
            if r.snapshot_id is None:  # no table yet: the position is not written, so the sweep would ask each time
                self.until[ds] = now + max(1, self.settings.retry_failed_after_seconds)
            return None
        self.rest.synced(ds, r.seconds, now)
        lease.stats.last_commit_at = time.time()
        lease.stats.last_dataset_id = ds
        return ReverseApplied(r)


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
