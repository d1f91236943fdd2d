"""A hook between two statements of one connection, to drive a race with Postgres deterministically: after the
first statement that mentions ``marker`` has run on ``conn``, ``hook`` runs once, before the next statement is sent
(if the code under test sends one). Nothing is faked: every statement still goes to the real server."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg


@contextmanager
def after_statement(conn: psycopg.Connection, marker: str, hook: Callable[[], None]) -> Iterator[dict]:
    """While inside, ``hook`` runs before the statement that follows the first one containing ``marker``. The
    yielded dict says whether it ran (``state["ran"]``); the caller runs it itself afterwards when it did not."""
    state = {"armed": False, "ran": False}

    class Hooked(psycopg.Cursor):
        def execute(self, query, params=None, **kwargs):  # type: ignore[override]
            if state["armed"] and not state["ran"]:
                state["ran"] = True
                hook()
            result = super().execute(query, params, **kwargs)
            text = query.as_string(conn) if hasattr(query, "as_string") else str(query)
            if marker in text and not state["ran"]:
                state["armed"] = True
            return result

    before = conn.cursor_factory
    conn.cursor_factory = Hooked
    try:
        yield state
    finally:
        conn.cursor_factory = before
