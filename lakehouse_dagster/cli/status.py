"""`lakehouse status`: the migration overview (the same computation as the Dagster asset lakehouse/migration_overview)."""

from __future__ import annotations

from lakehouse_dagster.cli.common import Result, add_command

EPILOG = """stages per reader: postgres (not mirrored) · mirrored · reads_iceberg (mode iceberg) · iceberg_only;
per writer: postgres · mirrored · blocked (F3: a pipeline input, step 2b) · native (iceberg_native).
needs attention: MISMATCH · native-unsafe (native but failing the write-flip gates) · check error · wedged ·
lagging (behind, latest sync older than LAKEHOUSE_LAGGING_AFTER_SECONDS) · blocked.
mirror stream (LAKEHOUSE_MIRROR_STREAM): each shard's run, alive or DOWN (no heartbeat for
LAKEHOUSE_MIRROR_STREAM_DOWN_SECONDS), heartbeat, lag, backlog, last commit. Exit code 0: read-only."""


def register(sub) -> None:
    add_command(
        sub,
        "status",
        _status,
        help="the migration as it is: datasets per stage for each reader and writer, verdicts, lag, what needs "
        "attention, the mirror stream's shards",
        epilog=EPILOG,
    )


def _status(ctx, args) -> Result:
    from lakehouse_dagster.api.flags import current_soak  # here: a usage error answers without psycopg
    from lakehouse_dagster.api.plans import (
        live_statuses,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)
    from lakehouse_dagster.api.status import (
        compute_overview,
        text_lines,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    ov = compute_overview(ctx.conn, ctx.settings)
    plans = live_statuses(ctx.conn, soak_seconds=current_soak(ctx.conn, ctx.settings).seconds, history=0)
    lines = text_lines(ov) + ["", f"rollout plans: {len(plans)} live" + ("" if plans else " (lakehouse rollout start)")]
    for p in plans:
        lines += ["  " + line for line in p.lines(history=False)]
    return Result({**ov.as_dict(), "rollouts": [p.as_dict() for p in plans]}, "\n".join(lines))
