"""The read-flip runbook as a job: preflight canary → gated flip → verify, like `lakehouse flags flip`.

Op-based jobs are not gated by asset checks: the preflight op reads the canary itself and fails on
MISMATCH / error, so the flip op never runs. A failed verify leaves the flip in place (readers are
still served, by the Postgres fallback) and says how to roll back.
(No ``from __future__ import annotations`` here: Dagster reads the Config annotations at runtime.)
"""

import dataclasses
import uuid
from enum import Enum
from typing import Optional

import dagster as dg
from pydantic import Field

from lakehouse_dagster.api import flips, ingest_bench
from lakehouse_dagster.api.flags import PROVEN_READERS, READ, SERVABLE_READERS, WRITE
from lakehouse_dagster.api.flips import first_native_syncs, stop_message
from lakehouse_dagster.core.errors import LakehouseError
from lakehouse_dagster.dagster.defs.flags.flags import FlippableWriter, _actor
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.shared.refusals import refuse, stop
from lakehouse_dagster.dagster.defs.shared.tables import logged_table, table
from lakehouse_dagster.dagster.defs.shared.tags import flag_tags, tag_run, text

# the compute readers too (issue 43): their flip is gated on proven shadow consistency like any CLI flip
FlippableReader = Enum(  # type: ignore[misc]  # built from the registry
    "FlippableReader", {r.name: r.name for r in (*SERVABLE_READERS, *PROVEN_READERS)}
)


PREFLIGHT_COLUMNS = [
    ("verdict", "string"),
    ("reused", "bool"),
    ("name", "string"),
    ("dataset_id", "string"),
    ("detail", "string"),
]
SCOPE_COLUMNS = [
    ("group", "string"),
    ("name", "string"),
    ("dataset_id", "string"),
    ("before", "string"),
    ("after", "string"),
    ("decided_by", "string"),
]
VERIFY_COLUMNS = [
    ("dataset_id", "string"),
    ("source", "string"),
    ("reason", "string"),
    ("snapshot_id", "string"),
    ("fallback_error", "string"),
]


def scope_rows(report) -> list[dict]:
    """What the flip does to each dataset of its scope (flags/flip_scope.py), one row per dataset."""
    groups = (
        ("moves", report.moved),
        ("pinned", report.pinned),
        ("already", report.already),
        ("not applicable", report.not_applicable),
    )
    return [{**dataclasses.asdict(d), "group": g, "dataset_id": str(d.dataset_id)} for g, ds in groups for d in ds]


class ReadMode(Enum):
    iceberg = "iceberg"
    iceberg_only = "iceberg_only"


class FlipScopeConfig(dg.Config):
    """Where a flip applies and how its preflight runs (shared by read_flip and write_flip)."""

    dataset_id: Optional[str] = Field(default=None, description="flip for one dataset (runbook step 3)")
    workspace_id: Optional[str] = Field(default=None, description="or a workspace (step 4); neither: global")
    note: Optional[str] = Field(default=None, description="why, kept with the override and in the audit")
    smoke: bool = Field(default=True, description="the value-level check in the preflight canary (small datasets)")
    reuse_verdicts_minutes: int = Field(default=60, description="reuse ok verdicts this recent at an unchanged version")
    max_datasets: int = Field(default=500, description="refuse a flip whose preflight would canary more datasets")
    sample: int = Field(
        default=20,
        description="a workspace/global widen canaries this many moved datasets at "
        "random afresh, plus every one with no recent ok verdict",
    )


class ReadFlipConfig(FlipScopeConfig):
    reader: FlippableReader = Field(description="the reader to flip (only readers Iceberg can serve)")
    mode: ReadMode = Field(default=ReadMode.iceberg, description="iceberg keeps the PG fallback; iceberg_only drops it")


