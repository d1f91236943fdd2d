"""`lakehouse orphans --dataset <uuid> [--delete]`: files of a dataset's Iceberg table no kept snapshot references."""

from __future__ import annotations

from ..errors import BadInput, NotFound
from ..ids import parse_uuid
from .common import Result, add_command


def register(sub) -> None:
    p = add_command(sub, "orphans", _orphans,
                    help="list (or --delete) the files of a dataset's Iceberg table that no kept snapshot references")
    p.add_argument("--dataset", action="append", required=True, metavar="UUID", help="dataset id (repeatable)")
    p.add_argument("--delete", action="store_true", help="remove them (default: only list)")
    p.add_argument("--grace-seconds", type=float, default=None, metavar="S",
                   help="spare files modified in the last S seconds (default LAKEHOUSE_SNAPSHOTS_MAX_AGE_SECONDS, "
                        "at least 3600)")


def _orphans(ctx, args) -> Result:
    from ..iceberg import orphans as orph
    from ..iceberg.catalog import load_table_or_none, table_identifier
    from ..ingest.reaper import unsettled_syncs

    ids = [parse_uuid(d, "dataset id") for d in args.dataset]  # refuse bad input before touching anything
    grace = args.grace_seconds if args.grace_seconds is not None else max(3600, ctx.settings.snapshots_max_age_seconds)
    if grace < 0:
        raise BadInput(f"--grace-seconds {grace} is negative; give 0 or more")
    tables = {ds: load_table_or_none(ctx.catalog, table_identifier(ctx.settings, ds)) for ds in ids}
    for ds, table in tables.items():  # every dataset checked before any file is removed
        if table is None:
            raise NotFound(f"dataset {ds} has no Iceberg table (never mirrored); nothing swept")
    out, lines = [], []
    for ds, table in tables.items():
        protected = unsettled_syncs(ctx.conn, ds)  # the reaper's to settle
        found = orph.find_orphans(table, grace_seconds=grace, protected_syncs=protected)
        removed = orph.remove(table, found) if args.delete else 0
        size = sum(o.size for o in found)
        out.append({"dataset_id": str(ds), "orphans": len(found), "bytes": size, "removed": removed,
                    "grace_seconds": grace, "paths": [o.path for o in found]})
        verb = f"removed {removed}" if args.delete else "listed only (add --delete to remove them)"
        lines.append(f"{ds}: {len(found)} orphan file(s), {size:,} bytes, older than {grace:.0f} s; {verb}")
    return Result({"datasets": out}, "\n".join(lines))
