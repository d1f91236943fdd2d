"""Gates that hold after the flip, in the UI: the ``native_safety`` sensor and its report job.

Every minute the sensor lists the datasets written iceberg-native that fail the write-flip gates that
still apply to them (routing/native_guard.py: a dataset created in or moved to a native workspace, a new
pipeline input, a reader lowered by hand). Their native writes are refused by the write router; this makes
them visible before a write is even attempted.

- none: the tick is skipped with the count of native datasets checked;
- some, new or changed since the last report: a ``native_safety_report`` run, which fails with one line per
  dataset (name, id, reasons) in its log and a table in its failure metadata — a red run in the Runs list,
  tagged ``lakehouse/report=native_safety`` and with the count;
- the same as already reported: the tick is skipped, its message naming them (the Sensors tab shows it).
"""

import json

import dagster as dg

from lakehouse_dagster.api.reads import report_key, report_lines, unsafe_native_datasets
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.shared.outage import skip_while_postgres_is_down
from lakehouse_dagster.dagster.defs.shared.refusals import stop

REPORT_TAG = "lakehouse/report"
_SHOWN = 20  # datasets named in a tick message or a failure description (the count says how many more)


def _summary(n_native: int, lines: list[str]) -> str:
    shown = "; ".join(lines[:_SHOWN]) + (f"; ... and {len(lines) - _SHOWN} more" if len(lines) > _SHOWN else "")
    return (
        f"{len(lines)} of {n_native} dataset(s) written iceberg-native fail the write-flip gates (their native "
        f"writes are refused): {shown}"
    )


@dg.op(description="List every dataset written iceberg-native that fails the write-flip gates; fails if any.")
def native_safety_check(context: dg.OpExecutionContext, lakehouse: LakehouseResource) -> dict:
    with lakehouse.connect() as conn:
        n_native, blocked = unsafe_native_datasets(conn)
    lines = report_lines(blocked)
    for line in lines:
        context.log.error(f"native-unsafe: {line}")
    if not blocked:
        context.log.info(f"all {n_native} dataset(s) written iceberg-native pass the write-flip gates")
        return {"native": n_native, "unsafe": 0}
    table = "| dataset | id | reasons |\n|---|---|---|\n" + "\n".join(
        f"| {b.name} | {b.dataset_id} | {'<br>'.join(r.replace('|', '/') for r in b.reasons)} |" for b in blocked
    )
    raise stop(
        context,
        _summary(n_native, lines),
        {"native datasets": str(n_native), "unsafe datasets": str(len(blocked)), "datasets": table},
    ) from None


@dg.job(
    description="Report the datasets written iceberg-native that fail the write-flip gates (launched by the "
    "native_safety sensor; launch it by hand any time).",
    tags={REPORT_TAG: "native_safety"},
)
def native_safety_report():
    native_safety_check()


@dg.sensor(
    job=native_safety_report,
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Datasets written iceberg-native that fail the write-flip gates (a dataset added to a native "
    "scope, a new pipeline input, a reader lowered by hand): their native writes are refused.",
)
@skip_while_postgres_is_down
def native_safety(context: dg.SensorEvaluationContext, lakehouse: LakehouseResource):
    with lakehouse.connect() as conn:
        n_native, blocked = unsafe_native_datasets(conn)
    last = json.loads(context.cursor) if context.cursor else {}
    if not blocked:
        if last.get("key"):  # resolved: the same datasets failing again later are reported again
            context.update_cursor(json.dumps({**last, "key": None}))
        return dg.SkipReason(
            f"all {n_native} dataset(s) written iceberg-native pass the write-flip gates"
            if n_native
            else "no dataset is written iceberg-native"
        )
    lines = report_lines(blocked)
    key = report_key(blocked)
    if last.get("key") == key:
        return dg.SkipReason(f"{_summary(n_native, lines)} (reported in run key {last.get('run_key')})")
    run_key = f"native-unsafe:{int(last.get('reports', 0)) + 1}:{key}"
    context.update_cursor(json.dumps({"key": key, "run_key": run_key, "reports": int(last.get("reports", 0)) + 1}))
    context.log.warning(_summary(n_native, lines))
    return dg.RunRequest(run_key=run_key, tags={REPORT_TAG: "native_safety", "lakehouse/unsafe": str(len(blocked))})
