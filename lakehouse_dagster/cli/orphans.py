"""`lakehouse orphans [--dataset <uuid>] [--delete]`: files of datasets' Iceberg tables no kept snapshot references."""

from __future__ import annotations

from lakehouse_dagster.cli.common import Result, add_command


def register(sub) -> None:
    p = add_command(
        sub,
        "orphans",
        _orphans,
        help="list (or --delete) the files of datasets' Iceberg tables that no kept snapshot references",
    )
    p.add_argument(
        "--dataset",
        action="append",
        metavar="UUID",
        help="dataset id (repeatable; default: every dataset with a succeeded sync)",
    )
    p.add_argument("--delete", action="store_true", help="remove them (default: only list)")
    p.add_argument(
        "--grace-seconds",
        type=float,
        default=None,
        metavar="S",
        help="spare files modified in the last S seconds (default LAKEHOUSE_SNAPSHOTS_MAX_AGE_SECONDS, at least 3600)",
    )


def _orphans(ctx, args) -> Result:
    from lakehouse_dagster.api.mirror import (
        sweep,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    swept = sweep(
        ctx.conn, ctx.catalog, ctx.settings, args.dataset, delete=args.delete, grace_seconds=args.grace_seconds
    )
    # named datasets: a line each; all of them: only those with orphans or an error, then the totals
    shown = swept if args.dataset else [s for s in swept if s.orphans or s.error]
    lines = [s.line(args.delete) for s in shown]
    if not args.dataset:
        lines.append(
            f"{len(swept)} dataset(s) swept: {sum(len(s.orphans) for s in swept)} orphan file(s), "
            f"{sum(s.bytes for s in swept):,} bytes, {sum(s.removed for s in swept)} removed"
            if swept
            else "no dataset has an Iceberg table; nothing swept"
        )
    failed = sum(1 for s in swept if s.error)
    return Result({"datasets": [s.as_dict() for s in swept]}, "\n".join(lines), exit_code=1 if failed else 0)