def _preflight(context, lakehouse: LakehouseResource, config, kind: str, name: str, mode: str) -> dict:
    settings = lakehouse.settings()
    with lakehouse.connect() as conn:
        tag_run(context, flag_tags(conn, kind, name, config.dataset_id, config.workspace_id))
        try:
            pre = flips.preflight(
                conn,
                lakehouse.pg_dsn,
                lakehouse.catalog(),
                settings,
                name,
                mode,
                kind=kind,
                dataset=config.dataset_id,
                workspace=config.workspace_id,
                smoke=config.smoke,
                reuse_minutes=config.reuse_verdicts_minutes,
                max_datasets=config.max_datasets,
                sample=config.sample,
                run_id=context.run_id,
            )
        except LakehouseError as exc:
            raise refuse(exc) from None
    context.log.info(pre.report.counts_line())
    meta = {
        **{f"verdict_{k}": v for k, v in pre.counts().items() if v},
        "datasets_moved": len(pre.checked),
        "coverage": pre.coverage(),
        "preflight": logged_table(context, "preflight", [c.as_dict() for c in pre.checked], PREFLIGHT_COLUMNS),
        "scope": logged_table(context, "scope", scope_rows(pre.report), SCOPE_COLUMNS),
    }
    for c in pre.inert:
        context.log.warning(
            f"{c.name} ({c.dataset_id}): {c.verdict} — the flip is inert for it (Postgres serves) "
            "until the mirror catches up"
        )
    if not pre.go:
        raise stop(context, pre.stop_message(), meta) from None
    context.add_output_metadata(meta)
    return {
        "name": pre.name,
        "kind": pre.kind,
        "mode": pre.mode,
        "scope": pre.scope.scope,
        "scope_id": str(pre.scope.scope_id) if pre.scope.scope_id else None,
        "note": config.note,
        "datasets": [str(i) for i in flips.moved_ids(pre)],
        "preflight": pre,
    }


@dg.op(description="Canary (--smoke) over every dataset the flip would move; MISMATCH or error stops the job.")
def read_flip_preflight(context: dg.OpExecutionContext, config: ReadFlipConfig, lakehouse: LakehouseResource) -> dict:
    return _preflight(context, lakehouse, config, READ, config.reader.value, config.mode.value)


def _set(context, preflight: dict, lakehouse: LakehouseResource) -> dict:
    pre: flips.Preflight = preflight["preflight"]
    with lakehouse.connect() as conn:
        try:
            change = flips.flip(
                conn,
                pre,
                note=preflight["note"],
                actor=_actor(context, lakehouse),
            )
        except LakehouseError as exc:
            raise refuse(exc) from None
    context.log.info(
        f"{change.flag.name}: {change.before or '(no override)'} → {change.after} ({pre.report.where}); "
        + pre.report.counts_line()
    )
    context.add_output_metadata(
        {
            "flag": change.flag.name,
            "scope": pre.report.where,
            "before": change.before or "(no override)",
            "after": change.after,
            "audit_id": text(change.audit.id if change.audit else None),  # (a set always writes one)
        }
    )
    return preflight


@dg.op(description="Set the reader's override behind the flip gates, audited with the run as actor.")
def read_flip_set(context: dg.OpExecutionContext, preflight: dict, lakehouse: LakehouseResource) -> dict:
    return _set(context, preflight, lakehouse)


@dg.op(description="One read per moved dataset (a sample of 20) through the read router: reason and fallbacks.")
def read_flip_verify(context: dg.OpExecutionContext, flipped: dict, lakehouse: LakehouseResource) -> list[dict]:
    pre: flips.Preflight = flipped["preflight"]
    with lakehouse.connect() as conn:
        verified = flips.verify(
            conn, lakehouse.catalog(), lakehouse.settings(), pre.name, flips.moved_ids(pre), logger=context.log
        )
    reasons: dict[str, int] = {}
    for v in verified:
        reasons[v.reason] = reasons.get(v.reason, 0) + 1
    meta = {
        **{f"reason {k}": n for k, n in sorted(reasons.items())},
        "verify": table([v.as_dict() for v in verified], VERIFY_COLUMNS),  # (the router logged each read's line)
    }
    fell_back = [v for v in verified if v.fallback_error]
    if fell_back:
        raise stop(context, flips.fallback_message(pre.name, pre.scope, fell_back), meta) from None
    context.add_output_metadata(meta)
    return [v.as_dict() for v in verified]


