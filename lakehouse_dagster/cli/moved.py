"""The verbs that moved out of `flags`/`write-flags` to a top-level verb of their capability (issue 45), and the
aliases that keep their old paths working for one release.

`flags` and `write-flags` keep the runbooks' own verbs (list, set, clear, history, flip). The others were hung there
because they touched a flag once; each is now the verb of what it does (docs/operator-guide.md, "Moved verbs"). An
alias is the new verb's own parser built under the old name (same arguments, same handler, same exit codes), left
out of the old group's --help and of its list of choices (a mistyped one is told the new verb: common.py), and it
prints one deprecation line on stderr when it runs.
This table is the one place in the package that may name an old form (test_cli_verbs.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from typing import Any

# (old group, old verb) -> the new verb path
MOVED: dict[tuple[str, str], tuple[str, ...]] = {
    ("write-flags", "reverse"): ("reverse",),
    ("write-flags", "complete"): ("complete",),
    ("write-flags", "backfill"): ("backfill",),
    ("write-flags", "candidates"): ("candidates",),
    ("flags", "soak"): ("soak",),
    ("flags", "readers"): ("pg-readers",),
}
REMOVED_IN = "0.26.0"  # the release the aliases go in: one release after they moved (0.25.0)


def deprecation_line(old: list[str], new: list[str]) -> str:
    return f"note: `lakehouse {' '.join(old)}` is now `lakehouse {' '.join(new)}`; the old form goes in {REMOVED_IN}"


def add_aliases(group: str, actions: Any, builders: Mapping[tuple[str, ...], Callable[..., Any]]) -> list:
    """Build each verb moved out of ``group`` under its old name in ``actions`` (the group's subcommands), hidden,
    with every handler of its tree saying once where it went. ``builders``: new verb path -> its parser builder
    (``builder(sub, name, help=None)``). Returns the parsers built."""
    built = []
    for (old_group, old_verb), new in MOVED.items():
        if old_group != group:
            continue
        parser = builders[new](actions, old_verb, help=None)
        parser.description = (
            f"deprecated: now `lakehouse {' '.join(new)}` (same arguments); the old form goes in {REMOVED_IN}"
        )
        _deprecate(parser, [group, old_verb], list(new))
        actions.moved = {**getattr(actions, "moved", {}), old_verb: " ".join(new)}  # common.ArgumentParser.error
        built.append(parser)
    return built


def _deprecate(parser: argparse.ArgumentParser, old: list[str], new: list[str]) -> None:
    func = parser.get_default("func")
    if func is not None:
        parser.set_defaults(func=_Noted(func, deprecation_line(old, new)))
    for table in getattr(parser, "subcommand_tables", []):  # cli/common.py's ArgumentParser keeps them
        for name, child in table.choices.items():
            _deprecate(child, [*old, name], [*new, name])


class _Noted:
    """A handler that prints its deprecation line on stderr first, then runs as the new verb does."""

    def __init__(self, func: Callable, line: str) -> None:
        self.func, self.line = func, line

    def __call__(self, ctx, args):
        print(self.line, file=sys.stderr)
        return self.func(ctx, args)
