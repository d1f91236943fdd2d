"""Connections to the project's Postgres."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import psycopg
from psycopg.conninfo import conninfo_to_dict

from lakehouse_dagster.core.embedded import embedded_running, start_embedded
from lakehouse_dagster.core.errors import LakehouseError, NoDatabase
from lakehouse_dagster.core.settings import ProjectSettings, Settings


def no_database_message(project: ProjectSettings) -> str:
    return (
        f"no lakehouse database at {project.home} (no embedded Postgres runs under {project.home / 'pg'} and "
        "LAKEHOUSE_PG_DSN is unset): start it with scripts/start, or set LAKEHOUSE_HOME to the home of the running "
        "stack"
    )


def resolve_dsn(settings: Settings) -> str:
    """The configured DSN, or the running embedded server's. Never starts one: a verb run in a terminal whose
    LAKEHOUSE_HOME is not the running stack's (issue 33) would otherwise init an empty server there, fail on its
    missing tables and leave it running; ``lakehouse up`` and ``lakehouse pg start`` start it (start_embedded)."""
    if settings.postgres.dsn:
        return settings.postgres.dsn
    pgdata = settings.project.home / "pg"
    if not embedded_running(pgdata):
        raise NoDatabase(no_database_message(settings.project))
    return start_embedded(pgdata)  # attaches: it runs, and is kept running (nothing stops it at our exit)


# A connect bounded unless the DSN or the caller says otherwise: libpq's default is to wait forever, so a network
# gone silent (a failover leaving the old address unanswered, a stalled proxy) hung every verb at its first
# connect. Applied to every session the project opens: psycopg here, ADBC (adbc_uri) and SQLAlchemy
# (sqlalchemy_url). The service uses a shorter one of its own (service/db.py).
CONNECT_TIMEOUT_SECONDS = 10
# And a peer that went silent after the connect (a partition mid-session) found dead in about a minute (idle 30 s,
# then 3 probes 10 s apart) instead of after the kernel's two hours idle (libpq's keepalives are on by default): the catalog's pooled SQLAlchemy sessions and a sync's lock
# session otherwise wait on it for good. Probes only ask the kernel on the other side: a long statement on a live
# server is never cut by them. libpq ignores them on a Unix socket. The service has tighter ones (service/db.py).
KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3}


def with_session_defaults(dsn: str, **given: object) -> str:
    """``dsn`` with the connect timeout and the keepalives above, each unless the DSN (or ``given``, the
    caller's own keyword arguments to the connect) sets it already."""
    for key, value in {"connect_timeout": CONNECT_TIMEOUT_SECONDS, **KEEPALIVES}.items():
        if key not in given:
            dsn = with_default_param(dsn, key, value)
    return dsn


def with_default_param(dsn: str, key: str, value: object) -> str:
    """``dsn`` with the libpq parameter ``key`` set to ``value`` unless it sets it already, in its own form (a URI
    stays a URI). A DSN libpq cannot parse is returned as it is: the connect that uses it says what is wrong."""
    try:
        given = conninfo_to_dict(re.sub(r"^postgres(ql)?\+\w+://", "postgresql://", dsn))
    except psycopg.Error:
        return dsn
    if key in given:
        return dsn
    if "://" not in dsn:
        return f"{dsn} {key}={value}".strip()
    base, sep, fragment = dsn.partition("#")
    return f"{base}{'&' if '?' in base else '?'}{key}={value}{sep}{fragment}"


def connect(dsn: str, *, autocommit: bool = True, **kwargs) -> psycopg.Connection:
    conn = psycopg.connect(with_session_defaults(dsn, **kwargs), autocommit=autocommit, **kwargs)
    conn.execute("set timezone to 'UTC'")
    return conn


class _Cursor(Protocol):
    def fetchone(self) -> tuple[Any, ...] | None: ...


def fetch_one(cur: _Cursor, what: str | LakehouseError) -> tuple[Any, ...]:
    """The row of a query that always returns one while the database is as this code expects (an aggregate,
    ``select f()``, ``show``, ``insert ... returning``, a one-row state table): the caller indexes it with no
    None check. No row means the database is not what the code expects (a row deleted by hand, a migration not
    applied), so this refuses naming what was missing rather than failing later on ``None[0]``. ``what`` may be
    the error to raise instead, when the row can go missing for a reason of its own (a dataset deleted meanwhile:
    NotFound). Works on a psycopg or a DuckDB cursor."""
    row = cur.fetchone()
    if row is None:
        if isinstance(what, LakehouseError):
            raise what
        raise LakehouseError(
            f"the database returned no row for {what}, where one is always expected: check that migrations are"
            " applied (`lakehouse db migrate`) and that nothing deleted the lakehouse's own rows, then retry"
        )
    return row


def fetch_value(cur: _Cursor, what: str | LakehouseError) -> Any:
    """The first column of ``fetch_one``: for ``select count(*)``, ``select now()``, ``... returning id``."""
    return fetch_one(cur, what)[0]


@contextmanager
def connection(dsn: str, *, autocommit: bool = True) -> Iterator[psycopg.Connection]:
    conn = connect(dsn, autocommit=autocommit)
    try:
        yield conn
    finally:
        conn.close()


class IdlePool:
    """Connections kept open between uses inside the scope of their owner, so that repeated short work pays a
    connect once: a mirror batch (mirror/batch.py: one connect per batch, not per dataset), or the service's whole
    life (service/db.py: its pool, keyed by kind of work). A user takes one (``take``), and gives it back
    (``give``) only when it left it idle and clean (no transaction, no pending result); anything else is closed
    by the user. A kept connection may have died while idle (a Postgres restart): a long-lived owner checks it
    before use (ServiceDb.take runs ``select 1``). At most ``keep`` idle connections per key; ``close`` closes
    them all and ends the scope. Thread-safe (the mirror's readers and the service's workers run in threads)."""

    def __init__(self, keep: int = 2):
        self.keep = keep
        self._idle: dict[object, list] = {}
        self._lock = threading.Lock()
        self._closed = False
        self.made = 0  # connections opened through ``take_or_open`` (tests and benchmarks read it)

    def take(self, key: object):
        with self._lock:
            idle = self._idle.get(key)
            return idle.pop() if idle else None

    def take_or_open(self, key: object, open_: Callable[[], Any]) -> tuple[Any, bool]:
        """(a connection, whether it was reused)."""
        got = self.take(key)
        if got is not None:
            return got, True
        with self._lock:
            self.made += 1
        return open_(), False

    def give(self, key: object, conn) -> None:
        with self._lock:
            idle = self._idle.setdefault(key, [])
            if not self._closed and len(idle) < self.keep:
                idle.append(conn)
                return
        close_quietly(conn)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle = [c for conns in self._idle.values() for c in conns]
            self._idle.clear()
        for c in idle:
            close_quietly(c)

    def __enter__(self) -> IdlePool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def is_idle(conn: psycopg.Connection) -> bool:
    """Open, not broken, no transaction open: fit to run a statement now, or to be reused or lent."""
    return not conn.closed and not conn.broken and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def close_quietly(conn) -> None:
    try:
        conn.close()
    except Exception:  # noqa: BLE001 - a connection that cannot even close is gone anyway
        pass


def sqlalchemy_url(dsn: str) -> str:
    """The same DSN for SQLAlchemy (pyiceberg's SqlCatalog) with the psycopg 3 driver."""
    if not dsn.startswith("postgresql+"):
        dsn = re.sub(r"^postgres(ql)?://", "postgresql+psycopg://", dsn)
    return with_session_defaults(dsn)


def redact(dsn: str) -> str:
    """A DSN fit for logs and metadata: the password is never shown."""
    if "://" in dsn:
        dsn = re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", dsn)  # user:password@
        return re.sub(r"([?&]password=)[^&]*", r"\1***", dsn)  # ?password=
    return re.sub(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", dsn)  # key=value form


def adbc_uri(dsn: str) -> str:
    """The DSN as the ADBC Postgres driver takes it (libpq's URI form, without SQLAlchemy's driver suffix)."""
    return with_session_defaults(dsn.replace("postgresql+psycopg://", "postgresql://"))