@dg.job(
    name="read_flip",
    description="Fase 1 runbook, steps 2–4: canary preflight (stops on MISMATCH), flip a reader to iceberg / "
    "iceberg_only for a dataset, a workspace or globally (behind the flip gates), verify through the read router.",
    tags={"lakehouse/area": "rollout"},
)
def read_flip_job():
    read_flip_verify(read_flip_set(read_flip_preflight()))


class IngestBenchConfig(dg.Config):
    jobs: int = Field(default=8, description="concurrent writer processes, released together")
    rows: int = Field(default=100_000, description="rows per job")
    same_dataset: bool = Field(default=False, description="every job writes the same dataset (G3)")
    namespace: str = Field(default="bench", description="Iceberg namespace of the throwaway bench tables")
    keep: bool = Field(default=False, description="keep the bench tables and datasets (default: purge them)")


@dg.op(description="A burst of concurrent iceberg-native writes; fails unless every non-503 outcome is ok.")
def ingest_bench_op(context: dg.OpExecutionContext, config: IngestBenchConfig, lakehouse: LakehouseResource) -> dict:

    settings = lakehouse.settings()
    actor = _actor(context, lakehouse)
    try:
        report = ingest_bench.run_ingest_bench(
            lakehouse.pg_dsn,
            settings,
            jobs=config.jobs,
            rows=config.rows,
            same_dataset=config.same_dataset,
            namespace=config.namespace,
            actor=actor,
        )
    except LakehouseError as exc:
        raise refuse(exc) from None
    finally:
        if not config.keep:
            ingest_bench.purge(lakehouse.pg_dsn, settings, namespace=config.namespace, actor=actor)
    jobs = logged_table(
        context,
        "bench job",
        [
            {**dataclasses.asdict(o), "seconds": round(o.seconds, 2), "error": (o.error or "")[:200]}
            for o in report.outcomes
        ],
        [("job", "int"), ("status", "string"), ("rows", "int"), ("seconds", "float"), ("error", "string")],
        warn=lambda r: r["status"] == ingest_bench.ERROR,
    )
    meta = {
        "ok": report.count(ingest_bench.OK),
        "503": report.count(ingest_bench.BACKPRESSURE),
        "error": report.count(ingest_bench.ERROR),
        "max_concurrent_ingest": report.max_concurrent_ingest,
        "seconds": round(report.seconds, 2),  # the ingests, from their common start
        "wall_seconds": round(report.wall_seconds, 2),  # the whole bench (setup, process starts, checks)
        "jobs": jobs,
    }
    context.log.info(report.summary_line())
    if not report.passed:
        raise stop(context, report.summary_line() + "".join(f"\n{p}" for p in report.table_problems), meta) from None
    context.add_output_metadata(meta)
    return report.as_dict()


@dg.job(
    name="ingest_bench",
    description="Fase 4 runbook step 2: validate the write guards at a target concurrency (distinct datasets: "
    "error=0, 503s only above LAKEHOUSE_MAX_CONCURRENT_INGEST; same dataset: error=0). Purges after.",
    tags={"lakehouse/area": "rollout"},
)
def ingest_bench_job():
    ingest_bench_op()


class WriteFlipConfig(FlipScopeConfig):
    writer: FlippableWriter = Field(description="the writer to flip to iceberg_native (one writer at a time)")


@dg.op(description="Canary (--smoke) over every dataset the flip would move: anything but ok stops the job.")
def write_flip_preflight(context: dg.OpExecutionContext, config: WriteFlipConfig, lakehouse: LakehouseResource) -> dict:
    return _preflight(context, lakehouse, config, WRITE, config.writer.value, "iceberg_native")


