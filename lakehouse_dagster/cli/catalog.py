"""`lakehouse catalog migrate --to rest|sql [--dry-run]`: move every dataset's table to the other Iceberg catalog."""

from __future__ import annotations

import uuid

from lakehouse_dagster.cli.common import Result, add_command


def register(sub) -> None:
    cat = sub.add_parser("catalog", help="move the datasets' Iceberg tables between the SQL and a REST catalog")
    catsub = cat.add_subparsers(dest="catalog_command", required=True, metavar="ACTION")
    p = add_command(
        catsub,
        "migrate",
        _migrate,
        help="register each table's current state in the other catalog, data files untouched (docs/catalog-cutover.md)",
    )
    p.add_argument("--to", required=True, choices=("rest", "sql"), help="the catalog to move to (sql: the way back)")
    p.add_argument(
        "--how",
        choices=("register", "replay"),
        default="register",
        help="register: the target adopts the current metadata file; replay: it receives the snapshots in a staged "
        "create (SeaweedFS needs replay) (default register)",
    )
    p.add_argument("--dry-run", action="store_true", help="list what would move; change nothing")
    p.add_argument("--warehouse", metavar="URI", help="the target catalog's warehouse (default LAKEHOUSE_WAREHOUSE)")
    p.add_argument("--dataset", action="append", metavar="UUID", help="only this dataset (repeatable; default all)")
    p.add_argument(
        "--workers", type=int, default=1, metavar="N", help="tables moved at once, each under its own lock (default 1)"
    )
    p.add_argument(
        "--lock-wait-seconds",
        type=float,
        default=5.0,
        metavar="S",
        help="wait at most S for a dataset being written (G3), then skip it as busy (default 5)",
    )


def _migrate(ctx, args) -> Result:
    from lakehouse_dagster.api.lake import migrate  # lazy: as above
    from lakehouse_dagster.core.ids import parse_uuid  # lazy: the CLI imports a verb's machinery only when it runs

    ids: list[uuid.UUID] | None = [parse_uuid(d, "dataset id") for d in args.dataset] if args.dataset else None
    moved = migrate(
        ctx.dsn,
        ctx.settings,
        to=args.to,
        how=args.how,
        dry_run=args.dry_run,
        warehouse=args.warehouse,
        dataset_ids=ids,
        lock_wait_s=args.lock_wait_seconds,
        workers=args.workers,
    )
    counts: dict[str, int] = {}
    for m in moved:
        counts[m.outcome] = counts.get(m.outcome, 0) + 1
    summary = f"{len(moved)} dataset(s): " + (", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "none")
    if args.dry_run:
        summary += " (dry run: nothing changed)"
    left = counts.get("failed", 0) + counts.get("busy", 0)
    text = "\n".join([*(m.line() for m in moved), summary])
    return Result({"datasets": [m.as_dict() for m in moved], "counts": counts}, text, exit_code=1 if left else 0)
