"""DSN helpers for the commands that start things: the URL form Dagster needs, and a form fit to print.

(No ``register``: not a subcommand.)
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from lakehouse_dagster.core.db import redact
from lakehouse_dagster.core.errors import BadInput


def conninfo_to_url(dsn: str, dbname: str | None = None, *, what: str = "the DSN") -> str:
    """Any libpq DSN (URI or key=value) as a postgresql:// URL, optionally for another database.

    dagster-postgres hands ``postgres_url`` to SQLAlchemy (and psycopg2), which want the URL form; a Unix
    socket directory goes in the ``host`` query parameter.
    """
    try:
        params: dict[str, Any] = conninfo_to_dict(_strip_driver(dsn))
    except psycopg.ProgrammingError:
        # libpq's message can quote a piece of the string, which may be a password: say nothing of its content
        raise BadInput(
            f"{what} is not a valid Postgres DSN (expected postgresql://user:password@host:port/db or key=value pairs)"
        ) from None
    if dbname is not None:
        params["dbname"] = dbname
    user = params.pop("user", None)
    password = params.pop("password", None)
    host = params.pop("host", None)
    port = params.pop("port", None)
    db = params.pop("dbname", None) or user or ""
    netloc = ""
    if user:
        netloc = urllib.parse.quote(user, safe="")
        if password:
            netloc += ":" + urllib.parse.quote(password, safe="")
        netloc += "@"
    query: dict[str, str] = {}
    if host and (host.startswith("/") or "," in host):
        query["host"] = host
        if port:
            query["port"] = port
    elif host:
        netloc += f"[{host}]" if ":" in host else host
        if port:
            netloc += f":{port}"
    query.update(params)
    url = f"postgresql://{netloc}/{urllib.parse.quote(db, safe='')}"
    if query:
        url += "?" + urllib.parse.urlencode(query, safe="/", quote_via=urllib.parse.quote)
    return url


def dagster_url(dsn: str, dbname: str | None = None, *, what: str = "the DSN") -> str:
    """The URL for dagster.yaml's ``postgres_url``: SQLAlchemy with the psycopg2 driver, whatever was given.

    SQLAlchemy 2.1 maps a bare ``postgresql://`` to psycopg 3, which binds parameters on the server; every
    event dagster-postgres 0.29 stores runs ``NOTIFY run_events, :notify_id``, and Postgres refuses a
    parameter there ("syntax error at or near $1"). psycopg2 interpolates on the client, so it works.
    """
    return "postgresql+psycopg2" + conninfo_to_url(dsn, dbname, what=what)[len("postgresql") :]


def _strip_driver(dsn: str) -> str:
    """``postgresql+driver://`` (SQLAlchemy) → ``postgresql://`` (libpq)."""
    return re.sub(r"^postgres(?:ql)?\+[A-Za-z0-9_]+://", "postgresql://", dsn)


def display_dsn(dsn: str) -> str:
    """A DSN fit to print: URL form with the password masked (store.db.redact alone misses key=value DSNs)."""
    try:
        return redact(conninfo_to_url(dsn))
    except BadInput:
        return "<unparseable DSN>"
