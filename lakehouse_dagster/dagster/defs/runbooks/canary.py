"""Runbook steps as jobs, besides the flips: the canary (Fase 1 step 2, Fase 4 step 3) and `read` (Fase 1 step 3b:
exercise a reader and see the router's decision), each the same function as its `lakehouse` command, so a job and
the CLI say the same thing. (No ``from __future__ import annotations`` here: Dagster reads the Config annotations.)
"""

from enum import Enum
from typing import Optional

import dagster as dg
from pydantic import Field

from lakehouse_dagster.api import parity as canary  # the canary's face: its names load on first use
from lakehouse_dagster.api.flags import READERS
from lakehouse_dagster.api.parity import SMOKE_MAX_ROWS, lines_of, run_canary_and_roll_back
from lakehouse_dagster.api.reads import read_through_router
from lakehouse_dagster.core.errors import LakehouseError
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.shared.refusals import refuse, stop
from lakehouse_dagster.dagster.defs.shared.tables import logged_table, table
from lakehouse_dagster.dagster.defs.shared.tags import READER, dataset_tags, tag_run, text

VERDICT_COLUMNS = [
    ("name", "string"),
    ("dataset_id", "string"),
    ("verdict", "string"),
    ("pg_rows", "int"),
    ("iceberg_rows", "int"),
    ("smoke", "string"),
    ("snapshot_id", "string"),
    ("pg_version", "string"),
    ("detail", "string"),
]


class CanaryConfig(dg.Config):
    datasets: list[str] = Field(
        default_factory=list, description="dataset ids to check; empty: a random sample of synced datasets (limit)"
    )
    limit: int = Field(default=canary.DEFAULT_LIMIT, description="sample size when no dataset is given")
    smoke: bool = Field(default=True, description="also compare the value multiset (datasets up to smoke_max_rows)")
    smoke_max_rows: int = Field(default=SMOKE_MAX_ROWS, description="size threshold of the value-level check")
    full: bool = Field(default=False, description="digest every row on both sides instead of the maintained digests")


@dg.op(description="`lakehouse canary`: verdicts per dataset, recorded; a MISMATCH rolls its readers back and fails.")
def canary_op(context: dg.OpExecutionContext, config: CanaryConfig, lakehouse: LakehouseResource) -> dict:
    with lakehouse.connect() as conn:
        if len(config.datasets) == 1:
            tag_run(context, dataset_tags(conn, config.datasets[0]))
        try:
            report = run_canary_and_roll_back(
                conn,
                lakehouse.pg_dsn,
                lakehouse.catalog(),
                lakehouse.settings(),
                dataset_ids=config.datasets or None,
                limit=config.limit,
                smoke=config.smoke,
                smoke_max_rows=config.smoke_max_rows,
                full=config.full,
                run_id=context.run_id,
            )
        except LakehouseError as exc:
            raise refuse(exc) from None
    rows = [
        {
            "name": r.dataset,
            "dataset_id": str(r.dataset_id),
            "verdict": r.verdict + (" (wedged)" if r.wedged else ""),
            "pg_rows": r.pg_count,
            "iceberg_rows": r.iceberg_count,
            "smoke": r.smoke,
            "snapshot_id": r.snapshot_id,
            "pg_version": r.pg_version,
            "detail": r.detail.get("reason", ""),
        }
        for r in report.results
    ]
    bad = (canary.MISMATCH, canary.ERROR)
    verdicts = logged_table(context, "canary", rows, VERDICT_COLUMNS, warn=lambda r: r["verdict"] in bad)
    for r in report.results:
        for line in lines_of(r):  # what auto-rollback did
            context.log.warning(line)
    for w in report.wedged:
        context.log.warning(
            f"wedged: dataset {w['dataset_id']} sync {w['sync_id']} {w['status']} for {w['stuck_seconds']} s"
        )
    if not report.results:
        context.log.info("no datasets to check (nothing synced yet? run: lakehouse sync --dataset <uuid>)")
    meta = {
        **{f"verdict_{k}": n for k in canary.VERDICTS if (n := sum(r.verdict == k for r in report.results))},
        "summary": report.summary_line(),
        "verdicts": verdicts,
    }
    context.log.info(report.summary_line())
    named = [f"{r.dataset} ({r.dataset_id}): {r.verdict}" for r in report.results if r.verdict in bad]
    if report.exit_code == canary.EXIT_MISMATCH:
        raise stop(
            context,
            "MISMATCH on a caught-up dataset: STOP, do not flip; investigate: " + "; ".join(named[:10]),
            meta,
        ) from None
    if report.exit_code == canary.EXIT_ERROR:
        raise stop(
            context,
            "some datasets could not be checked (verdict error), so the canary did not pass them: "
            + "; ".join(named[:10]),
            meta,
        ) from None
    context.add_output_metadata(meta)
    return report.as_dict()


