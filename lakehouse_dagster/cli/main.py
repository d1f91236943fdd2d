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
from lakehouse_dagster.core.errors import (
    LakehouseError,
    SyncFailed,
    is_transient,
    object_store_failing,
    postgres_unreachable,
)


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
        store = object_store_failing(exc)
        if store is not None:
            print(f"lakehouse {args.command}: error: {store}", file=sys.stderr)
            return 75  # EX_TEMPFAIL: the store's 5xx or silence outlasted the SDK's retries; a later retry may succeed
        print(f"lakehouse {args.command}: error: {exc}", file=sys.stderr)
        return _exit_code(exc)
    except KeyboardInterrupt:
        print(f"lakehouse {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        unreachable = postgres_unreachable(exc) or object_store_failing(exc)
        if unreachable is not None:
            print(f"lakehouse {args.command}: error: {unreachable}", file=sys.stderr)
            return 75  # EX_TEMPFAIL, as Backpressure: a retry once Postgres (or the object store) answers may succeed
        missing = _no_lakehouse_tables(ctx, exc)
        if missing is None:
            raise
        print(f"lakehouse {args.command}: error: {missing}", file=sys.stderr)
        return 3
    finally:
        ctx.close()
    emit(result, getattr(args, "json", False))
    return result.exit_code


def _exit_code(exc: LakehouseError) -> int:
    """A sync that failed on a cause a retry may clear (Postgres restarted or unreachable, its lock session lost,
    the object store's I/O) exits 75 as an unreachable Postgres does: a supervisor retries on 75, not on 4."""
    if isinstance(exc, SyncFailed) and is_transient(exc):
        return 75
    return exc.exit_code


def _no_lakehouse_tables(ctx: Context, exc: Exception) -> str | None:
    """One line, not a traceback, when the database reached has none of the lakehouse's tables (a home or DSN
    that is not the running stack's, or a server never migrated); None for any other error."""
    errors = sys.modules.get("psycopg.errors")  # imported already if a query raised it
    if errors is None or not isinstance(exc, errors.UndefinedTable):
        return None
    from lakehouse_dagster.cli.dsn import (
        display_dsn,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    settings = ctx.settings
    where = (
        f"LAKEHOUSE_PG_DSN ({display_dsn(settings.pg_dsn)})"
        if settings.pg_dsn
        else f"the embedded Postgres of LAKEHOUSE_HOME={settings.home}"
    )
    return (
        f"{where} has no lakehouse tables ({str(exc).splitlines()[0]}): set LAKEHOUSE_HOME (or LAKEHOUSE_PG_DSN) to "
        "the running stack's, or run lakehouse db migrate to create them there"
    )


if __name__ == "__main__":
    sys.exit(main())
