"""What the service holds open between requests: Postgres connections, the flag resolver, the catalog, tables.

Everything here outlives a Postgres restart without a restart of the service: a pooled connection is checked
before it is lent (one ``select 1``) and replaced when dead; the flag resolver's connection is replaced when it
broke; the catalog's SQLAlchemy pool pings before use. ``probe`` (``/readyz``) exercises each of them, so a
ready answer means the next request finds every one working.

A network that goes silent (a partition, a failover that leaves the old address unanswered) must not pin a
read's slot until TCP gives up (~15 min): every session of the service has TCP keepalives and a
``tcp_user_timeout`` (``api_pg_dead_after_seconds``), and a ``statement_timeout`` by the kind of work it does —
reads and control requests in pools of their own (``api_read_statement_seconds``,
``api_control_statement_seconds``). An ingest's own sessions (sources/writers.py) get the keepalives through
``ingest_dsn``, and no statement timeout: G3's wait is bounded by its lock timeout, a large COPY by nothing else.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from lakehouse_dagster.api.flags import FlagResolver
from lakehouse_dagster.api.lake import load_catalog, load_dataset_table
from lakehouse_dagster.core.db import IdlePool, close_quietly, connect, is_idle
from lakehouse_dagster.core.settings import Settings

log = logging.getLogger("lakehouse_dagster.service")

APPLICATION_NAME = "lakehouse-serve"  # pg_stat_activity shows the service's sessions under this name
READ, CONTROL = "read", "control"  # kinds of work: each its own pool and statement timeout
_TABLES_KEPT = 256


def keepalive_params(dead_after_seconds: int) -> dict[str, int]:
    """libpq's TCP keepalives and user timeout for a peer found dead after about ``dead_after_seconds``: idle a
    third of it, then 3 probes in the next half; unacknowledged data for the whole of it."""
    idle = max(1, dead_after_seconds // 3)
    return {
        "keepalives": 1,
        "keepalives_idle": idle,
        "keepalives_interval": max(1, (dead_after_seconds - idle) // 6),
        "keepalives_count": 3,
        "tcp_user_timeout": dead_after_seconds * 1000,
    }


def with_params(dsn: str, params: dict[str, int]) -> str:
    """``dsn`` with libpq ``params`` added, in its own form (a URI stays a URI: the ADBC driver takes URIs)."""
    if "://" not in dsn:
        return make_conninfo(dsn, **params)
    given = conninfo_to_dict(dsn.replace("postgresql+psycopg://", "postgresql://"))
    extra = {k: v for k, v in params.items() if k not in given}
    if not extra:
        return dsn
    base, sep, fragment = dsn.partition("#")
    joined = "&".join(f"{k}={v}" for k, v in extra.items())
    return base + ("&" if "?" in base else "?") + joined + (sep + fragment)


class ServiceDb:
    """Connections lent per request (kept idle up to ``keep`` per kind of work), one shared flag resolver, the
    catalog, and the Iceberg tables last loaded (a table object serves every snapshot its metadata holds)."""

    def __init__(self, dsn: str, settings: Settings, *, keep: int = 16):
        self.dsn = dsn
        self.settings = settings
        self._keepalives: dict[str, Any] = keepalive_params(settings.service.pg_dead_after_seconds)
        self.ingest_dsn = with_params(dsn, self._keepalives)
        self._statement_ms = {
            READ: int(settings.service.read_statement_seconds * 1000),
            CONTROL: int(settings.service.control_statement_seconds * 1000),
        }
        self._pool = IdlePool(keep=keep)  # for the service's whole life (ServiceDb.close ends it)
        self._resolver_lock = threading.Lock()
        self._resolver: FlagResolver | None = None
        self._tables: collections.OrderedDict[uuid.UUID, object] = collections.OrderedDict()
        self._tables_lock = threading.Lock()
        self.catalog = load_catalog(settings, dsn)

    def _connect(self, kind: str = CONTROL) -> psycopg.Connection:
        return connect(
            self.dsn,
            connect_timeout=5,
            application_name=APPLICATION_NAME,
            options=f"-c statement_timeout={self._statement_ms[kind]}",
            **self._keepalives,
        )

    def take(self, kind: str = READ) -> psycopg.Connection:
        """An autocommit connection for ``kind`` of work that answered just now; give it back with ``give``."""
        conn, reused = self._pool.take_or_open(kind, lambda: self._connect(kind))
        if reused:
            try:
                conn.execute("select 1")
            except psycopg.Error:  # died while idle (a Postgres restart): a new one
                close_quietly(conn)
                conn = self._connect(kind)
        return conn

    def give(self, conn: psycopg.Connection, kind: str = READ) -> None:
        """Back to the pool when idle and clean, else closed (its session, transaction and snapshot go with it)."""
        if is_idle(conn):
            self._pool.give(kind, conn)
        else:
            close_quietly(conn)

    @contextlib.contextmanager
    def connection(self, kind: str = CONTROL) -> Iterator[psycopg.Connection]:
        conn = self.take(kind)
        try:
            yield conn
        except BaseException:
            close_quietly(conn)  # whatever failed may have left it mid-transaction
            raise
        self.give(conn, kind)

    def resolver(self) -> FlagResolver:
        """The shared flag resolver (its TTL cache and NOTIFY invalidation, as in every process); its connection
        is replaced when it broke."""
        with self._resolver_lock:
            if self._resolver is None:
                self._resolver = FlagResolver.from_settings(self._connect(), self.settings.flags)
            elif self._resolver.conn.closed or self._resolver.conn.broken:
                close_quietly(self._resolver.conn)
                self._resolver.conn = self._connect()
                self._resolver.clear()
            return self._resolver

    def table(self, dataset_id: uuid.UUID, snapshot_id: int | None):
        """The dataset's Iceberg table, loaded again only when the kept one does not hold ``snapshot_id``."""
        with self._tables_lock:
            table = self._tables.get(dataset_id)
            if table is not None:
                self._tables.move_to_end(dataset_id)
        if table is None or snapshot_id is None or table.snapshot_by_id(snapshot_id) is None:  # type: ignore[attr-defined]
            table = load_dataset_table(self.catalog, self.settings, dataset_id)
            with self._tables_lock:
                self._tables[dataset_id] = table
                while len(self._tables) > _TABLES_KEPT:
                    self._tables.popitem(last=False)
        return table

    def probe(self) -> dict[str, str]:
        """{part: "ok" | what failed} for Postgres (a lent connection and the resolver's) and the catalog."""
        out: dict[str, str] = {}
        try:
            with self.connection() as conn:
                conn.execute("select 1")
            resolver = self.resolver()
            try:
                resolver.conn.execute("select 1")
            except psycopg.Error:
                resolver = self.resolver()  # it is broken now: replaced
                resolver.conn.execute("select 1")
            out["postgres"] = "ok"
        except psycopg.Error as exc:
            out["postgres"] = f"unreachable ({type(exc).__name__})"
        try:
            self.catalog.list_namespaces()
            out["catalog"] = "ok"
        except Exception as exc:  # noqa: BLE001 - any failure means not ready; the type says which
            out["catalog"] = f"unreachable ({type(exc).__name__})"
        return out

    def close(self) -> None:
        self._pool.close()
        with self._resolver_lock:
            if self._resolver is not None:
                close_quietly(self._resolver.conn)
