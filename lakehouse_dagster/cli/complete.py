"""`lakehouse complete` and `lakehouse backfill`: a native dataset's Postgres rows retired, and Postgres rows back
(after a writer's rollback to pg, or a completed dataset restored)."""

from __future__ import annotations

from lakehouse_dagster.cli.common import Result, add_command, scope_args, table

COMPLETE_HELP = (
    "retire a native dataset's Postgres rows (refused unless native past the soak, reverse parity ok, "
    "no Postgres-locked consumer): the reverse off, then its dataset_rows deleted in short batches, resumable"
)
BACKFILL_HELP = (
    "after a rollback to pg: copy the rows only Iceberg holds back to dataset_rows "
    "(identity preserved, one transaction), so the mirror may run again"
)


def register(sub) -> None:
    add_complete(sub, "complete", help=COMPLETE_HELP)
    add_backfill(sub, "backfill", help=BACKFILL_HELP)


def add_complete(sub, name: str, help: str | None):
    """The `complete` verb's parser under ``name``: its own, or its old name's (an alias: cli/moved.py)."""
    cp = add_command(sub, name, _complete, **({} if help is None else {"help": help}))
    scope_args(cp)
    cp.add_argument(
        "--export-to",
        help="first write the rows as Parquet into this new or empty directory (or, at a wider scope, the one an "
        "earlier run used: it resumes)",
    )
    cp.add_argument("--note", help="why (kept in the audit)")
    cp.add_argument("--status", action="store_true", help="print the complete marks and their audit; change nothing")
    cp.add_argument("--limit", type=int, default=50, help="--status: audit entries shown (default 50)")
    return cp


def add_backfill(sub, name: str, help: str | None):
    """The `backfill` verb's parser under ``name``: its own, or its old name's (an alias: cli/moved.py)."""
    bf = add_command(sub, name, _backfill, **({} if help is None else {"help": help}))
    bf.add_argument("--dataset", required=True, help="dataset uuid")
    return bf


def _backfill(ctx, args) -> Result:
    from lakehouse_dagster.api.complete import (
        backfill_or_restore,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    r = backfill_or_restore(ctx.dsn, ctx.catalog, ctx.settings, args.dataset, actor=ctx.settings.project.actor)
    return Result(r.as_dict(), r.summary())


def _complete(ctx, args) -> Result:
    from lakehouse_dagster.api import (
        complete,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    if args.status:
        if args.workspace:
            from lakehouse_dagster.core.errors import (
                BadInput,
            )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

            raise BadInput("--status takes --dataset <uuid> or no scope (every complete), not --workspace")
        found = complete.complete_status(ctx.conn, args.dataset, limit=args.limit)
        marks = [m.as_dict() for m in found["marks"]]
        lines = [
            table(marks, ["dataset_id", "status", "started_at", "finished_at", "rows_deleted", "batches", "export_to"])
            if marks
            else "no dataset was ever completed"
        ]
        if found["audit"]:
            lines += ["", "audit (newest first)", table(found["audit"], ["at", "dataset_id", "event", "rows", "actor"])]
        return Result({"marks": marks, "audit": found["audit"]}, "\n".join(lines))
    done = complete.complete_scope(
        ctx.dsn,
        ctx.catalog,
        ctx.settings,
        dataset=args.dataset,
        workspace=args.workspace,
        export_to=args.export_to,
        actor=ctx.settings.project.actor,
        note=args.note,
    )
    lines = [c.summary() for c in done.completed] + [r for _, r in done.refused]
    if not lines:
        lines = ["no native dataset in that scope is left to complete"]
    result = Result(done.as_dict(), "\n".join(lines))
    if done.refused or any(c.status != "complete" for c in done.completed):
        result.exit_code = 6 if done.refused else 1
    return result
