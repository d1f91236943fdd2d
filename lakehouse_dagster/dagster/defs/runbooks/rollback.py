"""The writer rollback as a job: set the writer back to pg (behind the flip gates), report per dataset what
only Iceberg holds, and optionally backfill it into Postgres — `write-flags set <writer> pg` followed by
`lakehouse backfill`, from the UI. (No ``from __future__ import annotations``: Dagster reads the Config
annotations at runtime.)
"""

from typing import Optional

import dagster as dg
from pydantic import Field

from lakehouse_dagster.api.complete import backfill_or_restore
from lakehouse_dagster.api.flags import set_flag
from lakehouse_dagster.api.flips import (
    BackfillResult,
    apply_reverse_first,
    backfill,
    leaving_native,
    rollback_lines,
    rolled_back,
)
from lakehouse_dagster.core.errors import LakehouseError
from lakehouse_dagster.dagster.defs.flags.flags import FlippableWriter, _actor
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.shared.refusals import refuse
from lakehouse_dagster.dagster.defs.shared.tables import table
from lakehouse_dagster.dagster.defs.shared.tags import dataset_tags, flag_tags, tag_run, text


class WriteRollbackConfig(dg.Config):
    writer: FlippableWriter = Field(description="the writer to roll back to pg")
    dataset_id: Optional[str] = Field(default=None, description="roll back for one dataset")
    workspace_id: Optional[str] = Field(default=None, description="or a workspace; neither: global")
    note: Optional[str] = Field(default=None, description="why, kept with the override and in the audit")
    backfill: bool = Field(
        default=False,
        description="then copy the rows only Iceberg holds into dataset_rows "
        "(otherwise the mirror refuses those datasets until a backfill "
        "or a sync.full on the pg path)",
    )


@dg.op(
    description="Set the writer to pg, report the rows/snapshots only Iceberg holds per dataset, optionally backfill."
)
def write_rollback_op(
    context: dg.OpExecutionContext, config: WriteRollbackConfig, lakehouse: LakehouseResource
) -> dict:
    writer = config.writer.value
    settings, catalog = lakehouse.settings(), lakehouse.catalog()
    with lakehouse.connect() as conn:
        tag_run(context, flag_tags(conn, "write", writer, config.dataset_id, config.workspace_id))
        try:
            moved = leaving_native(conn, writer, "pg", dataset=config.dataset_id, workspace=config.workspace_id)
            # the reverse mirror applies what it has not yet: Postgres holds every native row when the flag moves
            for ds_id, why in apply_reverse_first(lakehouse.pg_dsn, catalog, settings, moved).items():
                context.log.warning(f"the reverse mirror could not catch up dataset {ds_id} first: {why}")
            change = set_flag(
                conn,
                "write",
                writer,
                "pg",
                dataset=config.dataset_id,
                workspace=config.workspace_id,
                note=config.note,
                actor=_actor(context, lakehouse),
            )
            rolled = rolled_back(conn, catalog, settings, moved)
        except LakehouseError as exc:
            raise refuse(exc) from None
    for line in rollback_lines(writer, rolled):
        context.log.info(line.strip())
    backfilled = []
    if config.backfill:
        for r in rolled:
            if r.iceberg_only is None:
                continue
            try:
                b = backfill(lakehouse.pg_dsn, catalog, settings, r.dataset_id, actor=_actor(context, lakehouse))
            except LakehouseError as exc:
                raise refuse(exc) from None
            context.log.info(f"{r.name} ({r.dataset_id}): backfilled {b.copied} row(s) from snapshot {b.snapshot_id}")
            backfilled.append(b.as_dict())
    rows = [
        {
            "name": r.name,
            "dataset_id": str(r.dataset_id),
            "rows_only_in_iceberg": r.iceberg_only.rows if r.iceberg_only else 0,
            "native_snapshots": r.iceberg_only.snapshots if r.iceberg_only else 0,
        }
        for r in rolled
    ]
    iceberg_only = table(
        rows,
        [("name", "string"), ("dataset_id", "string"), ("rows_only_in_iceberg", "int"), ("native_snapshots", "int")],
    )  # (rollback_lines logged each dataset above)
    context.add_output_metadata(
        {
            "flag": writer,
            "scope": str(change.scope),
            "before": change.before or "(no override)",
            "after": change.after,
            "datasets_moved": len(rolled),
            "backfilled": len(backfilled),
            "iceberg_only": iceberg_only,
        }
    )
    return {"rolled_back": [r.as_dict() for r in rolled], "backfilled": backfilled}


@dg.job(
    name="write_rollback",
    description="Fase 4 rollback: a writer back to pg for a dataset, a workspace or globally; reports what only "
    "Iceberg holds (the mirror refuses to overwrite it) and optionally backfills it into Postgres.",
    tags={"lakehouse/area": "rollout"},
)
def write_rollback_job():
    write_rollback_op()


class BackfillConfig(dg.Config):
    dataset_id: str = Field(description="the dataset rolled back to pg whose Iceberg-only rows go to dataset_rows")


@dg.op(description="`lakehouse backfill`: copy the rows only Iceberg holds into dataset_rows.")
def backfill_op(context: dg.OpExecutionContext, config: BackfillConfig, lakehouse: LakehouseResource) -> dict:
    with lakehouse.connect() as conn:
        tag_run(context, dataset_tags(conn, config.dataset_id))
    try:
        r = backfill_or_restore(  # a completed dataset: restored from Iceberg (runbooks/complete/)
            lakehouse.pg_dsn,
            lakehouse.catalog(),
            lakehouse.settings(),
            config.dataset_id,
            actor=_actor(context, lakehouse),
        )
    except LakehouseError as exc:
        raise refuse(exc) from None
    context.log.info(r.summary())
    if not isinstance(r, BackfillResult):  # a restore: its own few numbers
        context.add_output_metadata(
            {"dataset_id": text(r.dataset_id), "snapshot_id": text(r.snapshot_id), "copied": r.copied, "restored": True}
        )
        return r.as_dict()
    context.add_output_metadata(
        {
            "dataset_id": text(r.dataset_id),
            "snapshot_id": text(r.snapshot_id),
            "copied": r.copied,
            "removed": r.removed,
            "moved": r.moved,
            "pg_rows": r.pg_rows,
            "seconds": round(r.seconds, 3),
            "nothing_to_do": r.nothing_to_do,
        }
    )
    return r.as_dict()


@dg.job(
    name="backfill",
    description="Fase 4 rollback, after `write-flags set <writer> pg`: copy the rows only Iceberg holds into "
    "dataset_rows with their identity, in one transaction, so the mirror may run again (`lakehouse backfill`). "
    "Refused while a writer of the dataset still resolves to iceberg_native.",
    tags={"lakehouse/area": "rollout"},
)
def backfill_job():
    backfill_op()
