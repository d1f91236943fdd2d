"""DuckDB connections that do not lose a signal.

Why: DuckDB looks for signals while a query runs (``PyErr_CheckSignals``) and answers one by cancelling the query
and raising ``RuntimeError('Query interrupted')`` — the exception the signal's handler raised (KeyboardInterrupt on
Ctrl-C, Dagster's DagsterExecutionInterruptedError on a run's SIGTERM) is dropped. A caller that catches Exception
(the canary turns "could not see the data" into an ERROR verdict) then went on as if no signal had come: a stream
run checking a dataset ignored its code server's SIGTERM until the SIGKILL 30 s later (issue 44). A connection of
this module raises such an error again as KeyboardInterrupt, which no ``except Exception`` catches.
"""

from __future__ import annotations

from typing import Any

INTERRUPTED = "Query interrupted"  # DuckDB's message for a query it cancelled on a signal (duckdb 1.x, 2.0)


class InterruptibleConnection:
    """A DuckDB connection (or cursor) whose ``execute`` raises KeyboardInterrupt where DuckDB swallowed a signal;
    everything else is the connection's own."""

    def __init__(self, con: Any):
        self._con = con

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self._con.execute(*args, **kwargs)
        except RuntimeError as exc:
            if str(exc) != INTERRUPTED:
                raise
            raise KeyboardInterrupt("a signal arrived during a DuckDB query") from exc

    def cursor(self) -> InterruptibleConnection:
        return InterruptibleConnection(self._con.cursor())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._con, name)


def connect(threads: int | None = None) -> InterruptibleConnection:
    """A new in-memory DuckDB database (``threads``: its worker threads, None for DuckDB's default)."""
    import duckdb  # lazy: DuckDB (~0.3 s to import) only where a query runs

    return InterruptibleConnection(duckdb.connect(config={"threads": threads} if threads else {}))
