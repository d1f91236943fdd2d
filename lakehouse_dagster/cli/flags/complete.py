"""`write-flags backfill|complete`: Postgres rows back after a rollback, and a native dataset's Postgres rows retired."""

from __future__ import annotations

from lakehouse_dagster.cli.common import Result, table


def _backfill(ctx, args) -> Result:
    from lakehouse_dagster.runbooks.complete import (
        backfill_or_restore,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    r = backfill_or_restore(ctx.dsn, ctx.catalog, ctx.settings, args.dataset, actor=ctx.settings.project.actor)
    return Result(r.as_dict(), r.summary())


def _complete(ctx, args) -> Result:
    from lakehouse_dagster.runbooks import (
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
