"""Red without waiting for a run: the snapshot_freshness check of the flipped datasets, evaluated on a timer.

Readers of a flipped dataset may be served from Iceberg; if the mirror stops, its Iceberg view ages while nothing
runs, and a check evaluated only by runs would stay green. Every minute this sensor evaluates the check itself
(dagster/defs/parity/checks.py ``freshness_result``, parity/health.py: the same logic and metadata as the check) and
records the results, which belong to no run, on the datasets' partitions of iceberg/dataset_table:

* flipped datasets lagging past LAKEHOUSE_LAGGING_AFTER_SECONDS (status/lag.py) whose check is not already failed,
  oldest Iceberg view first: the check fails on the partition, no run needed;
* flipped datasets whose check is failed but that are settled again (caught up, within the threshold, native) — say
  synced outside Dagster: the check passes again.

At most ``PER_TICK`` evaluations per tick (each pins the dataset's Iceberg table); the others wait for the next tick.
Dagster's own record of each partition's latest result is the memory, so nothing is reported twice.

Not through ``SensorResult(asset_events=...)``: Dagster 1.13 files every runless check result under run id "", and
its storage refuses a second one on the same partition (dagster/private_apis.py ``dagster_report_check_result`` files
each under a placeholder run id ``runless-<uuid>`` instead). The tick's skip message says what was recorded.
"""

import uuid

import dagster as dg

from lakehouse_dagster.api.status import flipped_freshness
from lakehouse_dagster.dagster.defs.parity.checks import freshness_result
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.shared.keys import ICEBERG_TABLE
from lakehouse_dagster.dagster.defs.shared.outage import skip_while_postgres_is_down
from lakehouse_dagster.dagster.defs.shared.partitions import DATASETS
from lakehouse_dagster.dagster.defs.shared.tags import dataset_metadata
from lakehouse_dagster.dagster.private_apis import dagster_report_check_result

CHECK = "snapshot_freshness"
CHECK_KEY = dg.AssetCheckKey(ICEBERG_TABLE, CHECK)
PER_TICK = 20  # evaluations per tick (~0.1-0.3 s each: the table is loaded); the sensor's deadline is 60 s


def failing_partitions(instance: dg.DagsterInstance, keys: list[str]) -> set[str]:
    """Among ``keys``, the partitions whose latest snapshot_freshness result is a failure (one storage query)."""
    if not keys:
        return set()
    infos = instance.event_log_storage.get_asset_check_partition_info([CHECK_KEY], partition_keys=keys)
    return {i.partition_key for i in infos if i.partition_key and i.latest_execution_status.value == "FAILED"}


def due(instance: dg.DagsterInstance, lakehouse: LakehouseResource, limit: int = PER_TICK) -> list[str]:
    """The partitions to evaluate now: lagging ones not yet failed (oldest first), then failed ones settled again."""
    settings = lakehouse.settings()
    with lakehouse.connect() as conn:
        ff = flipped_freshness(conn, settings.mirror.lagging_after_seconds)
    known = set(instance.get_dynamic_partitions(DATASETS))  # once per tick
    lagging = [str(b.dataset_id) for b in ff.lagging if str(b.dataset_id) in known]
    settled = sorted(str(d) for d in ff.settled if str(d) in known)
    failing = failing_partitions(instance, lagging + settled)
    return ([k for k in lagging if k not in failing] + [k for k in settled if k in failing])[:limit]


def evaluations(lakehouse: LakehouseResource, keys: list[str]) -> list[dg.AssetCheckEvaluation]:
    """The check of each dataset as a runless evaluation on its partition (one connection for all of them). A
    dataset whose check cannot see the data (its table does not load...) fails with the reason, never passes, and
    does not stop the others."""
    max_lag = lakehouse.settings().mirror.lagging_after_seconds
    out = []
    with lakehouse.connect() as conn:
        for key in keys:
            try:
                r = freshness_result(lakehouse, str(uuid.UUID(key)), max_lag, conn=conn)
            except Exception as exc:  # noqa: BLE001 - said on the partition, the others go on
                reason = " ".join(str(exc).split()) or type(exc).__name__
                r = dg.AssetCheckResult(
                    passed=False,
                    severity=dg.AssetCheckSeverity.WARN,
                    description=f"the freshness check could not see the data: {type(exc).__name__}: {reason}",
                    metadata=dataset_metadata(conn, key),
                )
            out.append(
                dg.AssetCheckEvaluation(
                    asset_key=ICEBERG_TABLE,
                    check_name=CHECK,
                    passed=r.passed,
                    severity=r.severity,
                    description=r.description,
                    metadata={**r.metadata, "evaluated_by": dg.MetadataValue.text("flipped_freshness_checks sensor")},
                    partition=key,
                )
            )
    return out


@dg.sensor(
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Every minute, the snapshot_freshness check of flipped datasets lagging past "
    "LAKEHOUSE_LAGGING_AFTER_SECONDS, without a run (at most 20 per tick, oldest first), and of failed ones "
    "settled again.",
)
@skip_while_postgres_is_down
def flipped_freshness_checks(context: dg.SensorEvaluationContext, lakehouse: LakehouseResource):
    keys = due(context.instance, lakehouse)
    if not keys:
        return dg.SkipReason("nothing to record: the snapshot_freshness results of the flipped datasets are current")
    events = evaluations(lakehouse, keys)
    for e in events:
        dagster_report_check_result(context.instance, e)
    failed = [str(e.metadata["dataset_name"].value) for e in events if not e.passed]
    passed = [str(e.metadata["dataset_name"].value) for e in events if e.passed]
    parts = [
        f"{len(names)} {what} ({', '.join(names[:10])}{', …' if len(names) > 10 else ''})"
        for what, names in (("failed", failed), ("passed again", passed))
        if names
    ]
    return dg.SkipReason(
        f"recorded snapshot_freshness of {len(events)} flipped dataset(s) without a run: " + "; ".join(parts)
    )
