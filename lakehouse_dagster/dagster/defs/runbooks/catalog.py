"""`lakehouse catalog migrate` as a job: every dataset's table moved between the SQL and the REST catalog, the same core
function as the CLI (runbooks/catalog_migrate.py; docs/catalog-cutover.md). The REST catalog's URL and credential come
from the run worker's environment (LAKEHOUSE_CATALOG_URI, LAKEHOUSE_CATALOG_CREDENTIAL), never from the run's config.
(No ``from __future__ import annotations``: Dagster reads the Config annotations at runtime.)
"""

from typing import Optional

import dagster as dg
from pydantic import Field

from lakehouse_dagster.api.lake import migrate
from lakehouse_dagster.core.errors import LakehouseError
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.shared.refusals import refuse
from lakehouse_dagster.dagster.defs.shared.tables import table


class CatalogMigrateConfig(dg.Config):
    to: str = Field(default="rest", description="the catalog to move to: rest, or sql (the way back)")
    how: str = Field(default="register", description="register (the current metadata file) or replay (SeaweedFS)")
    dry_run: bool = Field(default=False, description="list what would move; change nothing")
    warehouse: Optional[str] = Field(default=None, description="the target's warehouse (default LAKEHOUSE_WAREHOUSE)")
    workers: int = Field(default=1, description="tables moved at once, each under its own lock")


@dg.op(description="Move (or catch up) each dataset's table under its lock (G3), verify it, canary on the target.")
def catalog_migrate_op(context: dg.OpExecutionContext, config: CatalogMigrateConfig, lakehouse: LakehouseResource):
    try:
        moved = migrate(
            lakehouse.pg_dsn,
            lakehouse.settings(),
            to=config.to,
            how=config.how,
            dry_run=config.dry_run,
            warehouse=config.warehouse,
            workers=config.workers,
        )
    except LakehouseError as exc:
        raise refuse(exc) from None
    for m in moved:
        (context.log.warning if m.outcome in ("busy", "failed") else context.log.info)(m.line())
    rows = [{k: ("" if v is None else v) for k, v in m.as_dict().items()} for m in moved]
    columns = [("dataset_id", "string"), ("table", "string"), ("outcome", "string"), ("snapshots", "int")]
    columns += [("files", "int"), ("verdict", "string"), ("detail", "string")]
    context.add_output_metadata({"datasets": table(rows, columns)})
    left = [m for m in moved if m.outcome in ("busy", "failed")]
    if left:
        raise refuse(f"{len(left)} table(s) not moved (busy or failed): launch the job again\n" + left[0].line())
    return [m.as_dict() for m in moved]


@dg.job(
    name="catalog_migrate",
    description="The Fase 4 catalog cutover (docs/catalog-cutover.md): each dataset's Iceberg table moved to the "
    "other catalog without rewriting data, per table under its lock, verified by file set and canary; resumable.",
    tags={"lakehouse/area": "rollout"},
)
def catalog_migrate_job():
    catalog_migrate_op()
