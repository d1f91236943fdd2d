"""The orphan sweep as a job and a daily schedule: `lakehouse orphans` from the UI. Expiry and compaction leave
the files they replace on disk (a reader that chose a snapshot a moment ago still reads them); this removes what
no kept snapshot references, past the grace period. The schedule ships stopped: an operator turns it on once
the first listing (delete off) looks right. (No ``from __future__ import annotations``: Dagster reads the Config
annotations at runtime.)
"""

from typing import Optional

import dagster as dg
from pydantic import Field

from lakehouse_dagster.api.datasets import names_of
from lakehouse_dagster.api.mirror import sweep
from lakehouse_dagster.core.errors import LakehouseError
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.shared.refusals import refuse
from lakehouse_dagster.dagster.defs.shared.tables import table


class OrphanSweepConfig(dg.Config):
    datasets: list[str] = Field(
        default_factory=list, description="dataset ids to sweep; empty: every dataset with a succeeded sync"
    )
    delete: bool = Field(default=False, description="remove the orphan files (default: only list them)")
    grace_seconds: Optional[float] = Field(
        default=None,
        description="spare files modified in the last S seconds (default "
        "LAKEHOUSE_SNAPSHOTS_MAX_AGE_SECONDS, at least 3600)",
    )


@dg.op(description="List (or remove) the files of the datasets' Iceberg tables that no kept snapshot references.")
def orphan_sweep_op(context: dg.OpExecutionContext, config: OrphanSweepConfig, lakehouse: LakehouseResource) -> dict:
    with lakehouse.connect() as conn:
        try:
            swept = sweep(
                conn,
                lakehouse.catalog(),
                lakehouse.settings(),
                config.datasets or None,
                delete=config.delete,
                grace_seconds=config.grace_seconds,
            )
        except LakehouseError as exc:
            raise refuse(exc) from None
        names: dict = names_of(conn, [s.dataset_id for s in swept])
    for s in swept:
        if s.error:
            context.log.warning(f"{names.get(s.dataset_id, '?')} " + s.line(config.delete))
        elif s.orphans:
            context.log.info(f"{names.get(s.dataset_id, '?')} " + s.line(config.delete))
    with_orphans = [s for s in swept if s.orphans]
    rows = [
        {
            "name": names.get(s.dataset_id, "?"),
            "dataset_id": str(s.dataset_id),
            "orphan_files": len(s.orphans),
            "bytes": s.bytes,
            "removed": s.removed,
        }
        for s in with_orphans
    ]
    failed = [s for s in swept if s.error]
    if failed:  # the others were swept; these need a look
        context.log.info(
            f"swept {len(swept) - len(failed)} dataset(s): {sum(len(s.orphans) for s in swept)} orphan "
            f"file(s), {sum(s.removed for s in swept)} removed"
        )
        raise refuse(
            f"{len(failed)} of {len(swept)} dataset(s) could not be swept: "
            + "; ".join(f"{names.get(s.dataset_id, '?')} ({s.dataset_id}): {s.error}" for s in failed[:5])
        )
    context.add_output_metadata(
        {
            "datasets_swept": len(swept),
            "datasets_with_orphans": len(with_orphans),
            "orphan_files": sum(len(s.orphans) for s in swept),
            "bytes": sum(s.bytes for s in swept),
            "removed": sum(s.removed for s in swept),
            "delete": config.delete,
            "grace_seconds": swept[0].grace_seconds if swept else None,
            "orphans": table(  # (each dataset with orphans was logged above)
                rows,
                [
                    ("name", "string"),
                    ("dataset_id", "string"),
                    ("orphan_files", "int"),
                    ("bytes", "int"),
                    ("removed", "int"),
                ],
            ),
        }
    )
    return {"datasets": [s.as_dict() for s in swept]}


@dg.job(
    name="orphan_sweep",
    description="Remove (delete: true) or list the files of the datasets' Iceberg tables that no kept snapshot "
    "references: what snapshot expiry, compaction and partial rewrites leave on disk. Spares files "
    "younger than the grace period and the files of syncs the reaper has yet to settle.",
    tags={"lakehouse/area": "maintenance"},
)
def orphan_sweep_job():
    orphan_sweep_op()


orphan_sweep_schedule = dg.ScheduleDefinition(
    name="orphan_sweep_schedule",
    job=orphan_sweep_job,
    cron_schedule="17 3 * * *",
    default_status=dg.DefaultScheduleStatus.STOPPED,
    run_config={"ops": {"orphan_sweep_op": {"config": {"delete": True}}}},
    description="Daily at 03:17: remove the orphan files of every dataset with a succeeded sync (grace: the "
    "snapshot max age, at least an hour). Stopped until an operator turns it on.",
)