@dg.job(
    name="canary",
    description="Runbook Fase 1 step 2 / Fase 4 step 3: `lakehouse canary` — parity verdicts for the given datasets "
    "or a sample, with the value-level smoke check on or off; every verdict recorded; a MISMATCH turns the "
    "dataset's Iceberg readers off (auto-rollback) and fails the run.",
    tags={"lakehouse/area": "rollout"},
)
def canary_job():
    canary_op()


Reader = Enum("Reader", {r: r for r in READERS})  # type: ignore[misc]  # built from the registry
_TYPES = {"int64": "int", "float64": "float", "boolean": "bool"}


class ReadConfig(dg.Config):
    reader: Reader = Field(description="the reader whose flag routes the read, e.g. export.stream")
    dataset_id: str = Field(description="dataset uuid")
    columns: Optional[str] = Field(default=None, description="comma-separated columns; empty: identity + every column")
    limit: int = Field(default=20, description="at most this many rows")
    order_by_row_index: bool = Field(default=False, description="order by __row_index (default: engine order)")


@dg.op(description="`lakehouse read`: one read through the read router — its decision (logged once) and the rows.")
def read_op(context: dg.OpExecutionContext, config: ReadConfig, lakehouse: LakehouseResource) -> dict:
    reader = config.reader.value
    with lakehouse.connect() as conn:
        tag_run(context, {READER: reader, **dataset_tags(conn, config.dataset_id)})
        try:
            result, dataset, proj = read_through_router(
                conn,
                lakehouse.catalog(),
                lakehouse.settings(),
                reader,
                config.dataset_id,
                columns=config.columns,
                limit=config.limit,
                order_by_row_index=config.order_by_row_index,
                logger=context.log,  # the router's one line per read (and a fallback's warning)
            )
        except LakehouseError as exc:
            raise refuse(exc) from None
    d = result.decision
    types = {c.name: _TYPES.get(c.type, "string") for c in dataset.columns}
    types.update({"__row_index": "int"})
    rows = result.value.to_pylist()
    context.add_output_metadata(
        {
            "dataset_name": dataset.name,
            "dataset_id": text(dataset.id),
            "reader": reader,
            "mode": d.mode,
            "source": d.source,
            "reason": d.reason,
            "snapshot_id": text(d.snapshot_id),
            "fallback_error": result.fallback_error or "",
            "rows_read": len(rows),
            "rows": table(rows, [(c, types.get(c, "string")) for c in proj.columns]),
        }
    )
    return {"decision": d.as_dict(), "fallback_error": result.fallback_error, "rows": len(rows)}


@dg.job(
    name="read",
    description="Runbook Fase 1 step 3b: exercise a reader on a dataset (`lakehouse read`) and show the read "
    "router's decision (iceberg@eventual, pg@no-snapshot, ...) and the rows it served.",
    tags={"lakehouse/area": "rollout"},
)
def read_job():
    read_op()
