"""Connections to the project's Postgres."""

from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Iterator

import psycopg

from ..settings import Settings


def resolve_dsn(settings: Settings) -> str:
    """The configured DSN, or the embedded server's (started on demand) when none is configured."""
    if settings.pg_dsn:
        return settings.pg_dsn
    from .embedded import start_embedded

    return start_embedded(settings.home / "pg")


def connect(dsn: str, *, autocommit: bool = True, **kwargs) -> psycopg.Connection:
    conn = psycopg.connect(dsn, autocommit=autocommit, **kwargs)
    conn.execute("set timezone to 'UTC'")
    return conn


@contextmanager
def connection(dsn: str, *, autocommit: bool = True) -> Iterator[psycopg.Connection]:
    conn = connect(dsn, autocommit=autocommit)
    try:
        yield conn
    finally:
        conn.close()


def sqlalchemy_url(dsn: str) -> str:
    """The same DSN for SQLAlchemy (pyiceberg's SqlCatalog) with the psycopg 3 driver."""
    if dsn.startswith("postgresql+"):
        return dsn
    return re.sub(r"^postgres(ql)?://", "postgresql+psycopg://", dsn)


def redact(dsn: str) -> str:
    """A DSN fit for logs and metadata: the password is never shown."""
    if "://" in dsn:
        dsn = re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", dsn)  # user:password@
        return re.sub(r"([?&]password=)[^&]*", r"\1***", dsn)  # ?password=
    return re.sub(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", dsn)  # key=value form
