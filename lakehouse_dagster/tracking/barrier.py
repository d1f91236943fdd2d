"""Capture mode after-commit: change tracking is written after the commit, and stays exact for its readers.

In that mode the app's statement only takes ``pg_advisory_xact_lock_shared(uuid_hash_extended(dataset, 0))``
per dataset it wrote (migration 024), and the WAL consumer (tracking/capture/) writes rows_version,
max_row_index, rows_rewrite_version and the row-range records afterwards. Every reader of those columns goes
through ``read_tracking_consistently``: on entry it waits for the dataset's writers in flight (their locks go at
commit) and holds new ones (a new writer's rows stay uncommitted until it lets go), flushes the WAL and catches
the consumer up (``_wait_for_writers_and_catch_up``). Inside, the tracking columns cover exactly the committed
rows: a reader that pairs them with the rows of a snapshot (the sync's pin, the canary's, the maintained-digest
fill) pins inside; a reader deciding from the current version (the flip gates, a STRICT read, the freshness
check, a native write's recorded source version) reads inside, or lets go first (``Barrier.let_go``) when what it
does next may write a datasets row. The poller, which needs no exact answer (a write committing meanwhile is
seen by the next tick), calls ``catch_up_without_waiting``. In capture mode triggers each call is one query and
holds nothing.

Deadlock-free by construction: the consumer's lock is taken first, waiting while holding nothing; several
datasets are taken with try-locks, waiting for one only while holding no other; the consumer never waits for a
datasets row lock (an app transaction holding one may be waiting on our barrier): when one is locked, the
barrier lets go of everything and tries again. Nothing that may write a datasets row runs behind the barrier
(an app transaction may hold that row while it waits for our barrier). A fill lets its dataset's writers go once
its snapshot is taken. A reader frozen behind the barrier is ended by the server (``HOLD_IDLE_TIMEOUT_MS``).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterable, Iterator

import psycopg

from lakehouse_dagster.core.db import fetch_value
from lakehouse_dagster.tracking import capture
from lakehouse_dagster.tracking.capture import BarrierTimeout

TIMEOUT_S = 30.0  # how long a reader waits for a dataset's writers before it refuses to read the tracking
# A reader frozen while it holds a barrier (SIGSTOP, swapped out, a debugger) must not hold the app's writes for
# ever: while holding, its session is ended by the server after this long idle, which releases every lock.
HOLD_IDLE_TIMEOUT_MS = 5_000
_LOCK = "select pg_advisory_lock(uuid_hash_extended(%s::uuid, 0))"
_TRY = "select pg_try_advisory_lock(uuid_hash_extended(%s::uuid, 0))"
_UNLOCK = "select pg_advisory_unlock(uuid_hash_extended(%s::uuid, 0))"
_CONSUME = "select pg_advisory_lock(%s, %s)"


# The one test of the mode, as an SQL expression: readers put it in a query they run anyway (a pin, the
# freshness check), so capture mode triggers pays nothing for it.
MODE_IS_AFTER_COMMIT = capture.MODE_IS_AFTER_COMMIT


def mode_is_after_commit(conn: psycopg.Connection) -> bool:
    return bool(
        fetch_value(conn.execute("select " + MODE_IS_AFTER_COMMIT), "the capture mode (lakehouse_digest_capture)")
    )


class Barrier:
    """What ``read_tracking_consistently`` yields: true when the reader is behind the barrier. ``let_go``
    releases the datasets' writers early, once the caller's snapshot is taken (a fill that reads for seconds) or
    before it writes a datasets row."""

    def __init__(self, conn: psycopg.Connection | None, ids: list[uuid.UUID]):
        self._conn, self._ids = conn, ids

    def __bool__(self) -> bool:
        return self._conn is not None

    def let_go(self) -> None:
        if self._conn is not None and self._ids:
            _unlock_all(self._conn, self._ids)
            self._ids = []


@contextlib.contextmanager
def read_tracking_consistently(
    conn: psycopg.Connection,
    dataset_ids: Iterable[uuid.UUID | None],
    *,
    on_own_connection: bool = False,
    timeout_s: float = TIMEOUT_S,
) -> Iterator[Barrier]:
    """Inside, the tracking columns of these datasets match their committed rows (every write committed before
    entry is in them), and no write to them commits until exit (or ``Barrier.let_go``): read them, or pin a
    snapshot, here. Outside capture mode after-commit: one query, nothing held, a false Barrier.

    Where the barrier is held: on ``conn`` itself when it is autocommit and idle (its session's locks; a
    transaction begun inside may stay open past exit: bound its idle time yourself, see maintained._fill);
    otherwise, or with ``on_own_connection`` (the caller pins on ``conn`` inside: a connection of ours must hold
    it, with its idle time bounded through the block; the mode is read there too, nothing runs on ``conn``), on a
    connection of its own, closed at exit.
    ``conn`` in a transaction: READ COMMITTED sees the caught-up tracking in its next statements."""
    ids = sorted({d for d in dataset_ids if d is not None})
    if not ids or (not on_own_connection and not mode_is_after_commit(conn)):
        yield Barrier(None, [])
        return
    idle_here = conn.autocommit and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    if idle_here and not on_own_connection:
        with _held(conn, ids, timeout_s=timeout_s, dedicated=False) as b:
            yield b
        return
    with capture.sibling(conn) as holder:
        # on_own_connection: the mode is read there, so that ``conn`` (idle, e.g. about to begin a REPEATABLE
        # READ pin) runs nothing before the caller's first statement.
        if on_own_connection and not mode_is_after_commit(holder):
            yield Barrier(None, [])
            return
        with _held(holder, ids, timeout_s=timeout_s, dedicated=True) as b:
            yield b


def catch_up_without_waiting(conn: psycopg.Connection) -> dict | None:
    """The poller's: in capture mode after-commit it learns of writes from the consumer, so catch it up before a
    tick, waiting for no writer (a write committing meanwhile is seen by the next tick). None in triggers."""
    if not mode_is_after_commit(conn):
        return None
    return capture.catch_up(conn, row_lock_wait_s=0.2)


@contextlib.contextmanager
def _held(conn: psycopg.Connection, ids: list[uuid.UUID], *, timeout_s: float, dedicated: bool) -> Iterator[Barrier]:
    """The barrier on ``conn`` (autocommit, idle on entry). ``dedicated``: ``conn`` holds it and does nothing
    else, and is closed after: its idle timeout stays bounded through the block.

    Lock order: the consumer's lock first, waited for holding nothing (a fill or a long catch-up holds it for
    seconds, and the app's writers must not wait that long behind our barrier), then the barriers."""
    idle = _bound_idle(conn)
    try:
        _wait_for_writers_and_catch_up(conn, ids, time.monotonic() + timeout_s, timeout_s)
    finally:
        if not dedicated:  # before the block: a setting restored inside a transaction that rolls back comes back
            _restore_idle(conn, idle)
    b = Barrier(conn, ids)
    try:
        yield b
    finally:
        b.let_go()
        _unlock_consumer(conn)


