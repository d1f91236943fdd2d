"""Databases for tests and benches on one Postgres server."""

from __future__ import annotations

import queue
import re
import threading
import uuid

import psycopg
from psycopg import sql


def with_db(dsn: str, db: str) -> str:
    """``dsn`` with its database replaced by ``db``."""
    # Both URI forms the project produces: postgresql://user:@/db?host=... and postgresql://u:p@h:port/db
    return re.sub(r"^(postgres(?:ql)?://[^/]*/)([^?]*)", lambda m: m.group(1) + db, dsn, count=1)


class DatabasePool:
    """Fresh databases cloned from ``template`` ahead of the tests that take them, and dropped behind them, by two
    threads: a clone costs 0.1-0.5 s of the server's time (it copies the template's ~9 MB), which then overlaps the
    previous test instead of adding to each test's setup. ``take`` never waits on the threads: with none ready (or the
    threads failing) it clones one itself, as the fixture did before."""

    def __init__(self, admin_dsn: str, template: str, ahead: int = 2):
        self._admin = admin_dsn
        self._template = template
        self._ready: queue.Queue[str] = queue.Queue(maxsize=ahead)
        self._doomed: queue.Queue[str | None] = queue.Queue()
        self._closed = threading.Event()
        self._threads = [
            threading.Thread(target=self._keep_ready, name="db-pool-clone", daemon=True),
            threading.Thread(target=self._drop_behind, name="db-pool-drop", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def take(self) -> str:
        """The name of a fresh database, this caller's to use and to ``give_back``."""
        try:
            return self._ready.get_nowait()
        except queue.Empty:
            return self._clone()

    def give_back(self, name: str) -> None:
        self._doomed.put(name)

    def close(self) -> None:
        """Stop both threads and drop every database still held (ready or waiting to be dropped)."""
        self._closed.set()
        self._doomed.put(None)
        for t in self._threads:
            t.join(timeout=120)
        while not self._ready.empty():
            self._drop(self._ready.get_nowait())

    def _clone(self) -> str:
        name = f"t_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(self._admin, autocommit=True) as admin:
            admin.execute(
                sql.SQL("create database {} template {}").format(sql.Identifier(name), sql.Identifier(self._template))
            )
        return name

    def _drop(self, name: str) -> None:
        with psycopg.connect(self._admin, autocommit=True) as admin:
            # A test that left capture mode "after-commit" on (tracking/capture.py) leaves a slot, which blocks the drop.
            admin.execute(
                "select pg_drop_replication_slot(slot_name) from pg_replication_slots where database = %s", (name,)
            )
            admin.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(name)))

    def _keep_ready(self) -> None:
        while not self._closed.is_set():
            try:
                name = self._clone()
            except psycopg.Error:  # the server going away at the session's end, or busy: take() clones itself
                self._closed.wait(1.0)
                continue
            while not self._closed.is_set():
                try:
                    self._ready.put(name, timeout=0.5)
                    break
                except queue.Full:
                    continue
            else:
                self._drop(name)

    def _drop_behind(self) -> None:
        while (name := self._doomed.get()) is not None:
            try:
                self._drop(name)
            except psycopg.Error:  # left on a throwaway server; the next session's is a new one
                continue
        while not self._doomed.empty():  # given back after close() began
            if (name := self._doomed.get_nowait()) is not None:
                try:
                    self._drop(name)
                except psycopg.Error:
                    continue
