"""Entry point of the `lakehouse` console script.

Subcommands live one module each in this package (a ``register(sub)`` function). The verb table below names each
verb's module and help line, so ``lakehouse --help`` and a mistyped verb answer without importing any verb, and a
verb's module (and what it needs: psycopg, pyiceberg, pyarrow...) is imported only when that verb is given.
test_cli_start.py keeps the table equal to what the modules register, and the start-up free of heavy imports.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import Any

from lakehouse_dagster.cli.common import ArgumentParser, Context, Result, emit, relay_warnings
from lakehouse_dagster.core.arrow_memory import prefer_jemalloc_on_import
from lakehouse_dagster.core.errors import (
    LakehouseError,
    NothingToDo,
    SyncFailed,
    is_transient,
    object_store_failing,
    postgres_unreachable,
)

# verb -> (module in this package, help line), in the order `lakehouse --help` lists them
VERBS: dict[str, tuple[str, str]] = {
    "backfill": (
        "complete",
        "after a rollback to pg: copy the rows only Iceberg holds back to dataset_rows (identity preserved, one "
        "transaction), so the mirror may run again",
    ),
    "candidates": (
        "candidates",
        "the runbook's step 2b (SAFE / BLOCKED) plus what each dataset still lacks for a flip",
    ),
    "canary": ("canary", "compare Postgres and Iceberg per dataset (order-independent digests) and record verdicts"),
    "catalog": ("catalog", "move the datasets' Iceberg tables between the SQL and a REST catalog"),
    "complete": (
        "complete",
        "retire a native dataset's Postgres rows (refused unless native past the soak, reverse parity ok, no "
        "Postgres-locked consumer): the reverse off, then its dataset_rows deleted in short batches, resumable",
    ),
    "datasets": ("datasets", "list datasets with their workspace, Postgres version and last sync"),
    "db": ("db", "schema migrations of the project's Postgres"),
    "demo": ("demo", "the demo workspace (datasets of several sizes and shapes, a pipeline)"),
    "digest-capture": (
        "digest_capture",
        "show or switch where change tracking and the maintained Postgres digest are written",
    ),
    "flags": ("flags", "read flags: which engine serves each reader (off < shadow < iceberg < iceberg_only)"),
    "write-flags": ("flags", "write flags: where each writer lands (pg < iceberg_native)"),
    "read": ("flags", "exercise a reader through the read router: prints the decision and the rows"),
    "ingest": ("ingest", "run a source writer (pg path or iceberg-native, as its flag says)"),
    "ingest-bench": ("ingest_bench", "validate the write guards (G1–G4) at a target concurrency"),
    "orphans": (
        "orphans",
        "list (or --delete) the files of datasets' Iceberg tables that no kept snapshot references",
    ),
    "pg": ("pg", "the embedded Postgres (when LAKEHOUSE_PG_DSN is unset)"),
    "pg-readers": (
        "pg_readers",
        "declare which datasets the readers held on Postgres read (locked ones; compute readers until flipped): a "
        "write flip of such a dataset with its reverse off, and its complete, are refused",
    ),
    "reverse": (
        "reverse",
        "the reverse mirror: native Iceberg commits applied back to dataset_rows (a rollback needs no backfill)",
    ),
    "rollout": ("rollout", "rollout plans: a reader or writer moved stage by stage by the rollout_controller"),
    "serve": (
        "serve",
        "serve the HTTP API the live app calls: read, ingest, route, flags, metrics (docs/service.md)",
    ),
    "shadow-proof": (
        "shadow_proof",
        "the shadow proof a flip of objects.sync, dashboards.aggregate or pipeline.expectations needs: comparisons "
        "in a row, stored for the CLI and every Dagster process",
    ),
    "soak": (
        "soak",
        "the soak of the widening rules, stored for the CLI and every Dagster process (readers and writers)",
    ),
    "sources": ("sources", "set or show a dataset's source (files, postgres table/query, cdc table)"),
    "status": (
        "status",
        "the migration as it is: datasets per stage for each reader and writer, verdicts, lag, what needs "
        "attention, the mirror stream's shards",
    ),
    "sync": ("sync", "mirror datasets' Postgres rows into their Iceberg tables"),
    "up": (
        "up",
        "start everything: Postgres (embedded unless LAKEHOUSE_PG_DSN), schema, demo, Dagster webserver + daemon",
    ),
}


class _OnlyVerb:
    """The subcommands object a verb module registers into when only one of its verbs is wanted: that verb's
    parser is the real one, any other verb the module adds is built aside and dropped."""

    def __init__(self, sub: Any, verb: str) -> None:
        self._sub, self._verb = sub, verb

    def add_parser(self, name: str, **kw: Any) -> ArgumentParser:
        if name == self._verb:
            return self._sub.add_parser(name, **kw)
        kw.pop("help", None), kw.pop("aliases", None)  # subcommand-only keywords
        return ArgumentParser(prog=name, **kw)


def build_parser(argv: Sequence[str] | None = None) -> ArgumentParser:
    """The parser for ``argv``: every verb named with its help line from VERBS, and only the verb ``argv`` gives
    (its first word) built whole from its module. ``argv`` None: every verb built whole (tools that walk the tree)."""
    parser = ArgumentParser(prog="lakehouse", description="Postgres → Iceberg lakehouse migration tooling")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=ArgumentParser)
    given = None if argv is None else next((a for a in argv if not a.startswith("-")), None)
    for verb, (module, help_line) in VERBS.items():
        if argv is None or verb == given:
            importlib.import_module(f"{__package__}.{module}").register(_OnlyVerb(sub, verb))
        else:
            sub.add_parser(verb, help=help_line)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    prefer_jemalloc_on_import()  # before any verb allocates Arrow memory, without importing pyarrow for every verb
    relay_warnings(args.command)
    ctx = Context()
    try:
        result = args.func(ctx, args)
    except NothingToDo as exc:  # not an error: one plain line, exit 0 (a script's loop carries on under set -e)
        result = Result({"changed": False, "reason": str(exc)}, str(exc))
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
        f"LAKEHOUSE_PG_DSN ({display_dsn(settings.postgres.dsn)})"
        if settings.postgres.dsn
        else f"the embedded Postgres of LAKEHOUSE_HOME={settings.project.home}"
    )
    return (
        f"{where} has no lakehouse tables ({str(exc).splitlines()[0]}): set LAKEHOUSE_HOME (or LAKEHOUSE_PG_DSN) to "
        "the running stack's, or run lakehouse db migrate to create them there"
    )


if __name__ == "__main__":
    sys.exit(main())
