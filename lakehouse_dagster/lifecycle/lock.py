"""The lifecycle lock: one lock under which every verb moves a dataset and every write checks its authority.

Two levels of transaction-scoped advisory locks (core/locks.py), as a database's intention locks: a verb over one
dataset takes every dataset's lock shared and its own exclusive; a verb over a workspace or every dataset takes
every dataset's lock exclusive; a write takes both shared, so writes of one dataset run side by side and wait only
for a verb that moves it. Held until the transaction ends: the transition and its effects commit together.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import psycopg
from psycopg import sql

from lakehouse_dagster.core import locks
from lakehouse_dagster.lifecycle import store

_XACT = "select pg_advisory_xact_lock(%s, %s)"
_XACT_SHARED = "select pg_advisory_xact_lock_shared(%s, %s)"


def lock_dataset(conn: psycopg.Connection, dataset_id: uuid.UUID) -> None:
    """A verb over one dataset."""
    conn.execute(_XACT_SHARED, (locks.LIFECYCLE_ALL, 0))
    conn.execute(_XACT, (locks.LIFECYCLE, locks.dataset_key(dataset_id)))


def lock_every_dataset(conn: psycopg.Connection) -> None:
    """A verb over a workspace or every dataset (its datasets are not known before the lock: a dataset may move
    into the workspace meanwhile)."""
    conn.execute(_XACT, (locks.LIFECYCLE_ALL, 0))


def write_lock_statements(dataset_id: uuid.UUID) -> list[sql.Composed]:
    """The statements a write runs first in its own transaction (any driver: values as literals): both locks
    shared, then the stored state it checks (``authority.check_authority``)."""
    lock = sql.SQL("select pg_advisory_xact_lock_shared({}, {})")
    return [
        lock.format(sql.Literal(locks.LIFECYCLE_ALL), sql.Literal(0)),
        lock.format(sql.Literal(locks.LIFECYCLE), sql.Literal(locks.dataset_key(dataset_id))),
        store.state_statement(dataset_id),
    ]


@contextlib.contextmanager
def write_hold(conn: psycopg.Connection, dataset_id: uuid.UUID) -> Iterator[None]:
    """Both locks shared for a write that is no Postgres transaction (a native write: until its Iceberg commit has
    landed and been recorded), on the write's session; released at the end, or with the session if it dies."""
    keys = [(locks.LIFECYCLE_ALL, 0), (locks.LIFECYCLE, locks.dataset_key(dataset_id))]
    for ns, key in keys:
        conn.execute("select pg_advisory_lock_shared(%s, %s)", (ns, key))
    try:
        yield
    finally:
        if not (conn.closed or conn.broken):
            try:
                for ns, key in reversed(keys):
                    conn.execute("select pg_advisory_unlock_shared(%s, %s)", (ns, key))
            except psycopg.OperationalError:
                conn.close()  # dead or wedged: its locks went with it
