"""Flag changes reach every process in under a second: a daemon thread per process and database LISTENs on the
channel the overrides' trigger NOTIFYs (migration 016_flag_notify) and drops the flag caches when told.

The TTL stays the guarantee: a resolve never waits for this thread, and while it is not listening (not connected
yet, connection dropped, reconnecting with backoff) caches simply expire after the TTL as before. Each
(re)connection drops the caches once, since a change made while nobody listened was not announced. The thread
has its own connection (a resolver's connection is shared with other work and only reads notifications when used).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from lakehouse_dagster.schema.names import FLAG_NOTIFY_CHANNEL

APPLICATION_NAME = "lakehouse-flag-listener"
MAX_BACKOFF_S = 10.0


class Listener:
    """Calls ``on_change(subscribers)`` on every notification; stops once no subscriber (resolver) is alive."""

    def __init__(self, conninfo: str, on_change: Callable[[list], None]) -> None:
        self._conninfo = conninfo
        self._on_change = on_change
        self.subscribers: weakref.WeakSet = weakref.WeakSet()
        self.pid = os.getpid()
        self.listening = threading.Event()  # set while LISTEN is active
        self.notifications = 0
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=APPLICATION_NAME, daemon=True)

    def stop(self) -> None:
        self._stop.set()

    def _changed(self) -> None:
        self._on_change(list(self.subscribers))

    def _wanted(self) -> bool:
        if not self.subscribers:
            with _lock:
                if not self.subscribers:  # nobody left to tell: end (a new resolver starts a new listener)
                    if _listeners.get(self._conninfo) is self:
                        del _listeners[self._conninfo]
                    self._stop.set()
        return not self._stop.is_set()

    def _run(self) -> None:
        backoff = 0.25
        while self._wanted():
            try:
                with psycopg.connect(
                    self._conninfo,
                    autocommit=True,
                    connect_timeout=5,
                    application_name=APPLICATION_NAME,
                    keepalives=1,
                    keepalives_idle=5,
                    keepalives_interval=2,
                    keepalives_count=3,
                ) as conn:
                    conn.execute(sql.SQL("listen {}").format(sql.Identifier(FLAG_NOTIFY_CHANNEL)))
                    self.connections += 1
                    self._changed()  # whatever was cached while nobody listened
                    self.listening.set()
                    backoff = 0.25
                    while self._wanted():
                        for _ in conn.notifies(timeout=1.0):  # returns at once on a notification
                            self.notifications += 1
                            self._changed()
            except Exception:  # a dropped connection, a server restart: fall back to the TTL, reconnect
                pass
            self.listening.clear()
            self._stop.wait(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)


_listeners: dict[str, Listener] = {}
_lock = threading.Lock()


def conninfo_of(conn: psycopg.Connection) -> str:
    """The connection string of ``conn`` (psycopg's info.dsn leaves the password out)."""
    password = conn.info.password
    return make_conninfo(conn.info.dsn, **({"password": password} if password else {}))


def subscribe(conn: psycopg.Connection, subscriber, on_change: Callable[[list], None]) -> Listener | None:
    """Tell ``subscriber`` (through ``on_change``) about flag changes in ``conn``'s database: the listener of this
    process for that database, started on first use (and again after a fork)."""
    try:
        conninfo = conninfo_of(conn)
    except Exception:  # a closed connection: nothing to listen with; the TTL applies
        return None
    with _lock:
        current = _listeners.get(conninfo)
        fresh = current is None or current.pid != os.getpid() or current._stop.is_set()
        if current is None or fresh:
            current = _listeners[conninfo] = Listener(conninfo, on_change)
        current.subscribers.add(subscriber)
        if fresh:
            current._thread.start()
        return current