@dg.op(description="Set the writer to iceberg_native behind the flip gates (F3, identity, readers, parity).")
def write_flip_set(context: dg.OpExecutionContext, preflight: dict, lakehouse: LakehouseResource) -> dict:
    return _set(context, preflight, lakehouse)


@dg.op(description="Step-3 checks per moved dataset: the writer resolves native, the mirror skips it, its last sync.")
def write_flip_verify(context: dg.OpExecutionContext, flipped: dict, lakehouse: LakehouseResource) -> list[dict]:
    pre: flips.Preflight = flipped["preflight"]
    with lakehouse.connect() as conn:
        verified = flips.verify_write(conn, pre.name, flips.moved_ids(pre))
    bad = [v for v in verified if v.problems]
    meta = {
        "verified": len(verified),
        "problems": len(bad),
        "verify": logged_table(
            context,
            "verify",
            [v.as_dict() for v in verified],
            [
                ("dataset_id", "string"),
                ("writer_mode", "string"),
                ("mirror_skips", "bool"),
                ("latest_sync", "string"),
                ("row_count_matches", "bool"),
                ("problems", "string"),
            ],
            warn=lambda r: bool(r["problems"]),
        ),
    }
    if bad:
        where = "" if pre.scope.scope_id is None else f" --{pre.scope.scope} {pre.scope.scope_id}"
        raise stop(
            context,
            "\n".join(
                [f"ds={v.dataset_id}: {'; '.join(v.problems)}" for v in bad[:20]]
                + [f"roll back with: lakehouse write-flags set {pre.name} pg{where}"]
            ),
            meta,
        ) from None
    context.add_output_metadata(meta)
    return [v.as_dict() for v in verified]


@dg.op(
    description="Step 3: the writer's first native sync per moved dataset, then the canary on it (content "
    "columns for sync.full); a MISMATCH or a failed sync stops the job with the rollback command."
)
def write_flip_first_sync(
    context: dg.OpExecutionContext, flipped: dict, verified: list[dict], lakehouse: LakehouseResource
) -> list[dict]:

    pre: flips.Preflight = flipped["preflight"]
    ids = [uuid.UUID(v["dataset_id"]) for v in verified]
    with lakehouse.connect() as conn:
        try:
            synced = first_native_syncs(
                conn,
                lakehouse.pg_dsn,
                lakehouse.catalog(),
                lakehouse.settings(),
                pre.name,
                ids,
                run_id=context.run_id,
                logger=context.log,
            )
        except LakehouseError as exc:
            raise refuse(exc) from None
    first = logged_table(
        context,
        "first native sync",
        [f.as_dict() for f in synced],
        [
            ("dataset_id", "string"),
            ("verdict", "string"),
            ("path", "string"),
            ("rows", "int"),
            ("snapshot_id", "string"),
            ("detail", "string"),
        ],
        warn=lambda r: bool(r["problem"]),
    )
    meta = {
        **{f"verdict_{k}": sum(f.verdict == k for f in synced) for k in {f.verdict for f in synced if f.verdict}},
        "no_source": sum(f.verdict is None and not f.problem for f in synced),
        "first_native_sync": first,
    }
    stopped = stop_message(pre.name, synced)
    if stopped:
        raise stop(context, stopped, meta) from None
    context.add_output_metadata(meta)
    return [f.as_dict() for f in synced]


@dg.job(
    name="write_flip",
    description="Fase 4 runbook, steps 3–4: fresh canary (only ok passes), flip ONE writer to iceberg_native for a "
    "dataset, a workspace or globally (behind the flip gates: F3, identity, caught up, readers on Iceberg), verify, "
    "then the writer's first native sync and the canary on it (MISMATCH stops with the rollback command).",
    tags={"lakehouse/area": "rollout"},
)
def write_flip_job():
    flipped = write_flip_set(write_flip_preflight())
    write_flip_first_sync(flipped, write_flip_verify(flipped))
