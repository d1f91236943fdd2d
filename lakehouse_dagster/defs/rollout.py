"""The read-flip runbook as a job: preflight canary → gated flip → verify, like `lakehouse flags flip`.

Op-based jobs are not gated by asset checks: the preflight op reads the canary itself and fails on
MISMATCH / error, so the flip op never runs. A failed verify leaves the flip in place (readers are
still served, by the Postgres fallback) and says how to roll back.
(No ``from __future__ import annotations`` here: Dagster reads the Config annotations at runtime.)
"""

from enum import Enum
from typing import Optional

import dagster as dg
from pydantic import Field

from ..errors import LakehouseError
from ..flags.registry import READ, READERS, rank
from ..rollout import read_flip as rf
from .flags import _actor, _refuse
from .resources import LakehouseResource

FlippableReader = Enum("FlippableReader", {
    r.name.replace(".", "_"): r.name for r in READERS.values() if rank(READ, r.ceiling) >= rank(READ, "iceberg")})


class ReadMode(Enum):
    iceberg = "iceberg"
    iceberg_only = "iceberg_only"


class ReadFlipConfig(dg.Config):
    reader: FlippableReader = Field(description="the reader to flip (only readers Iceberg can serve)")
    mode: ReadMode = Field(default=ReadMode.iceberg, description="iceberg keeps the PG fallback; iceberg_only drops it")
    dataset_id: Optional[str] = Field(default=None, description="flip for one dataset (runbook step 3)")
    workspace_id: Optional[str] = Field(default=None, description="or a workspace (step 4); neither: global")
    note: Optional[str] = Field(default=None, description="why, kept with the override and in the audit")
    smoke: bool = Field(default=True, description="the value-level check in the preflight canary (small datasets)")
    reuse_verdicts_minutes: int = Field(default=60, description="reuse ok verdicts this recent at an unchanged version")
    max_datasets: int = Field(default=500, description="refuse a flip that would move more datasets than this")


@dg.op(description="Canary (--smoke) over every dataset the flip would move; MISMATCH or error stops the job.")
def read_flip_preflight(context: dg.OpExecutionContext, config: ReadFlipConfig, lakehouse: LakehouseResource) -> dict:
    settings = lakehouse.settings()
    with lakehouse.connect() as conn:
        try:
            pre = rf.preflight(conn, lakehouse.pg_dsn, lakehouse.catalog(), settings, config.reader.value,
                               config.mode.value, dataset=config.dataset_id, workspace=config.workspace_id,
                               smoke=config.smoke, reuse_minutes=config.reuse_verdicts_minutes,
                               max_datasets=config.max_datasets, run_id=context.run_id)
        except LakehouseError as exc:
            raise _refuse(exc) from exc
    rows = "\n".join(f"| {c.verdict} | {'yes' if c.reused else 'no'} | {c.name} | `{c.dataset_id}` | "
                     f"{c.detail.replace('|', '/')} |" for c in pre.checked)
    meta = {**{f"verdict_{k}": v for k, v in pre.counts().items() if v},
            "datasets_moved": len(pre.checked) + len(pre.skipped),
            "preflight": dg.MetadataValue.md("| verdict | reused | dataset | id | detail |\n|---|---|---|---|---|\n" + rows)}
    for c in pre.inert:
        context.log.warning(f"{c.name} ({c.dataset_id}): {c.verdict} — the flip is inert for it (Postgres serves) "
                            "until the mirror catches up")
    if not pre.go:
        raise dg.Failure(description=pre.stop_message(), metadata=meta)
    context.add_output_metadata(meta)
    return {"reader": pre.reader, "mode": pre.mode, "scope": pre.scope.scope,
            "scope_id": str(pre.scope.scope_id) if pre.scope.scope_id else None, "note": config.note,
            "datasets": [str(i) for i in rf.moved_ids(pre)], "preflight": pre}


@dg.op(description="Set the reader's override behind the flip gates, audited with the run as actor.")
def read_flip_set(context: dg.OpExecutionContext, preflight: dict, lakehouse: LakehouseResource) -> dict:
    pre: rf.Preflight = preflight["preflight"]
    with lakehouse.connect() as conn:
        try:
            change = rf.flip(conn, pre, note=preflight["note"], actor=_actor(context, lakehouse))
        except LakehouseError as exc:
            raise _refuse(exc) from exc
    context.log.info(f"{change.flag.name}: {change.before or '(no override)'} → {change.after} ({change.scope})")
    context.add_output_metadata({"flag": change.flag.name, "scope": str(change.scope),
                                 "before": change.before or "(no override)", "after": change.after,
                                 "audit_id": change.audit.id})
    return preflight


@dg.op(description="One read per moved dataset (a sample of 20) through the read router: reason and fallbacks.")
def read_flip_verify(context: dg.OpExecutionContext, flipped: dict, lakehouse: LakehouseResource) -> list[dict]:
    pre: rf.Preflight = flipped["preflight"]
    with lakehouse.connect() as conn:
        verified = rf.verify(conn, lakehouse.catalog(), lakehouse.settings(), pre.reader, rf.moved_ids(pre),
                             logger=context.log)
    reasons: dict[str, int] = {}
    for v in verified:
        reasons[v.reason] = reasons.get(v.reason, 0) + 1
    meta = {f"reason {k}": n for k, n in sorted(reasons.items())}
    fell_back = [v for v in verified if v.fallback_error]
    if fell_back:
        raise dg.Failure(description=rf.fallback_message(pre.reader, pre.scope, fell_back), metadata=meta)
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
