"""The SQL catalog's connection pool replaces a connection whose pre-ping fails, whatever the error.

SQLAlchemy's psycopg ping restores autocommit in a ``finally``; a connection reset in the middle of the ping makes
that step raise a ProgrammingError ("can't change 'autocommit' now: connection in transaction status ACTIVE")
that hides the disconnect. Reproduced in CI by a TcpProxy reset inside a commit (test_infra_faults): the pool
raised it and the commit failed with its outcome unknown. Here the ping fails that way once, deterministically."""

from __future__ import annotations

import psycopg

from lakehouse_dagster.lake.catalog import load_catalog


def test_a_ping_that_fails_with_a_masked_disconnect_reconnects_instead_of_failing_the_call(settings, dsn):
    catalog = load_catalog(settings, dsn)
    catalog.create_namespace_if_not_exists("pool_probe")
    assert ("pool_probe",) in catalog.list_namespaces()  # a pooled connection, pinged on its next checkout
    dialect = catalog.engine.dialect
    real_ping = dialect.do_ping
    calls = []

    def ping_reset_midway(dbapi_connection):
        calls.append(dbapi_connection)
        if len(calls) == 1:
            raise psycopg.ProgrammingError("can't change 'autocommit' now: connection in transaction status ACTIVE")
        return real_ping(dbapi_connection)

    dialect.do_ping = ping_reset_midway
    try:
        assert ("pool_probe",) in catalog.list_namespaces()  # answered on a new connection
    finally:
        dialect.do_ping = real_ping
    assert len(calls) == 1  # the failed ping's connection was replaced (a fresh one is not pinged)
