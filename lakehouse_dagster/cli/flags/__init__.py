"""`lakehouse flags|write-flags list|set|clear|history|flip` (the runbooks' own verbs) and `lakehouse read` (a
reader through the router).

The verbs' argparse table is here (``register``); the handlers sit in ``crud`` (list, set, clear, history),
``flips`` (flip) and ``read``; ``shared`` holds the change's data they print. The verbs that once hung here
too (reverse, complete, backfill, candidates, soak, readers) are top-level verbs of their own now, kept under their
old names for one release as hidden aliases (cli/moved.py). Every module imports its machinery inside the functions
that run (a fast ``--help``, test_cli_start.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lakehouse_dagster.api.flags import MODES, READ, REGISTRY, WRITE  # no psycopg: a usage error answers at once
from lakehouse_dagster.cli import candidates, complete, pg_readers, reverse, soak
from lakehouse_dagster.cli.common import add_command
from lakehouse_dagster.cli.flags.crud import _clear, _history, _list, _set
from lakehouse_dagster.cli.flags.flips import _flip, _flip_args, _wflip
from lakehouse_dagster.cli.flags.read import _read
from lakehouse_dagster.cli.flags.shared import _KIND_WORD, _scope_args
from lakehouse_dagster.cli.moved import add_aliases

# the new verb path -> its parser builder, for the aliases of the verbs that moved out (cli/moved.py)
_BUILDERS: dict[tuple[str, ...], Callable[..., Any]] = {
    ("reverse",): reverse.add_reverse,
    ("complete",): complete.add_complete,
    ("backfill",): complete.add_backfill,
    ("candidates",): candidates.add_candidates,
    ("soak",): soak.add_soak,
    ("pg-readers",): pg_readers.add_pg_readers,
}

__all__ = ["register"]


def register(sub) -> None:
    """The argparse table of the flags and write-flags verbs, one block per verb."""
    for command, kind, help_text in (
        ("flags", READ, "read flags: which engine serves each reader (off < shadow < iceberg < iceberg_only)"),
        ("write-flags", WRITE, "write flags: where each writer lands (pg < iceberg_native)"),
    ):
        p = sub.add_parser(command, help=help_text, description=help_text)
        actions = p.add_subparsers(dest=f"{command}_action", required=True, metavar="ACTION")
        word = _KIND_WORD[kind]

        ls = add_command(actions, "list", _list, help="registry defaults, ceilings, classes and every runtime override")
        ls.add_argument(
            "--dataset", help="also show the effective mode (and why) of every " + word + " for this dataset"
        )

        st = add_command(actions, "set", _set, help="set a runtime override (no scope = global)")
        st.add_argument("name", help=f"the {word}, e.g. {next(iter(REGISTRY[kind]))}")
        st.add_argument("mode", help=" < ".join(MODES[kind]))
        _scope_args(st)
        st.add_argument("--note", help="why (kept with the override and in the audit)")

        cl = add_command(actions, "clear", _clear, help="drop an override (back to the next scope or the default)")
        cl.add_argument("name", help=f"the {word}")
        _scope_args(cl)
        cl.add_argument("--note", help="why (kept in the audit)")

        hi = add_command(actions, "history", _history, help="the audit of every set and clear, newest first")
        hi.add_argument("name", nargs="?", help=f"only this {word}")
        _scope_args(hi)
        hi.add_argument("--limit", type=int, default=50, help="at most this many entries (default 50)")
        parsers = [ls, st, cl, hi]
        if kind == READ:
            fl = add_command(
                actions,
                "flip",
                _flip,
                help="the read-flip runbook step: canary preflight, gated set, verify through the router",
            )
            fl.add_argument("name", help="the reader, e.g. export.stream")
            fl.add_argument("mode", nargs="?", default="iceberg", help="iceberg (default) or iceberg_only")
            _flip_args(fl)
            parsers.append(fl)
        if kind == WRITE:
            wf = add_command(
                actions,
                "flip",
                _wflip,
                help="the write-flip runbook step: fresh canary, gated set to iceberg_native, verify",
            )
            wf.add_argument("name", help="the writer, e.g. sync.full")
            _flip_args(wf)
            parsers.append(wf)
        add_aliases(command, actions, _BUILDERS)  # not in `parsers`: the moved verbs take no kind
        for p_ in parsers:
            p_.set_defaults(kind=kind, command_name=command)

    rd = add_command(
        sub, "read", _read, help="exercise a reader through the read router: prints the decision and the rows"
    )
    rd.add_argument("--reader", required=True, help="the reader whose flag routes the read, e.g. export.stream")
    rd.add_argument("--dataset", required=True, help="dataset uuid")
    rd.add_argument("--columns", help="comma-separated columns (default: identity columns + every column)")
    rd.add_argument("--limit", type=int, default=20, help="at most N rows (default 20)")
    rd.add_argument("--order-by-row-index", action="store_true", help="order by __row_index (default: engine order)")
    rd.add_argument(
        "--query",
        help="a structured read as a JSON object (where, aggregate, row_ids, after_row_index, row_index, order, "
        "columns, limit: docs/reads.md); replaces --columns/--limit/--order-by-row-index",
    )
