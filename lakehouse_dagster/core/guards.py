"""Concurrency guards that hold across processes (Dagster runs are processes), built on Postgres
advisory locks held by a session: a killed process's locks vanish with its connection.

G1 (catalog commits serialised) is the catalog's own (the SqlCatalog's compare-and-swap, a REST server's
check of a commit's requirements); G4 (commit conflicts retry) lives in lake/writer.py. Here: G3, one
ingest per dataset at a time (blocking, queued), and G2, at most ``max_concurrent_ingest`` ingests at
once (non-blocking: a caller past the bound gets Backpressure and retries later — the runbook's healthy 503).

A session lock lasts as long as its session, and a session can die while its process lives on (server
restart, idle or TCP timeout, pg_terminate_backend). So the locks taken here are remembered for the
current context and ``check_held`` re-reads pg_locks for them right before a commit (lake/writer.py
calls it): a sync that lost its lock must not commit, since another sync may own the dataset now.
``guard_connection`` keeps the lock session alive meanwhile (TCP keepalives, no idle timeout).
"""

from __future__ import annotations

import contextlib
import contextvars
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg import sql

from lakehouse_dagster.core import locks
from lakehouse_dagster.core.db import close_quietly, connect, fetch_value, is_idle
from lakehouse_dagster.core.errors import Backpressure, GuardLost, LockTimeout

_NS_DATASET = locks.DATASET  # G3: (namespace, hash of dataset id)
_NS_ADMISSION = locks.ADMISSION  # G2: (namespace, slot number)
_NS_FIRST_NATIVE = locks.FIRST_NATIVE  # a first native write until its canary's verdict: (namespace, dataset)


# (connection, namespace, key, what) of every guard lock this context holds
_held: contextvars.ContextVar[tuple] = contextvars.ContextVar("lakehouse_guards_held", default=())

KEEPALIVE: dict[str, Any] = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3}


def guard_connection(dsn: str) -> psycopg.Connection:
    """A connection fit to hold advisory locks for a whole sync: TCP keepalives (a dead peer is noticed,
    an idle NAT/firewall entry is kept) and no server-side idle-session timeout."""
    conn = connect(dsn, **KEEPALIVE)
    conn.execute(
        "select case when current_setting('server_version_num')::int >= 140000"
        " then set_config('idle_session_timeout', '0', false) end"
    )  # the setting exists from PG 14
    return conn


@contextlib.contextmanager
def pooled_guard_connection(dsn: str, pool=None) -> Iterator[psycopg.Connection]:
    """``guard_connection``, reused across a batch's syncs when ``pool`` (store.db.IdlePool) is given. It goes
    back to the pool only after a sync that ended normally, with no transaction open and no advisory lock left
    on the session (every guard lock was released); otherwise it is closed, as without a pool, and its locks go
    with it. A pooled connection that no longer answers is replaced before use."""
    if pool is None:
        with guard_connection(dsn) as conn:
            yield conn
        return
    key = ("guard", dsn)
    conn, reused = pool.take_or_open(key, lambda: guard_connection(dsn))
    if reused:
        try:
            conn.execute("select 1")
        except psycopg.Error:
            close_quietly(conn)
            conn = guard_connection(dsn)
    try:
        yield conn
    except BaseException:
        close_quietly(conn)
        raise
    if _lock_free(conn):
        pool.give(key, conn)
    else:
        close_quietly(conn)


def _lock_free(conn: psycopg.Connection) -> bool:
    try:
        return is_idle(conn) and not fetch_value(
            conn.execute(
                "select exists(select 1 from pg_locks where locktype = 'advisory' and pid = pg_backend_pid())"
            ),
            "whether this session holds an advisory lock",
        )
    except psycopg.Error:
        return False


@contextlib.contextmanager
def _remember(conn: psycopg.Connection, ns: int, key: int, what: str) -> Iterator[None]:
    token = _held.set(_held.get() + ((conn, ns, key, what),))
    try:
        yield
    finally:
        _held.reset(token)


def check_held(left: str = "this sync's files are left to the next sync of the dataset", who: str = "sync") -> None:
    """Raise GuardLost unless every guard lock this context took is still held by its session. ``left``: what the
    caller leaves behind when it stands down, ``who``: what it is, for the one line the operator reads."""
    for conn, ns, key, what in _held.get():
        try:
            held = fetch_value(
                conn.execute(
                    "select exists(select 1 from pg_locks where locktype = 'advisory' and pid = pg_backend_pid()"
                    " and granted and objsubid = 2 and classid = %s::bigint::oid and objid = %s::bigint::oid)",
                    (ns & 0xFFFFFFFF, key & 0xFFFFFFFF),
                ),
                "whether this session still holds its guard lock",
            )
        except psycopg.Error as exc:
            if isinstance(exc, psycopg.OperationalError):  # dead or wedged (libpq may think a command still runs):
                conn.close()  # closed, its locks go with it and nobody rolls back on it later (see _unlock)
            raise GuardLost(
                f"the session holding {what} died ({type(exc).__name__}); not committing — another {who} may own "
                f"the dataset now; {left}"
            ) from exc
        if not held:
            raise GuardLost(f"{what} is no longer held by this {who}'s session; not committing")


