"""`lakehouse ingest --dataset <uuid> --writer <writer>`: run a source writer through the write router."""

from __future__ import annotations

from lakehouse_dagster.cli.common import Result, add_command
from lakehouse_dagster.core.ids import parse_uuid


def register(sub) -> None:
    from lakehouse_dagster.api.sources import WRITERS  # not sources.writers: a usage error imports no pyarrow

    p = add_command(sub, "ingest", _ingest, help="run a source writer (pg path or iceberg-native, as its flag says)")
    p.add_argument("--dataset", required=True, metavar="UUID")
    p.add_argument("--writer", required=True, metavar="WRITER", help=f"one of {', '.join(WRITERS)}")


def _ingest(ctx, args) -> Result:
    from lakehouse_dagster.api.flags import (
        FlagResolver,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)
    from lakehouse_dagster.api.flips import (
        checked_write,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)
    from lakehouse_dagster.api.sources import (
        check_writer,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    check_writer(args.writer)  # refuse a locked or unknown writer before touching anything
    ds_id = parse_uuid(args.dataset, "dataset id")
    flags = FlagResolver(ctx.conn, ctx.settings.flags.ttl_seconds)
    checked = checked_write(ctx.conn, ctx.dsn, ctx.catalog, ctx.settings, flags, ds_id, args.writer)
    r = checked.result
    if not r.new:
        text = f"{ds_id}: {r.writer} found nothing new in the source; nothing written (cursor {r.cursor})"
    else:
        where = f"snapshot {r.snapshot_id}" if r.path == "native" else "dataset_rows (the mirror carries them on)"
        text = (
            f"{ds_id}: {r.writer} via {r.path} ({r.flag_reason}) — {r.rows} rows → {where}, "
            f"{r.total_rows} in total, cursor {r.cursor}, sync {r.sync_id}, {r.seconds:.2f}s"
        )
        if r.compacted_rows:
            text += f"; {r.compacted_rows} rows of small files compacted in the same commit"
    first = checked.first_native
    if first is None:
        return Result(r.to_json(), text)
    # the dataset's first native write: its canary's verdict, and on a MISMATCH the auto-rollback (STOP, exit 1)
    text = "\n".join([text, *checked.lines()])
    return Result({**r.to_json(), "first_native": first.as_dict()}, text, 1 if first.problem else 0)
