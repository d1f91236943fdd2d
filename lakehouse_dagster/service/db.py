"""What the service holds open between requests: Postgres connections, the flag resolver, the catalog, tables.

Everything here outlives a Postgres restart without a restart of the service: a pooled connection is checked
before it is lent (one ``select 1``) and replaced when dead; the flag resolver's connection is replaced when it
broke; the catalog's SQLAlchemy pool pings before use. ``probe`` (``/readyz``) exercises each of them, so a
ready answer means the next request finds every one working.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import uuid
from collections.abc import Iterator

import psycopg

from lakehouse_dagster.core.db import IdlePool, close_quietly, connect, is_idle
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.flags.resolver import FlagResolver
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.lake.reader import load_dataset_table

log = logging.getLogger("lakehouse_dagster.service")

APPLICATION_NAME = "lakehouse-serve"  # pg_stat_activity shows the service's sessions under this name
_POOL_KEY = "service"
_TABLES_KEPT = 256


class ServiceDb:
    """Connections lent per request (kept idle up to ``keep``), one shared flag resolver, the catalog, and the
    Iceberg tables last loaded (a table object serves every snapshot its metadata holds)."""

    def __init__(self, dsn: str, settings: Settings, *, keep: int = 16):
        self.dsn = dsn
        self.settings = settings
        self._pool = IdlePool(keep=keep)
        self._resolver_lock = threading.Lock()
        self._resolver: FlagResolver | None = None
        self._tables: collections.OrderedDict[uuid.UUID, object] = collections.OrderedDict()
        self._tables_lock = threading.Lock()
        self.catalog = load_catalog(settings, dsn)

    def _connect(self) -> psycopg.Connection:
        return connect(self.dsn, connect_timeout=5, application_name=APPLICATION_NAME)

    def take(self) -> psycopg.Connection:
        """An autocommit connection that answered just now; give it back with ``give``."""
        conn, reused = self._pool.take_or_open(_POOL_KEY, self._connect)
        if reused:
            try:
                conn.execute("select 1")
            except psycopg.Error:  # died while idle (a Postgres restart): a new one
                close_quietly(conn)
                conn = self._connect()
        return conn

    def give(self, conn: psycopg.Connection) -> None:
        """Back to the pool when idle and clean, else closed (its session, transaction and snapshot go with it)."""
        if is_idle(conn):
            self._pool.give(_POOL_KEY, conn)
        else:
            close_quietly(conn)

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        conn = self.take()
        try:
            yield conn
        except BaseException:
            close_quietly(conn)  # whatever failed may have left it mid-transaction
            raise
        self.give(conn)

    def resolver(self) -> FlagResolver:
        """The shared flag resolver (its TTL cache and NOTIFY invalidation, as in every process); its connection
        is replaced when it broke."""
        with self._resolver_lock:
            if self._resolver is None:
                self._resolver = FlagResolver.from_settings(self._connect(), self.settings)
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
