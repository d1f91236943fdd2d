"""What the steps of `lakehouse up` share: its own console line, an error's first line, a Postgres connection refused in
one line.
"""

from __future__ import annotations

import sys

import psycopg

from lakehouse_dagster.cli.dsn import display_dsn
from lakehouse_dagster.core.errors import LakehouseError


def _connect(dsn: str) -> psycopg.Connection:
    from lakehouse_dagster.core.db import (
        connect,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    try:
        return connect(dsn, connect_timeout=10)
    except psycopg.OperationalError as exc:
        raise LakehouseError(f"cannot connect to Postgres at {display_dsn(dsn)}: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _say(msg: str) -> None:
    print(f"lakehouse up: {msg}", file=sys.stderr, flush=True)
