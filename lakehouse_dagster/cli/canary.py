"""`lakehouse canary`: pinned parity of Postgres and Iceberg per dataset (runbook Fase 1 step 2, Fase 4 step 3)."""

from __future__ import annotations

from lakehouse_dagster.api import parity  # the names load on first use: the canary's machinery only when it runs
from lakehouse_dagster.api.parity import SMOKE_MAX_ROWS
from lakehouse_dagster.cli.common import Result, add_command, table

EPILOG = """verdicts: ok (safe to flip) · lagging (re-run later) · no-snapshot (never synced; flip is inert) ·
MISMATCH (caught up and disagrees: STOP) · native (written iceberg-native; Postgres not authoritative) ·
error (could not see the data). summary adds wedged: syncs stuck non-succeeded past
LAKEHOUSE_WEDGED_AFTER_SECONDS. Every verdict is written to lakehouse_read_parity.
auto-rollback: a MISMATCH turns every reader serving the dataset from Iceberg off at dataset scope
(audited; LAKEHOUSE_AUTO_ROLLBACK=false: report only).
exit codes: 0 fine · 1 a caught-up dataset mismatches · 5 an operational error in some dataset ·
2 bad usage · 3 unknown dataset."""


def register(sub) -> None:
    p = add_command(
        sub,
        "canary",
        _canary,
        help="compare Postgres and Iceberg per dataset (order-independent digests) and record verdicts",
        description="Pinned parity check: row counts and order-independent digests computed inside Postgres "
        "and by DuckDB over the Iceberg snapshot's Parquet files; on MISMATCH the differing row indexes.",
        epilog=EPILOG,
    )
    p.add_argument(
        "--dataset",
        action="append",
        metavar="UUID",
        default=[],
        help="dataset to check (repeatable); default: a random sample of synced datasets",
    )
    p.add_argument(
        "--limit",
        type=int,
        default=parity.DEFAULT_LIMIT,
        metavar="N",
        help=f"sample size when no --dataset is given (default {parity.DEFAULT_LIMIT})",
    )
    p.add_argument(
        "--smoke",
        action="store_true",
        help="also compare the multiset of row values, for datasets up to --smoke-max-rows rows",
    )
    p.add_argument(
        "--smoke-max-rows",
        type=int,
        default=SMOKE_MAX_ROWS,
        metavar="N",
        help=f"size threshold of the value-level check (default {SMOKE_MAX_ROWS})",
    )
    p.add_argument(
        "--full",
        action="store_true",
        help="digest every row on both sides (the cross-check) instead of comparing the maintained "
        "digests; also catches writes made with the triggers disabled",
    )


def _canary(ctx, args) -> Result:
    # parity.X loads its home on first use: pyiceberg, DuckDB and numba only when the canary runs
    report = parity.run_canary_and_roll_back(
        ctx.conn,
        ctx.dsn,
        ctx.catalog,
        ctx.settings,
        dataset_ids=args.dataset,
        limit=args.limit,
        smoke=args.smoke,
        smoke_max_rows=args.smoke_max_rows,
        full=args.full,
    )
    rows = []
    for r in report.results:
        rows.append(
            {
                "dataset": str(r.dataset_id),
                "name": r.dataset,
                "verdict": r.verdict + (" (wedged)" if r.wedged else ""),
                "pg_rows": r.pg_count,
                "iceberg_rows": r.iceberg_count,
                "snapshot": r.snapshot_id,
                "pg_version": r.pg_version,
                "smoke": r.smoke,
                "digest": r.detail.get("digest"),
                "detail": r.detail.get("reason", ""),
            }
        )
    lines = [
        table(
            rows,
            [
                "dataset",
                "name",
                "verdict",
                "pg_rows",
                "iceberg_rows",
                "snapshot",
                "pg_version",
                "smoke",
                "digest",
                "detail",
            ],
        )
    ]
    for r in report.results:
        if r.mismatched_row_indexes:
            more = " (more not shown)" if r.detail.get("localisation", {}).get("truncated") else ""
            lines.append(
                f"{r.dataset_id}: differing __row_index: {', '.join(map(str, r.mismatched_row_indexes))}{more}"
            )
    rolled = [r.detail["auto_rollback"] for r in report.results if r.detail.get("auto_rollback")]
    for r in report.results:
        lines += parity.lines_of(r)
    for w in report.wedged:
        lines.append(
            f"wedged: dataset {w['dataset_id']} sync {w['sync_id']} {w['status']} for {w['stuck_seconds']} s"
            + (f" ({w['error']})" if w.get("error") else "")
        )
    if not report.results:
        lines.append("no datasets to check (nothing synced yet? run: lakehouse sync --dataset <uuid>)")
    lines.append(report.summary_line())
    if report.exit_code == parity.EXIT_MISMATCH:
        lines.append(
            "MISMATCH on a caught-up dataset: STOP, do not flip; investigate the rows above"
            + (" (auto-rollback: see above)" if rolled else "")
        )
    elif report.exit_code == parity.EXIT_ERROR:
        lines.append("some datasets could not be checked (verdict error): the canary did not pass them")
    return Result({**report.as_dict(), "auto_rollback": rolled}, "\n".join(lines), report.exit_code)
