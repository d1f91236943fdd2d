"""One exception family, so the CLI and the ops can print a one-line reason and pick an exit code.

The base ``LakehouseError`` (its ``exit_code``, ``transient`` and optional ``http_status``) and the errors every
layer raises live here; a capability's own are in its package's errors.py (lake/, lifecycle/, mirror/, parity/,
routing/, service/, sources/, tracking/: issue 45). They are translated at the edges only: the CLI's exit code,
the service's HTTP status (service/errors.py), the client's exception back (service/client.py). This module
imports nothing heavy: the CLI's ``--help`` loads it."""

import errno
import sys


class LakehouseError(Exception):
    """A refusal or failure with a message fit for an operator: what was wrong and what to do."""

    exit_code = 2
    transient: bool | None = None  # None: decided by the class (errors.is_transient); a retry may help when True


class BadInput(LakehouseError):
    """The caller asked for something invalid (unknown name, malformed uuid, mode above ceiling...)."""

    exit_code = 2


class NotFound(LakehouseError):
    exit_code = 3


class NothingToDo(BadInput):
    """The request is what already holds (a flip that would move nothing): nothing was written. A BadInput to a
    Dagster step, the rollout controller and the service (400), as before; the CLI prints it as one plain line and
    exits 0, so a script's loop over readers under `set -e` carries on (issue 44)."""

    exit_code = 0
    http_status = 400


class SyncFailed(LakehouseError):
    """A sync failed loudly; nothing was committed."""

    exit_code = 4


class ForeignCommit(SyncFailed):
    """A mirrored table holds a data change the project did not commit (another Iceberg engine's append, delete or
    overwrite: lake/foreign.py); the mirror neither keeps nor drops it silently. Nothing was committed."""

    transient = False  # the table stays as it is until an operator decides (a retry changes nothing)


class FlipRefused(LakehouseError):
    """A flag change would strand consumers or skip a runbook prerequisite (flags/gates.py); nothing written."""

    exit_code = 6


class ReadRefused(LakehouseError):
    """A read nothing can serve truthfully: the dataset is written iceberg-native (Postgres is stale for it)
    and Iceberg has nothing this reader can read (routing/read_router.py). Nothing was read."""

    exit_code = 6


class Backpressure(LakehouseError):
    """Admission bound (G2) reached: retry later. The CLI's analogue of the runbook's HTTP 503."""

    exit_code = 75  # EX_TEMPFAIL
    transient = True


class CommitOutcomeUnknown(SyncFailed):
    """A commit was attempted and neither landed nor was refused as far as we can tell (connection lost
    around the compare-and-swap, a REST CommitStateUnknown). Its files are left in place: the next sync
    of the dataset, holding the dataset lock, settles it (mirror/reaper.py). Transient."""

    transient = True


class LockTimeout(SyncFailed):
    """Another sync of the dataset held its lock (G3) past the wait. Transient: retry later."""

    transient = True


class GuardLost(SyncFailed):
    """The session holding a G2/G3 advisory lock died before the commit: another sync may now own the
    dataset, so this one must not commit. Transient: a retry takes the lock again."""

    transient = True


class DiskFull(SyncFailed):
    """The warehouse's filesystem said ENOSPC while a write put its files there; nothing was committed (the
    catalog's swap comes after every file a commit writes). Exit 75 and transient: the same sync lands once
    space is freed, and a retry before that fails the same way, committing nothing."""

    exit_code = 75  # EX_TEMPFAIL: try again, once there is room
    transient = True


class NoDatabase(NotFound):
    """No lakehouse database where this process looks (no DSN, and no embedded server runs under the home)."""


# Not operator refusals: RuntimeErrors on purpose, so no caller that catches a LakehouseError swallows them.
class FailpointError(RuntimeError):
    """Raised by a failpoint armed with ``:raise`` (core/failpoints.py)."""


class UntestedVersion(RuntimeError):
    """An installed version the private uses of core/private_apis.py were not tested with. Not an ImportError on
    purpose: code that treats a missing optional module as "not available" (a forkserver preload, a feature probe)
    must not swallow it."""


def no_space(exc: BaseException | None) -> OSError | None:
    """The ENOSPC OSError (pyarrow's and pyiceberg's file writes raise it with its errno) in ``exc`` or its
    causes and contexts, else None. Postgres' own disk full is a psycopg error (SQLSTATE 53100), not this."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def commit_outcome_unknown(exc: BaseException | None) -> CommitOutcomeUnknown | None:
    """The CommitOutcomeUnknown in ``exc`` or its causes and contexts, else None. Its files were kept for the next
    sync to settle, so the failure must be recorded unsettled even when another error raised while concluding
    (a cleanup in a ``finally`` on a session the same fault broke) is the one that reached the caller."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, CommitOutcomeUnknown):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


