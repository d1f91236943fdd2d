"""Asset checks on the Iceberg table asset, partitioned like it: parity (blocking), snapshot_freshness,
identity_ready (blocking). Dagster glue only: the logic is in parity/.

A blocking check whose result is ERROR stops downstream assets *in the same run* only; runs launched
by declarative automation and op-based jobs are not gated by it (Dagster 1.13) — the runbook jobs read
the recorded verdicts (parity.canary.latest_verdicts) themselves.
"""

import contextlib

import dagster as dg

from lakehouse_dagster.api import parity as canary  # the canary's face: its names load on first use
from lakehouse_dagster.api.parity import DEFAULT_MAX_LAG_SECONDS, lines_of, pin_iceberg
from lakehouse_dagster.api.parity import identity_ready as _identity_ready
from lakehouse_dagster.api.parity import snapshot_freshness as _snapshot_freshness
from lakehouse_dagster.core.ids import parse_uuid
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.shared.keys import ICEBERG_TABLE
from lakehouse_dagster.dagster.defs.shared.partitions import datasets_partitions
from lakehouse_dagster.dagster.defs.shared.tags import dataset_metadata, ids_as_text, name_run

CANARY_TAG = "lakehouse/canary"  # set by the canary schedule: verdicts it records say source=schedule
AUTO_ROLLBACK_TAG = "lakehouse/auto_rollback"  # added to a run whose parity check rolled readers back
# "true": digest every row on both sides instead of comparing the maintained digests (parity/maintained.py);
# the schedule does so by itself every cy.FULL_EVERY-th run of a dataset.
FULL_TAG = "lakehouse/canary-full"

_SEVERITY = {
    canary.OK: dg.AssetCheckSeverity.ERROR,  # (passed)
    canary.NATIVE: dg.AssetCheckSeverity.ERROR,  # (passed: Postgres is not authoritative)
    canary.LAGGING: dg.AssetCheckSeverity.WARN,  # a write landed after the sync: benign, not blocking
    canary.NO_SNAPSHOT: dg.AssetCheckSeverity.ERROR,  # cannot see the data: never a pass
    canary.MISMATCH: dg.AssetCheckSeverity.ERROR,
    canary.ERROR: dg.AssetCheckSeverity.ERROR,
}


def _meta(v: canary.Verdict) -> dict:
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
    "transaction and a pinned Iceberg snapshot (the maintained digests when both sides have them; every row "
    "with run tag lakehouse/canary-full=true and every Nth scheduled run). ERROR (blocks downstream) on "
    "MISMATCH, no-snapshot or error; WARN when lagging. Recorded in lakehouse_read_parity.",
)
def parity(context: dg.AssetCheckExecutionContext, lakehouse: LakehouseResource) -> dg.AssetCheckResult:
    source = "schedule" if context.run.tags.get(CANARY_TAG) == "schedule" else "check"
    with lakehouse.connect() as conn:
        named = name_run(context, conn, context.partition_key)
    return parity_result(
        lakehouse,
        context.partition_key,
        run_id=context.run.run_id,
        source=source,
        log=context.log,
        full=context.run.tags.get(FULL_TAG) == "true",
        named=named,
        instance=context.instance,
    )


def parity_result(
    lakehouse: LakehouseResource,
    partition_key: str,
    *,
    run_id: str,
    source: str,
    log,
    full: bool = False,
    named: dict | None = None,
    instance=None,
    conn=None,
    pin=None,
    wedged: set | None = None,
    log_verdict: bool = True,
) -> dg.AssetCheckResult:
    """The parity check of one dataset, recorded in lakehouse_read_parity (the check and the batch job); a MISMATCH
    rolls back what serves it from Iceberg (runbooks/auto_rollback.py), said in the metadata and a run tag. A batch
    passes its connection, the dataset's Iceberg pin and the wedged datasets it looked up once for all."""
    dsn, settings = lakehouse.pg_dsn, lakehouse.settings()
    with _conn(lakehouse, conn) as conn:
        if source == "schedule" and not full:
            full = canary.full_due(conn, _uuid(partition_key))
        v = canary.evaluate(dsn, lakehouse.catalog(), settings, partition_key, full=full, pin=pin, conn=conn)
        if wedged is None:
            wedged = {w["dataset_id"] for w in canary.wedged_syncs(conn, settings.mirror.wedged_after_seconds)}
        v.wedged = v.dataset_id in wedged
        canary.record_and_roll_back(conn, v, source=source, run_id=run_id, settings=settings)
        if named is None:
            named = dataset_metadata(conn, partition_key)
    if log_verdict:  # (a batch logs one line for all: every log line is a stored event)
        log.info(f"parity ds={v.dataset_id} verdict={v.verdict}: {v.detail.get('reason', '')}")
    meta, rolled = {**named, **ids_as_text(_meta(v))}, lines_of(v)
    for line in rolled:
        (log.error if "AUTO-ROLLBACK" in line else log.warning)(line)
    if rolled:  # what was rolled back, readable in the check's metadata and findable in the runs list
        meta["auto_rollback"] = dg.MetadataValue.md("\n".join(f"- {line}" for line in rolled))
        done = [a["flag"] for a in v.detail["auto_rollback"]["rolled_back"]]
        if done and instance is not None:
            instance.add_run_tags(run_id, {AUTO_ROLLBACK_TAG: ",".join(done)})
    return dg.AssetCheckResult(
        passed=v.verdict in (canary.OK, canary.NATIVE),
        severity=_SEVERITY[v.verdict],
        description=f"{v.verdict}: {v.detail.get('reason', '')}" + "".join(f"\n{line}" for line in rolled),
        metadata=meta,
    )


