"""What every subcommand shares: --json, one-line errors, and a lazily opened context."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import logging
import re
import sys
import uuid
from collections.abc import Callable
from datetime import date, datetime
from typing import TYPE_CHECKING, Any, Protocol

from lakehouse_dagster.core.settings import Settings

if TYPE_CHECKING:  # the verbs' machinery is imported lazily (a fast --help)
    import psycopg
    from pyiceberg.catalog import Catalog


_DEEPEST = "_lakehouse_parser"  # the namespace attribute naming the innermost (sub)parser that parsed the line
_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<given>[^']*)' \(choose from (?P<choices>.*)\)$")


class ArgumentParser(argparse.ArgumentParser):
    """Bad usage exits 2 with one line: what was wrong, the nearest valid word, and the verb's own --help (its
    usage follows when a word was unknown)."""

    def add_argument(self, *args, **kwargs):  # argparse API
        """As argparse's; the long options are kept (``long_options``) for the did-you-mean of a mistyped one."""
        action = super().add_argument(*args, **kwargs)
        self.long_options = [
            *getattr(self, "long_options", []),
            *(o for o in action.option_strings if o.startswith("--")),
        ]
        return action

    def add_subparsers(self, **kwargs):  # argparse API
        """As argparse's; the subcommand tables are kept (``subcommand_tables``), so the moved verbs' aliases are
        found without reaching into argparse's private attributes."""
        table = super().add_subparsers(**kwargs)
        self.subcommand_tables = [*getattr(self, "subcommand_tables", []), table]
        return table

    def error(self, message: str):  # noqa: D401 - argparse API
        hint = ""
        bad = _INVALID_CHOICE.search(message)
        if bad is not None:
            moved = self._moved()  # the aliases of the moved verbs (cli/moved.py): neither listed nor suggested
            choices = [c.strip().strip("'") for c in bad.group("choices").split(",")]
            choices = [c for c in choices if c not in moved]
            message = message[: bad.start("choices")] + ", ".join(map(repr, choices)) + ")"
            hint = _did_you_mean(bad.group("given"), choices)
            near = difflib.get_close_matches(bad.group("given"), list(moved), n=1, cutoff=0.6)
            if not hint and near:  # near a moved verb only: the verb it is now
                hint = f"; did you mean lakehouse {moved[near[0]]}?"
        self._fail(message + hint, usage=bad is not None)

    def _moved(self) -> dict[str, str]:
        """This parser's hidden subcommands: an alias's old name -> the verb it moved to (cli/moved.py)."""
        tables = getattr(self, "subcommand_tables", [])
        return {old: new for a in tables for old, new in getattr(a, "moved", {}).items()}

    def _fail(self, message: str, *, usage: bool):
        more = self.format_usage() if usage else ""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n{more}")

    def parse_known_args(self, args=None, namespace=None):  # argparse API
        ns, extras = super().parse_known_args(args, namespace)
        if not hasattr(ns, _DEEPEST):  # the innermost subparser returns first: it names itself, its parents keep it
            setattr(ns, _DEEPEST, self)
        return ns, extras

    def parse_args(self, args=None, namespace=None):  # argparse API
        """As argparse's, but an unknown option is blamed on the verb that was given it, with its nearest option."""
        ns, extras = self.parse_known_args(args, namespace)
        owner = getattr(ns, _DEEPEST, self)
        delattr(ns, _DEEPEST)
        if extras:
            known = getattr(owner, "long_options", [])
            hints = [_did_you_mean(x.split("=", 1)[0], known) for x in extras if x.startswith("--")]
            owner._fail(f"unrecognized arguments: {' '.join(extras)}{next((h for h in hints if h), '')}", usage=True)
        return ns


def _did_you_mean(given: str, words: list[str]) -> str:
    near = difflib.get_close_matches(given, words, n=1, cutoff=0.6)
    return f"; did you mean {near[0]}?" if near else ""


def json_parent() -> ArgumentParser:
    p = ArgumentParser(add_help=False)
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    return p


class Subcommands(Protocol):
    """What ``ArgumentParser.add_subparsers()`` returns (argparse keeps its class private)."""

    def add_parser(self, name: str, **kw: Any) -> ArgumentParser: ...


def scope_args(p) -> None:
    """--dataset / --workspace: the scope of a flag, a setting or a run (none: global)."""
    p.add_argument("--dataset", help="dataset uuid (most specific scope)")
    p.add_argument("--workspace", help="workspace uuid")


def where(scope) -> str:
    """A scope as the verbs print it."""
    return "globally" if scope.scope_id is None else f"for {scope}"


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
            from lakehouse_dagster.api.lake import (
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


class _StderrLines(logging.StreamHandler):
    """The warnings and errors a verb's machinery logs, one line each in the CLI's own format. The stream is looked
    up at each record: an in-process caller (the tests) swaps sys.stderr between calls."""

    def __init__(self, command: str) -> None:
        super().__init__()
        self.command = command

    @property
    def stream(self):  # noqa: D102
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass

    def format(self, record: logging.LogRecord) -> str:
        return f"lakehouse {self.command}: {record.levelname.lower()}: {record.getMessage()}"


def relay_warnings(command: str) -> None:
    """Without this, a record of WARNING or above reached Python's last-resort handler: a bare message with no
    prefix, in another shape than the CLI's own lines. A program that configured logging itself keeps its handlers
    (pytest, an embedding script): nothing is added then; nor for `serve`, which logs in the service's format."""
    if command == "serve":
        return
    root = logging.getLogger()
    ours = [h for h in root.handlers if isinstance(h, _StderrLines)]
    if ours:
        ours[0].command = command
        return
    if root.handlers:
        return
    handler = _StderrLines(command)
    handler.setLevel(logging.WARNING)
    root.addHandler(handler)