# Why a failure happened decides whether retrying can help. Bad data and bad input cannot be fixed by
# a retry (they fail at once); connections, object-store I/O, commit conflicts past their retries and
# lock timeouts can. Unknown errors are not retried: a bug fails loud instead of looping.
_TRANSIENT_NAMES = {
    "OperationalError",  # psycopg, SQLAlchemy and ADBC: connection lost, server restart, lock/statement timeout
    "InterfaceError",  # psycopg / SQLAlchemy: the connection is closed
    "DisconnectionError",  # SQLAlchemy pool
    "CommitFailedException",  # pyiceberg: a conflict past every commit retry
    "CommitStateUnknownException",  # pyiceberg REST
    "ServerError",  # pyiceberg REST 5xx
    "ServiceUnavailableError",
}


def is_transient(exc: BaseException | None) -> bool:
    """True when retrying the same operation later may succeed. Follows ``raise ... from`` causes."""
    seen = 0
    while exc is not None and seen < 10:
        flag = getattr(exc, "transient", None)
        if flag is not None:
            return bool(flag)
        if isinstance(exc, LakehouseError):
            return False  # BadInput, NotFound, a bad value, a schema type change: a retry changes nothing
        if isinstance(exc, OSError):  # I/O: object store 5xx, network, timeouts (pyarrow's IOError is OSError)
            return True
        if any(t.__name__ in _TRANSIENT_NAMES for t in type(exc).__mro__):
            return True
        exc, seen = exc.__cause__, seen + 1
    return False


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its class name when it has none): for one-line errors."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _causes(exc: BaseException | None, *, contexts: bool = False):
    """``exc`` and what it was raised from (SQLAlchemy's ``orig`` first; with ``contexts``, also what it was
    raised while handling), at most ten deep."""
    for _ in range(10):
        if exc is None:
            return
        yield exc
        exc = getattr(exc, "orig", None) or exc.__cause__ or (exc.__context__ if contexts else None)


def postgres_unreachable(exc: BaseException) -> str | None:
    """One line, not a traceback, when a session to Postgres could not be opened or was lost (a restart, a
    failover, a dropped or silent network: psycopg's OperationalError, the message's first line; also under
    SQLAlchemy's wrapper, the catalog's, which raises it from psycopg's; and the ADBC driver's, below); None else. The CLI exits 75 with it; a
    sensor's tick is skipped with it (dagster/defs/shared/outage.py)."""
    psycopg_mod = sys.modules.get("psycopg")  # imported already if a connect or a query raised it
    for seen in _causes(exc):
        if (psycopg_mod is not None and isinstance(seen, psycopg_mod.OperationalError)) or _adbc_session_lost(seen):
            return f"Postgres is unreachable or the session was lost ({first_line(seen)}); retry once it answers"
    return None


# SQLSTATEs of a session the server ended or would not open: connection exceptions (class 08), an administrator's
# or a crash's shutdown, a server still starting (57P01-57P03)
_SESSION_ENDED = ("08", "57P01", "57P02", "57P03")


def _adbc_session_lost(exc: BaseException) -> bool:
    """An ADBC PostgreSQL driver's error (the reverse apply's and the readers' binary COPY sessions) saying libpq
    could not open the session or lost it: status IO with no SQLSTATE (libpq's own, e.g. `server closed the
    connection unexpectedly`) or one of a session ended. Not its other IO errors: a query the server refused
    (a constraint, a bad value) carries that query's SQLSTATE, and a retry would not change it."""
    adbc = sys.modules.get("adbc_driver_manager")  # imported already if an ADBC session raised it
    if adbc is None or not isinstance(exc, adbc.OperationalError):
        return False
    if getattr(exc, "status_code", None) != adbc.AdbcStatusCode.IO:
        return False
    sqlstate = getattr(exc, "sqlstate", None)
    return sqlstate is None or sqlstate.startswith(_SESSION_ENDED)


def object_store_failing(exc: BaseException) -> str | None:
    """One line when the error is the object store's (pyarrow's S3 filesystem raises OSError "... AWS Error ...": a
    5xx, a timeout, a refused connection, past the SDK's retries: lake/storage.py), found in the exception or what
    it was raised from; None else. A sync failed this way committed nothing (mirror/sync.py)."""
    for seen in _causes(exc, contexts=True):
        if isinstance(seen, OSError) and "AWS Error" in str(seen):
            return (
                f"the object store is failing or unreachable ({first_line(exc)}); "
                "retry once it answers (check LAKEHOUSE_S3_ENDPOINT, the AWS credentials and the store's health)"
            )
    return None
