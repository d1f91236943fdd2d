"""What every subcommand shares: --json, one-line errors, and a lazily opened context."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import uuid
from collections.abc import Callable
from datetime import date, datetime
from typing import TYPE_CHECKING, Any, Protocol

from lakehouse_dagster.core.settings import Settings

if TYPE_CHECKING:  # the verbs' machinery is imported lazily (a fast --help)
    import psycopg
    from pyiceberg.catalog import Catalog


class ArgumentParser(argparse.ArgumentParser):
    """Bad usage exits 2 with one line: what was wrong and where to look."""

    def error(self, message: str):  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def json_parent() -> ArgumentParser:
    p = ArgumentParser(add_help=False)
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    return p


class Subcommands(Protocol):
    """What ``ArgumentParser.add_subparsers()`` returns (argparse keeps its class private)."""

    def add_parser(self, name: str, **kw: Any) -> ArgumentParser: ...


def add_command(
    sub: Subcommands, name: str, func: Callable[[Context, argparse.Namespace], Result], **kw
) -> ArgumentParser:
    p = sub.add_parser(name, parents=[json_parent()], **kw)
    p.set_defaults(func=func)
    return p


@dataclasses.dataclass
class Result:
    """A command's outcome: data for --json, text for people, and the exit code."""

    data: Any
    text: str = ""
    exit_code: int = 0


class Context:
    """Opens the settings, Postgres connection and catalog only when a command asks for them."""

    def __init__(self) -> None:
        self._settings: Settings | None = None
        self._dsn: str | None = None
        self._conn: psycopg.Connection | None = None
        self._catalog: Catalog | None = None

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = Settings.from_env()
        return self._settings

    @property
    def dsn(self) -> str:
        if self._dsn is None:
            from lakehouse_dagster.core.db import (
                resolve_dsn,
            )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

            self._dsn = resolve_dsn(self.settings)
        return self._dsn

    @property
    def conn(self):
        if self._conn is None:
            from lakehouse_dagster.core.db import (
                connect,
            )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

            self._conn = connect(self.dsn)
        return self._conn

    @property
    def catalog(self):
        if self._catalog is None:
            from lakehouse_dagster.lake.catalog import (
                load_catalog,
            )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

            self._catalog = load_catalog(self.settings, self.dsn)
        return self._catalog

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


def _default(o: Any) -> Any:
    if isinstance(o, (uuid.UUID,)):
        return str(o)
    if isinstance(o, (datetime, date)):
        return o.isoformat()
    if dataclasses.is_dataclass(o):
        return dataclasses.asdict(o)  # type: ignore[arg-type]  # an instance: _default is only handed values
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def emit(result: Result, as_json: bool) -> None:
    if as_json:
        json.dump(result.data, sys.stdout, default=_default, indent=2, sort_keys=False)
        sys.stdout.write("\n")
    elif result.text:
        sys.stdout.write(result.text.rstrip("\n") + "\n")


def table(rows: list[dict], columns: list[str]) -> str:
    """A plain fixed-width table for terminals."""
    if not rows:
        return "(none)"
    cells = [[("" if r.get(c) is None else str(r.get(c))) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)
