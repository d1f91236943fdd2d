"""A signal that arrives while DuckDB runs a query stays a signal (core/duckdb_signals.py).

DuckDB answers it by cancelling the query and raising RuntimeError('Query interrupted'): the exception the
signal's handler raised is dropped, and a caller that catches Exception (the canary's "could not see the data")
goes on as if no signal had come. That kept a stream run alive for 30 s after its code server's SIGTERM (issue 44,
test_deploy_topology). Each test sends the signal a second into a query that would run for minutes.
"""

from __future__ import annotations

import os
import signal
import threading

import duckdb
import pytest

from lakehouse_dagster.core import duckdb_signals

LONG = "select sum(i % 7) from range(20000000000) t(i)"  # minutes of work: the signal always lands inside it


class Interrupted(BaseException):
    """What Dagster's handler raises in a run (DagsterExecutionInterruptedError is a BaseException too)."""


@pytest.fixture
def handler():
    def raise_interrupted(signum, frame):
        raise Interrupted()

    previous = signal.signal(signal.SIGUSR1, raise_interrupted)
    yield
    signal.signal(signal.SIGUSR1, previous)


def _signal_in(seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGUSR1))
    timer.start()
    return timer


def test_duckdb_itself_turns_a_signal_into_an_ordinary_error(handler):
    """The hazard, as the installed DuckDB has it: if a DuckDB upgrade keeps the handler's exception, this fails and
    the wrapper can go."""
    con = duckdb.connect(config={"threads": 1})
    timer = _signal_in(1.0)
    with pytest.raises(RuntimeError, match="^Query interrupted$"):
        con.execute(LONG)
    timer.join()


@pytest.mark.parametrize("via_cursor", [False, True])
def test_a_signal_mid_query_is_raised_as_keyboardinterrupt_past_except_exception(handler, via_cursor):
    con = duckdb_signals.connect(1)
    if via_cursor:
        con = con.cursor()
    timer = _signal_in(1.0)
    caught = None
    with pytest.raises(KeyboardInterrupt):
        try:
            con.execute(LONG)
        except Exception as exc:  # what the canary does with an error: the signal must not end here
            caught = exc
    timer.join()
    assert caught is None
    assert con.execute("select 42").fetchall() == [(42,)]  # the connection still answers


def test_other_errors_and_the_connections_own_methods_are_untouched():
    con = duckdb_signals.connect()
    with pytest.raises(duckdb.Error, match="boom"):
        con.execute("select error('boom')")
    con.execute("create table t as select * from range(3) r(i)")
    assert con.execute("select count(*) from t").fetchone() == (3,)
    con.close()
