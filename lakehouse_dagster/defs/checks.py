"""Asset checks on the Iceberg table asset, partitioned like it: parity (blocking), snapshot_freshness,
identity_ready (blocking). Dagster glue only: the logic is in parity/.

A blocking check whose result is ERROR stops downstream assets *in the same run* only; runs launched
by declarative automation and op-based jobs are not gated by it (FIELD-NOTES) — the runbook jobs read
the recorded verdicts (parity.canary.latest_verdicts) themselves.
"""


import dagster as dg

from ..parity import canary as cy
from ..parity.health import DEFAULT_MAX_LAG_SECONDS, identity_ready as _identity_ready
from ..parity.health import snapshot_freshness as _snapshot_freshness
from .partitions import datasets_partitions
from .resources import LakehouseResource

ICEBERG_TABLE = dg.AssetKey(["iceberg", "dataset_table"])  # the mirror's asset (defs/assets.py), by key
CANARY_TAG = "lakehouse/canary"  # set by the canary schedule: verdicts it records say source=schedule

_SEVERITY = {
    cy.OK: dg.AssetCheckSeverity.ERROR,  # (passed)
    cy.NATIVE: dg.AssetCheckSeverity.ERROR,  # (passed: Postgres is not authoritative)
    cy.LAGGING: dg.AssetCheckSeverity.WARN,  # a write landed after the sync: benign, not blocking
    cy.NO_SNAPSHOT: dg.AssetCheckSeverity.ERROR,  # cannot see the data: never a pass
    cy.MISMATCH: dg.AssetCheckSeverity.ERROR,
    cy.ERROR: dg.AssetCheckSeverity.ERROR,
}


def _meta(v: cy.Verdict) -> dict:
    return {
        "verdict": v.verdict,
        "pg_count": v.pg_count,
        "iceberg_count": v.iceberg_count,
        "pg_digest": None if v.pg_digest is None else str(v.pg_digest),
        "iceberg_digest": None if v.iceberg_digest is None else str(v.iceberg_digest),
        "snapshot_id": None if v.snapshot_id is None else str(v.snapshot_id),
        "pg_version": v.pg_version,
        "iceberg_version": v.iceberg_version,
        "mismatched_row_indexes": dg.MetadataValue.json(v.mismatched_row_indexes),
        "seconds": dg.MetadataValue.float(float(v.seconds)),
        "detail": dg.MetadataValue.json(v.detail),
    }


@dg.asset_check(
    asset=ICEBERG_TABLE,
    name="parity",
    blocking=True,
    partitions_def=datasets_partitions,
    description="Checksum parity with Postgres: row count + order-independent digest on a pinned Postgres "
    "transaction and a pinned Iceberg snapshot. ERROR (blocks downstream) on MISMATCH, no-snapshot or error; "
    "WARN when lagging. Recorded in lakehouse_read_parity.",
)
def parity(context: dg.AssetCheckExecutionContext, lakehouse: LakehouseResource) -> dg.AssetCheckResult:
    source = "schedule" if context.run.tags.get(CANARY_TAG) == "schedule" else "check"
    return parity_result(lakehouse, context.partition_key, run_id=context.run.run_id, source=source, log=context.log)


def parity_result(lakehouse: LakehouseResource, partition_key: str, *, run_id: str, source: str,
                  log) -> dg.AssetCheckResult:
    """The parity check of one dataset, recorded in lakehouse_read_parity (the check and the batch job)."""
    dsn, settings = lakehouse.pg_dsn, lakehouse.settings()
    v = cy.evaluate(dsn, lakehouse.catalog(), settings, partition_key)
    with lakehouse.connect() as conn:
        wedged = {w["dataset_id"] for w in cy.wedged_syncs(conn, settings.wedged_after_seconds)}
        v.wedged = v.dataset_id in wedged
        cy.record(conn, v, source=source, run_id=run_id)
    log.info(f"parity ds={v.dataset_id} verdict={v.verdict}: {v.detail.get('reason', '')}")
    return dg.AssetCheckResult(
        passed=v.verdict in (cy.OK, cy.NATIVE),
        severity=_SEVERITY[v.verdict],
        description=f"{v.verdict}: {v.detail.get('reason', '')}",
        metadata=_meta(v),
    )


class FreshnessConfig(dg.Config):
    """How old a snapshot may be while Iceberg is behind Postgres."""

    max_lag_seconds: int = DEFAULT_MAX_LAG_SECONDS


@dg.asset_check(
    asset=ICEBERG_TABLE,
    name="snapshot_freshness",
    partitions_def=datasets_partitions,
    description="A succeeded snapshot exists and Iceberg is caught up with Postgres, or behind by a snapshot "
    "no older than max_lag_seconds (config). WARN.",
)
def snapshot_freshness(
    context: dg.AssetCheckExecutionContext, config: FreshnessConfig, lakehouse: LakehouseResource
) -> dg.AssetCheckResult:
    return freshness_result(lakehouse, context.partition_key, config.max_lag_seconds)


def freshness_result(lakehouse: LakehouseResource, partition_key: str,
                     max_lag_seconds: int = DEFAULT_MAX_LAG_SECONDS) -> dg.AssetCheckResult:
    with lakehouse.connect() as conn:
        h = _snapshot_freshness(conn, lakehouse.catalog(), lakehouse.settings(), _uuid(partition_key), max_lag_seconds)
    return dg.AssetCheckResult(passed=h.passed, severity=dg.AssetCheckSeverity.WARN, description=h.description,
                               metadata=h.metadata)


@dg.asset_check(
    asset=ICEBERG_TABLE,
    name="identity_ready",
    blocking=True,
    partitions_def=datasets_partitions,
    description="Identity columns __row_index/__row_id/__created_at present with their types, non-null in "
    "every row, __row_index unique (runbook: icebergIdentityReady). ERROR.",
)
def identity_ready(context: dg.AssetCheckExecutionContext, lakehouse: LakehouseResource) -> dg.AssetCheckResult:
    return identity_result(lakehouse, context.partition_key)


def identity_result(lakehouse: LakehouseResource, partition_key: str) -> dg.AssetCheckResult:
    h = _identity_ready(lakehouse.catalog(), lakehouse.settings(), _uuid(partition_key))
    return dg.AssetCheckResult(passed=h.passed, severity=dg.AssetCheckSeverity.ERROR, description=h.description,
                               metadata=h.metadata)


def _uuid(key: str):
    from ..ids import parse_uuid

    return parse_uuid(key, "partition key (dataset id)")


PARITY_CHECKS = [parity, snapshot_freshness, identity_ready]


def check_evaluations(lakehouse: LakehouseResource, partition_key: str, *, run_id: str,
                      log) -> list[dg.AssetCheckEvaluation]:
    """The three checks of one dataset as events an op logs (mirror_batch_job): the same logic and records as
    the asset checks, attached to the dataset's partition, so the UI shows them on the asset as usual."""
    results = [
        ("parity", True, parity_result(lakehouse, partition_key, run_id=run_id, source="check", log=log)),
        ("snapshot_freshness", False, freshness_result(lakehouse, partition_key)),
        ("identity_ready", True, identity_result(lakehouse, partition_key)),
    ]
    return [
        dg.AssetCheckEvaluation(
            asset_key=ICEBERG_TABLE, check_name=name, passed=r.passed, metadata=r.metadata, severity=r.severity,
            description=r.description, blocking=blocking, partition=partition_key,
        )
        for name, blocking, r in results
    ]
