"""parity_canary_batch_job: the parity, snapshot_freshness and identity_ready checks of many datasets in one run,
one process (what the canary schedule launches).

A run per dataset cost seconds of run start-up for a check of a fraction of a second, and a global flip of 10,000
datasets queued 10,000 runs every 30 minutes (issue 22). This job's one op checks a list of datasets through the same
``check_evaluations`` the mirror batch uses: each verdict is recorded in lakehouse_read_parity (source ``schedule``
when the schedule launched the run), a MISMATCH rolls back what serves it (runbooks/auto_rollback.py), and each
result is logged against the dataset's partition of ``iceberg/dataset_table``. Any check that ends ERROR (a MISMATCH,
no snapshot, an error, identity not ready), or a dataset that could not be checked at all, fails the run once every
other dataset has been checked, naming them: a MISMATCH never hides in a green run.
"""

import dagster as dg

from lakehouse_dagster.api.datasets import names_of
from lakehouse_dagster.api.parity import wedged_syncs
from lakehouse_dagster.core.errors import BadInput
from lakehouse_dagster.core.ids import parse_uuid
from lakehouse_dagster.dagster.defs.parity.checks import CANARY_TAG, FULL_TAG, check_evaluations
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.shared.refusals import check_errors_line, refuse
from lakehouse_dagster.dagster.launcher.event_writes import pooled_event_writes

_SHOWN = 10  # datasets named in a failure line (the count says how many more)


class CanaryBatchConfig(dg.Config):
    """The datasets (uuids) to check; ``full``: digest every row on both sides (else the maintained digests, with a
    full cross-check every 8th scheduled verdict of a dataset)."""

    datasets: list[str]
    full: bool = False


@dg.op(
    out={},
    description="Check each listed dataset (parity, snapshot_freshness, identity_ready) and record the verdicts; "
    "fails, naming them, if any check ends ERROR, after every dataset was checked.",
)
def check_datasets(context: dg.OpExecutionContext, config: CanaryBatchConfig, lakehouse: LakehouseResource):
    scheduled = context.run.tags.get(CANARY_TAG) == "schedule"
    full = config.full or context.run.tags.get(FULL_TAG) == "true"
    try:
        ids = list(dict.fromkeys(parse_uuid(d, "dataset id") for d in config.datasets))
    except BadInput as exc:  # a launchpad typo: nothing checked, nothing recorded
        raise refuse(f"{exc}; nothing was checked") from None
    settings = lakehouse.settings()
    logged: list[dg.AssetCheckEvaluation] = []
    crashed: list[str] = []
    verdicts: dict[str, int] = {}
    with pooled_event_writes(context.instance), lakehouse.connect() as conn:
        names: dict = names_of(conn, ids)
        gone = [d for d in ids if d not in names]
        if gone and not scheduled:
            raise refuse(
                f"{len(gone)} dataset(s) do not exist: {', '.join(map(str, gone[:_SHOWN]))} (check the ids with: "
                "lakehouse datasets); nothing was checked"
            ) from None
        if gone:  # deleted since the tick asked for them
            context.log.warning(
                f"{len(gone)} dataset(s) no longer exist, skipped: {', '.join(map(str, gone[:_SHOWN]))}"
            )
        todo = [d for d in ids if d in names]
        wedged = {
            w["dataset_id"] for w in wedged_syncs(conn, settings.mirror.wedged_after_seconds)
        }  # once, not per dataset
        for d in todo:
            try:
                evaluations = check_evaluations(
                    lakehouse,
                    str(d),
                    run_id=context.run_id,
                    log=context.log,
                    instance=context.instance,
                    conn=conn,
                    wedged=wedged,
                    source="schedule" if scheduled else "check",
                    full=full,
                )
            except Exception as exc:  # one dataset's failure must not leave the others unchecked
                crashed.append(f"{names[d]} ({d}): {type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
                context.log.error(f"could not check {names[d]} ({d}): {type(exc).__name__}: {exc}")
                continue
            for e in evaluations:
                if e.check_name == "parity":
                    raw = (e.metadata or {}).get("verdict")
                    verdict = str(getattr(raw, "value", raw))
                    verdicts[verdict] = verdicts.get(verdict, 0) + 1
            logged += evaluations
            yield from evaluations
    # One summary line, not one per dataset: every log line is an event the instance stores.
    context.log.info(
        f"checked {len(todo) - len(crashed)} of {len(ids)} dataset(s)"
        + (" (full cross-check)" if full else "")
        + ": "
        + (", ".join(f"{k}={n}" for k, n in sorted(verdicts.items())) or "no verdicts")
    )
    problems = []
    if crashed:
        more = f"; … and {len(crashed) - _SHOWN} more" if len(crashed) > _SHOWN else ""
        problems.append(
            f"{len(crashed)} of {len(todo)} dataset(s) could not be checked: {'; '.join(crashed[:_SHOWN])}{more}; "
            "the others were checked (their errors are in the run's log)"
        )
    checks_line = check_errors_line(logged, len(todo) - len(crashed), rest="the other datasets were checked")
    if checks_line:
        problems.append(checks_line)
    if problems:
        raise refuse("\n".join(problems)) from None


@dg.job(
    executor_def=dg.in_process_executor,
    description="Check many datasets in one run, one process (launched by parity_canary_schedule; each result is "
    "logged on the dataset's partition of iceberg/dataset_table).",
)
def parity_canary_batch_job():
    check_datasets()