def _conn(lakehouse: LakehouseResource, conn):
    """The caller's connection (a batch reuses one), else a new one closed after use."""
    return contextlib.nullcontext(conn) if conn is not None else lakehouse.connect()


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
    with lakehouse.connect() as conn:
        named = name_run(context, conn, context.partition_key)
    return freshness_result(lakehouse, context.partition_key, config.max_lag_seconds, named)


def freshness_result(
    lakehouse: LakehouseResource,
    partition_key: str,
    max_lag_seconds: int = DEFAULT_MAX_LAG_SECONDS,
    named: dict | None = None,
    *,
    conn=None,
    pin=None,
) -> dg.AssetCheckResult:
    with _conn(lakehouse, conn) as conn:
        h = _snapshot_freshness(
            conn, lakehouse.catalog(), lakehouse.settings(), _uuid(partition_key), max_lag_seconds, pin=pin
        )
        named = dataset_metadata(conn, partition_key) if named is None else named
    return dg.AssetCheckResult(
        passed=h.passed,
        severity=dg.AssetCheckSeverity.WARN,
        description=h.description,
        metadata={**named, **ids_as_text(h.metadata)},
    )


@dg.asset_check(
    asset=ICEBERG_TABLE,
    name="identity_ready",
    blocking=True,
    partitions_def=datasets_partitions,
    description="Identity columns __row_index/__row_id/__created_at present with their types, non-null in "
    "every row, __row_index unique (runbook: icebergIdentityReady). ERROR.",
)
def identity_ready(context: dg.AssetCheckExecutionContext, lakehouse: LakehouseResource) -> dg.AssetCheckResult:
    with lakehouse.connect() as conn:
        named = name_run(context, conn, context.partition_key)
    return identity_result(lakehouse, context.partition_key, named)


def identity_result(
    lakehouse: LakehouseResource, partition_key: str, named: dict | None = None, *, conn=None, pin=None
) -> dg.AssetCheckResult:
    with _conn(lakehouse, conn) as conn:
        h = _identity_ready(lakehouse.catalog(), lakehouse.settings(), _uuid(partition_key), conn, pin=pin)
        if named is None:
            named = dataset_metadata(conn, partition_key)
    return dg.AssetCheckResult(
        passed=h.passed,
        severity=dg.AssetCheckSeverity.ERROR,
        description=h.description,
        metadata={**named, **ids_as_text(h.metadata)},
    )


def _uuid(key: str):

    return parse_uuid(key, "partition key (dataset id)")


PARITY_CHECKS = [parity, snapshot_freshness, identity_ready]


def check_evaluations(
    lakehouse: LakehouseResource,
    partition_key: str,
    *,
    run_id: str,
    log,
    instance=None,
    conn=None,
    wedged: set | None = None,
    source: str = "check",
    full: bool = False,
) -> list[dg.AssetCheckEvaluation]:
    """The three checks of one dataset as events an op logs (mirror_batch_job, parity_canary_batch_job): the same
    logic and records as the asset checks, attached to the dataset's partition, so the UI shows them on the asset as
    usual. The three read one Iceberg pin of the dataset (the table loaded and its files listed once) and, when the
    batch passes them, its Postgres connection and wedged datasets. ``source``: what the parity verdict is recorded
    as (``schedule`` for the canary schedule's runs: every Nth is a full cross-check)."""
    settings = lakehouse.settings()
    pin = pin_iceberg(lakehouse.catalog(), settings, _uuid(partition_key))
    with _conn(lakehouse, conn) as conn:
        named = dataset_metadata(conn, partition_key)
        results = [
            (
                "parity",
                True,
                parity_result(
                    lakehouse,
                    partition_key,
                    run_id=run_id,
                    source=source,
                    log=log,
                    full=full,
                    instance=instance,
                    conn=conn,
                    pin=pin,
                    wedged=wedged,
                    named=named,
                    log_verdict=False,
                ),
            ),
            ("snapshot_freshness", False, freshness_result(lakehouse, partition_key, named=named, conn=conn, pin=pin)),
            ("identity_ready", True, identity_result(lakehouse, partition_key, named, conn=conn, pin=pin)),
        ]
    return [
        dg.AssetCheckEvaluation(
            asset_key=ICEBERG_TABLE,
            check_name=name,
            passed=r.passed,
            metadata=r.metadata,
            severity=r.severity,
            description=r.description,
            blocking=blocking,
            partition=partition_key,
        )
        for name, blocking, r in results
    ]
