"""Dagster's Postgres event storage, with its connections kept while a mirror batch logs its events.

dagster-postgres opens its engine with ``NullPool``: every stored event opens and closes about three
Postgres connections (the event row, its asset index, its check index), a connection each time being a
new server process. A mirror batch stores five events per dataset (two materializations, three check
evaluations), so most of an event's cost was connecting (measured: ~15 connections per dataset).

``pooled_event_writes`` swaps the storage's engine, for the duration of a run in a warm launcher's worker
(launcher/run_worker.py) or of the mirror batch op (any launcher, ``materialize``), for one on the same
URL that keeps two connections (plus two more under concurrent use) and checks one before use
(``pool_pre_ping``). What is stored, and where, does not change: the same statements run on the same
database, in autocommit as before. Anything other than dagster-postgres' storage with its default
NullPool engine (the webserver's pooled engine, a token-auth provider, SQLite, an ephemeral instance) is
left as it is. dagster-postgres keeps its engine in the private ``_engine`` attribute (reached through
core/private_apis.py, which refuses an untested dagster-postgres): a Dagster upgrade must re-run test_batch_cost.py, which checks both that the events are stored and that the connections
are not opened per event.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from lakehouse_dagster.core import private_apis

_log = logging.getLogger(__name__)


@contextlib.contextmanager
def pooled_event_writes(instance) -> Iterator[bool]:
    """Within the block, the instance's Postgres event storage reuses its connections; yields whether it
    does (False: left as it was)."""
    storage = getattr(instance, "event_log_storage", None)
    engine = private_apis.event_log_engine(storage)
    if not _swappable(storage, engine):
        yield False
        return
    import sqlalchemy  # lazy: Dagster's storage classes only in a run worker, after the fork

    # Two kept: storing a materialization checks out a second connection while it holds the first (its asset index
    # transaction asks whether a table exists); with one, that second connection was opened and closed every time.
    pooled = sqlalchemy.create_engine(
        engine.url, isolation_level="AUTOCOMMIT", pool_size=2, max_overflow=2, pool_pre_ping=True
    )
    private_apis.set_event_log_engine(storage, pooled)
    try:
        yield True
    finally:
        if private_apis.event_log_engine(storage) is pooled:
            private_apis.set_event_log_engine(storage, engine)
        pooled.dispose()


def _swappable(storage, engine) -> bool:
    try:
        from dagster_postgres.event_log.event_log import (
            PostgresEventLogStorage,
        )  # lazy: Dagster's storage classes only in a run worker, after the fork
        from sqlalchemy.engine import Engine  # lazy: Dagster's storage classes only in a run worker, after the fork
        from sqlalchemy.pool import NullPool  # lazy: Dagster's storage classes only in a run worker, after the fork
    except ImportError:
        return False
    return (
        isinstance(storage, PostgresEventLogStorage)
        and isinstance(engine, Engine)
        and isinstance(engine.pool, NullPool)
        and private_apis.event_log_token_provider(storage) is None  # token auth hooks connect: not copied
    )
