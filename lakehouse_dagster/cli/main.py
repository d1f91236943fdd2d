"""Entry point of the `lakehouse` console script.

Subcommands live one module each in this package; any module with a ``register(sub)`` function is
picked up, so the CLI grows with the runbook verbs without a central list to edit.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

from lakehouse_dagster.cli.common import ArgumentParser, Context, emit
from lakehouse_dagster.core.arrow_memory import prefer_jemalloc
from lakehouse_dagster.core.errors import LakehouseError


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="lakehouse", description="Postgres → Iceberg lakehouse migration tooling")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=ArgumentParser)
    for mod in sorted(pkgutil.iter_modules(sys.modules[__package__].__path__), key=lambda m: m.name):
        if mod.name in ("main", "common"):
            continue
        module = importlib.import_module(f"{__package__}.{mod.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    prefer_jemalloc()  # before any verb allocates Arrow memory (core/arrow_memory.py)
    ctx = Context()
    try:
        result = args.func(ctx, args)
    except LakehouseError as exc:
        print(f"lakehouse {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"lakehouse {args.command}: interrupted", file=sys.stderr)
        return 130
    finally:
        ctx.close()
    emit(result, getattr(args, "json", False))
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
