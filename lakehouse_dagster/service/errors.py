"""Refusals and failures as HTTP answers: a status and ``{"error": "<one line: what was wrong and what to do>"}``.

The status follows the CLI's exit code for the same error (core/errors.py), so the service and the CLI refuse
alike: bad input 400, not found 404, a flip gate or a refused read 409, backpressure (G2) 503 with
``Retry-After``, a failed sync 500. A class may name its own ``http_status`` (413, 408, 406, 502, 504). Anything
else is a bug: 500 with its type only — the stack goes to the service's log, never to the caller.

The service's own exceptions live here (issue 45), but two: ``NotAcceptable`` stays in encode.py, which the client
and the benches import without Starlette, and ``ServiceError`` in client.py, the client's side of this translation.
"""

from __future__ import annotations

import logging

import psycopg
from starlette.responses import JSONResponse

from lakehouse_dagster.core.errors import Backpressure, LakehouseError, first_line, is_transient

log = logging.getLogger("lakehouse_dagster.service")

RETRY_AFTER_SECONDS = 2  # what a 503 asks the caller to wait (G2 frees a slot when an ingest ends)
_BY_EXIT_CODE = {2: 400, 3: 404, 4: 500, 5: 500, 6: 409, 75: 503}


class PayloadTooLarge(LakehouseError):
    http_status = 413


class RequestTimeout(LakehouseError):
    http_status = 408


class IngestStillRunning(LakehouseError):
    """The answer took longer than the request bound; the ingest goes on and ends whole (committed or not). Said
    only of an ingest that started."""

    http_status = 504


class IngestRunning(LakehouseError):
    """An ingest of the same dataset still runs in this service (its request may have given up): refused at once,
    with no thread, session or lock wait queued behind it; retry after ``retry_after`` s."""

    http_status = 409
    transient = True

    def __init__(self, message: str, *, retry_after: int = RETRY_AFTER_SECONDS):
        super().__init__(message)
        self.retry_after = retry_after


class ServiceUnavailable(LakehouseError):
    """Postgres cannot be reached, or the service is shutting down: retry."""

    exit_code = 75
    http_status = 503


class IcebergReadFailed(LakehouseError):
    """The Iceberg read failed and the decision allowed no Postgres fallback (iceberg_only, or written
    iceberg-native). Nothing was sent."""

    exit_code = 5
    http_status = 502


def status_of(exc: BaseException) -> int:
    if isinstance(exc, LakehouseError):
        return getattr(exc, "http_status", None) or _BY_EXIT_CODE.get(exc.exit_code, 400)
    if isinstance(exc, psycopg.OperationalError):
        return 503
    return 500


def log_answer(where: str, status: int, message: str) -> None:
    """One line per refused or failed request, with the reason its caller was given: uvicorn's access line says only
    the status, and an operator reading the log must not have to reproduce the request to learn why."""
    log.info("%s%s (%d): %s", where, "refused" if status < 500 else "failed", status, message)


def error_response(exc: BaseException, where: str = "") -> JSONResponse:
    """The answer for ``exc``, logged in one line with the reason the caller is given (an unexpected one with its
    stack)."""
    given = exc
    if not isinstance(exc, LakehouseError) and _connection_lost(exc):
        log.warning("%sPostgres is unreachable: %s", where, first_line(exc))
        exc = ServiceUnavailable(
            f"Postgres is unreachable ({type(exc).__name__}); retry shortly — GET /readyz says when it is back"
        )
    elif not isinstance(exc, LakehouseError) and is_transient(exc):  # I/O: the object store, the network
        log.warning("%sa transient failure: %s: %s", where, type(exc).__name__, first_line(exc))
        exc = ServiceUnavailable(f"a transient failure ({type(exc).__name__}); retry shortly")
    status = status_of(exc)
    headers = {}
    if status == 503 or (isinstance(exc, LakehouseError) and is_transient(exc)):
        headers["Retry-After"] = str(getattr(exc, "retry_after", RETRY_AFTER_SECONDS))
    if isinstance(exc, LakehouseError):
        message = " ".join(str(exc).split()) or type(exc).__name__
        if exc is given:  # an outage or a transient failure was logged above, as it was found
            log_answer(where, status, message)
    else:
        log.exception("%sunexpected error", where, exc_info=exc)
        message = f"internal error ({type(exc).__name__}); the service's log has the details"
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _connection_lost(exc: BaseException) -> bool:
    """Postgres went away under psycopg, or under the catalog's SQLAlchemy pool (which wraps psycopg's error)."""
    seen = 0
    cur: BaseException | None = exc
    while cur is not None and seen < 10:
        if isinstance(cur, psycopg.OperationalError | psycopg.InterfaceError):
            return True
        if type(cur).__module__.startswith("sqlalchemy") and type(cur).__name__ in _SQLALCHEMY_LOST:
            return True
        cur, seen = cur.__cause__ or cur.__context__, seen + 1
    return False


_SQLALCHEMY_LOST = {"OperationalError", "InterfaceError", "DisconnectionError", "PendingRollbackError"}


def is_backpressure(exc: BaseException) -> bool:
    """G2 refused it (counted as ``503`` in ``lakehouse_ingest_requests``)."""
    return isinstance(exc, Backpressure)
