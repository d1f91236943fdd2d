"""`lakehouse complete` as a job: retire a native dataset's Postgres rows from the UI, the same core
function as the CLI (runbooks/complete/): refused, naming each missing condition, unless the dataset has been
native past the soak, its reverse parity is ok and no Postgres-locked consumer remains; then the reverse off, an
optional Parquet export, dataset_rows deleted in short batches. Re-launching it continues a complete a crash cut
short. (No ``from __future__ import annotations``: Dagster reads the Config annotations at runtime.)
"""

from typing import Optional

import dagster as dg
from pydantic import Field

from lakehouse_dagster.api.complete import complete_scope
from lakehouse_dagster.core.errors import LakehouseError
from lakehouse_dagster.dagster.defs.flags.flags import _actor
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.shared.refusals import refuse
from lakehouse_dagster.dagster.defs.shared.tables import table
from lakehouse_dagster.dagster.defs.shared.tags import dataset_tags, tag_run


class CompleteConfig(dg.Config):
    dataset_id: Optional[str] = Field(default=None, description="complete one dataset")
    workspace_id: Optional[str] = Field(
        default=None, description="or every native dataset of a workspace; neither: every native dataset"
    )
    export_to: Optional[str] = Field(
        default=None,
        description="first write the rows as Parquet into this new or empty directory (on the run worker's disk)",
    )
    note: Optional[str] = Field(default=None, description="why, kept in the audit")
    dataset_ids: Optional[list[str]] = Field(
        default=None,
        description="or these datasets (a rollout plan's complete stage: the datasets it moved); the run fails, "
        "naming each refusal, unless every one of them is complete",
    )


@dg.op(
    description="`lakehouse complete`: check, stop the reverse mirror, optionally export, delete the "
    "dataset's Postgres rows in short batches (resumable)."
)
def complete_op(context: dg.OpExecutionContext, config: CompleteConfig, lakehouse: LakehouseResource) -> dict:
    if config.dataset_id:
        with lakehouse.connect() as conn:
            tag_run(context, dataset_tags(conn, config.dataset_id))
    try:
        done = complete_scope(
            lakehouse.pg_dsn,
            lakehouse.catalog(),
            lakehouse.settings(),
            dataset=config.dataset_id,
            workspace=config.workspace_id,
            datasets=config.dataset_ids,
            export_to=config.export_to,
            actor=_actor(context, lakehouse),
            note=config.note,
        )
    except LakehouseError as exc:
        raise refuse(exc) from None
    for c in done.completed:
        context.log.info(c.summary())
    for _, why in done.refused:
        context.log.warning(why)
    rows = [
        {
            "dataset_id": str(c.dataset_id),
            "status": c.status,
            "rows_deleted": c.rows_deleted,
            "batches": c.batches,
            "exported_rows": c.exported_rows,
        }
        for c in done.completed
    ]
    context.add_output_metadata(
        {
            "completed": len([c for c in done.completed if c.status == "complete"]),
            "refused": len(done.refused),
            "datasets": table(
                rows,
                [
                    ("dataset_id", "string"),
                    ("status", "string"),
                    ("rows_deleted", "int"),
                    ("batches", "int"),
                    ("exported_rows", "int"),
                ],
            ),
        }
    )
    if done.refused and (not done.completed or config.dataset_ids is not None):
        raise refuse("\n".join(why for _, why in done.refused))
    return done.as_dict()


@dg.job(
    name="complete",
    description="The end of a dataset's writer migration (issue 31): retire its Postgres rows once it has been "
    "native past the soak, its reverse parity is ok and no Postgres-locked consumer remains. Refused, naming each "
    "missing condition; resumable (launch it again). The way back: the backfill job (restores from Iceberg).",
    tags={"lakehouse/area": "rollout"},
)
def complete_job():
    complete_op()