def _wait_for_writers_and_catch_up(
    conn: psycopg.Connection, ids: list[uuid.UUID], deadline: float, timeout_s: float
) -> None:
    """The consumer's lock and every barrier, the consumer caught up; on failure nothing is held."""
    pause = 0.01
    while True:
        _wait_for(conn, _CONSUME, capture.CONSUME_LOCK, deadline, "the WAL consumer (or a digest fill)")
        try:
            _lock_all(conn, ids, deadline)
        except BaseException:
            _unlock_consumer(conn)
            raise
        try:
            capture.force_flush(conn)
            capture.catch_up(conn, row_lock_wait_s=0.2)
            return
        except capture.RowLocked:  # its holder may be an app writer waiting on our barrier: let go, retry
            _unlock_all(conn, ids)
            _unlock_consumer(conn)
            if time.monotonic() >= deadline:
                raise BarrierTimeout(
                    f"datasets row(s) of {_names(ids)} stayed locked by other transactions for "
                    f"{timeout_s:g} s while their change tracking was being applied: not read; "
                    "try again when the app's long transactions are done"
                ) from None
            time.sleep(pause)
            pause = min(pause * 2, 0.5)
        except BaseException:
            _unlock_all(conn, ids)
            _unlock_consumer(conn)
            raise


def _lock_all(conn: psycopg.Connection, ids: list[uuid.UUID], deadline: float) -> None:
    """Every barrier exclusive. Blocking waits happen holding none: an app transaction writing two datasets
    takes their shared locks in its own statement order, so waiting for one while holding another could close
    a cycle the app would lose."""
    while True:
        got: list[uuid.UUID] = []
        blocked = None
        for ds in ids:
            if fetch_value(conn.execute(_TRY, (ds,)), "a try of the dataset's barrier lock"):
                got.append(ds)
            else:
                blocked = ds
                break
        if blocked is None:
            return
        _unlock_all(conn, got)
        _wait_for(conn, _LOCK, (blocked,), deadline, f"the app's writers of dataset {blocked}")
        if len(ids) == 1:
            return  # _wait_for left it held
        _unlock_all(conn, [blocked])


