"""`lakehouse sync --dataset <uuid> [--mode auto|full|incremental]`: the asset's code path, outside Dagster."""

from __future__ import annotations

import contextlib
import dataclasses
import signal

from lakehouse_dagster.api.mirror import MODES
from lakehouse_dagster.cli.common import Result, add_command
from lakehouse_dagster.core.ids import parse_uuid


def register(sub) -> None:
    p = add_command(sub, "sync", _sync, help="mirror datasets' Postgres rows into their Iceberg tables")
    p.add_argument("--dataset", action="append", required=True, metavar="UUID", help="dataset id (repeatable)")
    p.add_argument(
        "--mode",
        choices=MODES,
        default="auto",
        help="auto: incremental when only appends happened, else full (default)",
    )
    p.add_argument(
        "--revert-foreign",
        action="store_true",
        help="a full re-sync from Postgres that reverts what another Iceberg engine committed to the table "
        "(the sync refuses such a table otherwise: docs/limits.md)",
    )


def _sync(ctx, args) -> Result:
    from lakehouse_dagster.api.mirror import peak_rss_mb, sync_dataset  # here: pyiceberg only when a sync runs

    ids = [parse_uuid(d, "dataset id") for d in args.dataset]  # refuse bad input before touching anything
    results = []
    lines = []
    with _sigterm_interrupts():
        for ds in ids:
            r = sync_dataset(ctx.dsn, ctx.catalog, ctx.settings, ds, mode=args.mode, revert_foreign=args.revert_foreign)
            data = dataclasses.asdict(r)
            data["rows_per_s"] = round(r.rows_per_s)
            results.append(data)
            lines.append(
                f"{r.dataset_id}: {r.mode} ({r.reason}) — {r.rows} rows written, {r.total_rows} in table, "
                f"snapshot {r.snapshot_id}, {r.seconds:.2f}s, {r.rows_per_s:,.0f} rows/s"
            )
    lines.append(f"peak RSS {peak_rss_mb():.0f} MB")
    return Result({"syncs": results, "peak_rss_mb": round(peak_rss_mb(), 1)}, "\n".join(lines))


@contextlib.contextmanager
def _sigterm_interrupts():
    """SIGTERM (a supervisor or run termination) interrupts like Ctrl-C, so the sync records what is true
    before the process ends instead of vanishing with a 'running' row."""

    def _raise(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