def _dataset_key(dataset_id: uuid.UUID) -> int:
    return locks.dataset_key(dataset_id)  # a hash of the whole id (int4: advisory lock keys are int4 pairs)


def _lock_within(conn: psycopg.Connection, function: str, ns: int, key: int, timeout_s: float, why: str) -> None:
    """Take a session advisory lock (``function``: pg_advisory_lock or its _shared twin), waiting at most
    ``timeout_s``; LockTimeout (transient) saying ``why`` past it."""
    conn.execute("select set_config('lock_timeout', %s, false)", (f"{int(timeout_s * 1000)}ms",))
    try:
        conn.execute(sql.SQL("select {}(%s, %s)").format(sql.Identifier(function)), (ns, key))
    except psycopg.errors.LockNotAvailable:
        raise LockTimeout(why) from None
    finally:
        conn.execute("select set_config('lock_timeout', '0', false)")


@contextlib.contextmanager
def dataset_lock(conn: psycopg.Connection, dataset_id: uuid.UUID, *, timeout_s: float = 1800) -> Iterator[None]:
    """G3: same-dataset ingests serialise (a second waits for the first)."""
    key = _dataset_key(dataset_id)
    _lock_within(
        conn,
        "pg_advisory_lock",
        _NS_DATASET,
        key,
        timeout_s,
        f"dataset {dataset_id}: another sync of this dataset held the lock for over {timeout_s:.0f}s; "
        "check iceberg_sync_log for a wedged run",
    )
    try:
        with _remember(conn, _NS_DATASET, key, f"the dataset lock of {dataset_id} (G3)"):
            yield
    finally:
        _unlock(conn, _NS_DATASET, key)


@contextlib.contextmanager
def first_native_hold(
    conn: psycopg.Connection, dataset_id: uuid.UUID, *, waiting: bool = False, timeout_s: float = 1800
) -> Iterator[None]:
    """A write flip's first native sync holds this from before its write until its canary's verdict is recorded
    (and a MISMATCH rolled back); the reverse mirror takes it shared (``waiting``) before the dataset lock, so it
    never copies a snapshot whose verdict is pending into dataset_rows — the canary compares the snapshot with
    what Postgres held, and after a MISMATCH Postgres is the truth again. Both take it before G3 (no lock-order
    cycle); a session lock, so a process killed mid-flip frees it."""
    key = _dataset_key(dataset_id)
    _lock_within(
        conn,
        "pg_advisory_lock_shared" if waiting else "pg_advisory_lock",
        _NS_FIRST_NATIVE,
        key,
        timeout_s,
        f"dataset {dataset_id}: its first native sync's canary has not given its verdict yet (waited {timeout_s:g} s); "
        "the reverse mirror waits for it (a MISMATCH rolls the writer back and Postgres stays the truth)"
        if waiting
        else f"dataset {dataset_id}: another first native sync of it is under way (waited {timeout_s:g} s)",
    )
    try:
        yield
    finally:
        _unlock(conn, _NS_FIRST_NATIVE, key, shared=waiting)


def _unlock(conn: psycopg.Connection, ns: int, key: int, *, shared: bool = False) -> None:
    """Release, unless the session is already gone (its locks went with it). A session the unlock fails on is
    closed (which releases whatever it held): a connection reset can leave libpq thinking a command still runs
    without marking the connection broken, and the caller's ``with connect(...)`` would then roll back on it and
    log psycopg's `error ignored in rollback` warning beside the CLI's one line."""
    if conn.closed or conn.broken:
        return
    try:
        conn.execute(
            "select pg_advisory_unlock_shared(%s, %s)" if shared else "select pg_advisory_unlock(%s, %s)", (ns, key)
        )
    except psycopg.OperationalError:
        conn.close()  # the session died or is wedged: nothing is held any more


@contextlib.contextmanager
def admission_slot(conn: psycopg.Connection, max_concurrent: int) -> Iterator[int]:
    """G2: take one of ``max_concurrent`` slots or raise Backpressure at once."""
    for slot in range(max_concurrent):
        if fetch_value(
            conn.execute("select pg_try_advisory_lock(%s, %s)", (_NS_ADMISSION, slot)),
            "a try of an admission slot's lock",
        ):
            try:
                with _remember(conn, _NS_ADMISSION, slot, f"ingest slot {slot} (G2)"):
                    yield slot
            finally:
                _unlock(conn, _NS_ADMISSION, slot)
            return
    raise Backpressure(
        f"all {max_concurrent} ingest slots are busy (LAKEHOUSE_MAX_CONCURRENT_INGEST); retry later or raise the bound"
    )