def _wait_for(conn: psycopg.Connection, query: str, params: tuple, deadline: float, holder: str) -> None:
    """Take a session lock, waiting at most until ``deadline``."""
    remaining_ms = int((deadline - time.monotonic()) * 1000)
    refusal = BarrierTimeout(
        f"{holder} kept a lock for the barrier's whole timeout: the change tracking cannot be "
        "read exactly now; try again when the app's long transactions are done"
    )
    if remaining_ms <= 0:
        raise refusal
    previous = fetch_value(conn.execute("select current_setting('lock_timeout')"), "the session's lock_timeout")
    conn.execute("select set_config('lock_timeout', %s, false)", (str(remaining_ms),))
    try:
        conn.execute(query, params)
    except psycopg.errors.LockNotAvailable:
        raise refusal from None
    finally:
        conn.execute("select set_config('lock_timeout', %s, false)", (previous,))


def _bound_idle(conn: psycopg.Connection) -> dict:
    """Bound the session's idle time while it holds (autocommit: ended by the server after it, its locks
    released); returns what to restore."""
    try:
        previous = fetch_value(
            conn.execute("select current_setting('idle_session_timeout')"), "the session's idle_session_timeout"
        )
    except psycopg.errors.UndefinedObject:  # PostgreSQL 14+
        return {}
    conn.execute("select set_config('idle_session_timeout', %s, false)", (str(HOLD_IDLE_TIMEOUT_MS),))
    return {"idle_session_timeout": previous}


def _restore_idle(conn: psycopg.Connection, previous: dict | None) -> None:
    if not previous or conn.closed or conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
        return
    for name, value in previous.items():
        conn.execute("select set_config(%s, %s, false)", (name, value))
    previous.clear()


def _unlock_consumer(conn: psycopg.Connection) -> None:
    if conn.closed:
        return
    if conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
        conn.execute("rollback")
    conn.execute("select pg_advisory_unlock(%s, %s)", capture.CONSUME_LOCK)


def _unlock_all(conn: psycopg.Connection, ids: list[uuid.UUID]) -> None:
    if conn.closed or not ids:
        return
    if conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
        conn.execute("rollback")  # the block's transaction failed; a session lock outlives it, so end it here
    for ds in ids:
        conn.execute(_UNLOCK, (ds,))


def _names(ids: list[uuid.UUID]) -> str:
    return ", ".join(map(str, ids[:3])) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
