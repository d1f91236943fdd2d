"""The flip runbooks as three steps the CLI and the Dagster jobs both run: reader flip (Fase 1, steps
2–4) and writer flip (Fase 4, steps 3–4).

  preflight  the canary (with --smoke) over every dataset the flip would move; a caught-up dataset
             that disagrees (MISMATCH), or one the canary could not check (error), stops the flip
             before anything is written. lagging / no-snapshot datasets do not stop it: the
             freshness gate keeps serving them from Postgres (the flip is inert for them), and the
             result names them. A recent ok verdict at the dataset's current Postgres version is
             reused, so widening (dataset → workspace → global) re-checks only what changed: a
             widen canaries a random sample of ``sample`` moved datasets afresh (a recorded ok can
             go stale on the Iceberg side, e.g. files lost, without Postgres moving) plus every moved
             dataset with no recent ok verdict, and says how many it covered and how.
  flip       the gated set_flag (flags/gates.py), audited with the operator's note.
  verify     one read per moved dataset (a sample) through the read router: its reason
             (iceberg@eventual, iceberg@strict, pg@no-snapshot, ...) and whether an Iceberg read
             failed and fell back to Postgres — which fails the step with the rollback command.

For a writer the preflight is stricter — only ``ok`` at the dataset's current Postgres version lets a
dataset go iceberg-native (the flip gates say the same, so the preflight makes the verdict fresh) —
and verify checks what the runbook's step 3 checks: the writer resolves iceberg_native, the mirror
now skips the dataset, its latest sync succeeded with the rows datasets.row_count says. Then
runbooks/first_sync.py triggers the writer's first native sync and the canary on it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import random
import uuid

import psycopg
from pyiceberg.catalog import Catalog

from lakehouse_dagster.core.errors import BadInput, NotFound, NothingToDo
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.flags.flip_scope import ScopeReport, scope_report
from lakehouse_dagster.flags.gates import check_postgres_consumers, check_proof, check_widen, set_flag
from lakehouse_dagster.flags.native import native_dataset_ids
from lakehouse_dagster.flags.overrides import DATASET, Change, Scope, parse_scope, require_target
from lakehouse_dagster.flags.registry import READ, WRITE, check_mode, get_flag, rank
from lakehouse_dagster.flags.resolver import FlagResolver
from lakehouse_dagster.parity import canary
from lakehouse_dagster.routing.exercise import read_through_router
from lakehouse_dagster.runbooks import auto_rollback
from lakehouse_dagster.runbooks.auto_rollback import lines_of
from lakehouse_dagster.tracking import barrier, sync_log
from lakehouse_dagster.tracking.datasets import lookup

log = logging.getLogger("lakehouse_dagster.runbooks")

STOP_VERDICTS = (canary.MISMATCH, canary.ERROR)
WRITE_GO_VERDICTS = (canary.OK, canary.NATIVE)
INERT_VERDICTS = (canary.LAGGING, canary.NO_SNAPSHOT)
SOURCE = "rollout"


@dataclasses.dataclass
class Checked:
    dataset_id: uuid.UUID
    name: str
    verdict: str
    reused: bool  # a recorded verdict, not evaluated now
    detail: str

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "dataset_id": str(self.dataset_id)}


@dataclasses.dataclass
class Preflight:
    name: str  # the reader or writer flipped
    mode: str
    scope: Scope
    checked: list[Checked]
    skipped: list[str]  # a read flip's manifest datasets: not moved (Postgres keeps serving them), not checked
    kind: str = READ
    sampled: int = 0  # a widen's random sample canaried afresh (counted in checked)
    # what the flip does to every dataset in its scope (flags/flip_scope.py)
    report: ScopeReport = dataclasses.field(kw_only=True)

    def coverage(self) -> str:
        """How the datasets the flip moves were covered: canaried now, or by a recent recorded ok."""
        fresh = sum(not c.reused for c in self.checked)
        moved = len(self.checked)  # a manifest dataset is not moved: the scope report names it "not applicable"
        text = f"preflight covered {moved} of {moved} moved dataset(s): {fresh} canaried now"
        if self.sampled:
            text += f" (a random sample of {self.sampled} plus every one with no recent ok verdict)"
        return text + f", {moved - fresh} by a recent ok verdict at their current version"

    @property
    def stopped(self) -> list[Checked]:
        if self.kind == WRITE:
            return [c for c in self.checked if c.verdict not in WRITE_GO_VERDICTS]
        return [c for c in self.checked if c.verdict in STOP_VERDICTS]

    @property
    def inert(self) -> list[Checked]:
        return [c for c in self.checked if c.verdict in INERT_VERDICTS]

    @property
    def go(self) -> bool:
        return not self.stopped

    def counts(self) -> dict[str, int]:
        return {v: sum(c.verdict == v for c in self.checked) for v in canary.VERDICTS}

    def stop_message(self) -> str:
        lines = [
            f"STOP: do not flip {self.name} to {self.mode} ({self.scope}); nothing written. "
            f"{len(self.stopped)} dataset(s) {'are not ok in' if self.kind == WRITE else 'failed'} the canary:"
        ]
        lines += [f"  {c.name} ({c.dataset_id}): {c.verdict} — {c.detail}" for c in self.stopped[:20]]
        if len(self.stopped) > 20:
            lines.append(f"  ... and {len(self.stopped) - 20} more")
        lines.append("  investigate (lakehouse canary --dataset <id> --json), fix, and run the flip again")
        return "\n".join(lines)


def _check_request(conn: psycopg.Connection, kind: str, name: str, mode: str, dataset, workspace):
    flag = get_flag(kind, name)
    check_mode(flag, mode)
    if kind == WRITE and mode != "iceberg_native":
        raise BadInput(
            f"a write flip moves {name} to iceberg_native, not {mode}; to roll back use "
            f"`lakehouse write-flags set {name} {mode}` or the set_flag job"
        )
    if kind == READ and rank(READ, mode) < rank(READ, "iceberg"):
        raise BadInput(
            f"a read flip raises {name} to iceberg or iceberg_only, not {mode}; to roll back use "
            f"`lakehouse flags set {name} {mode}` or the set_flag job"
        )
    scope = parse_scope(dataset, workspace)
    require_target(conn, scope)
    return flag, scope


def preflight(
    conn: psycopg.Connection,
    dsn: str,
    catalog: Catalog,
    settings: Settings,
    name: str,
    mode: str,
    *,
    dataset=None,
    workspace=None,
    smoke: bool = True,
    reuse_minutes: int = 60,
    max_datasets: int = 500,
    run_id: str | None = None,
    kind: str = READ,
    sample: int = 20,
) -> Preflight:
    """``sample``: for a workspace/global widen, how many moved datasets (at random) are canaried afresh
    even with a recent ok verdict; ``max_datasets``: refuse when more than this would be canaried."""
    if sample < 0:
        raise BadInput(f"--sample {sample} must be 0 or more")
    flag, scope = _check_request(conn, kind, name, mode, dataset, workspace)
    report = scope_report(conn, flag, scope, mode)
    verb = "flags" if kind == READ else "write-flags"
    if kind == WRITE and scope.scope == DATASET and report.not_applicable:
        d = report.not_applicable[0]
        raise BadInput(f"nothing to flip: {d.label()} is {report._not_applicable(d)}; nothing written")
    if not report.moved and not (report.raises_scope and report.total):
        raise NothingToDo(report.nothing_to_flip(verb))
    check_widen(conn, flag, scope, mode)  # order and the stored soak: no canary for a flip refused anyway
    check_proof(conn, flag, scope, mode)  # a compute reader: proven by its shadow reads, or no canary either
    if kind == WRITE:  # a pipeline input or a locked reader's dataset with its reverse off: refused, no canary
        check_postgres_consumers(conn, flag, scope, mode)
    tabular = report.moved
    skipped = (
        []
        if kind == WRITE  # outside a write flip: named by the report as not applicable
        else [f"{d.label()}: {d.kind} dataset, not Iceberg-tabular" for d in report.not_applicable]
    )
    reusable = _reusable_verdicts(conn, [e.dataset_id for e in tabular], reuse_minutes)
    unverified = sum(e.dataset_id not in reusable for e in tabular)
    spot = (
        set() if scope.scope == DATASET else {e.dataset_id for e in random.sample(tabular, min(sample, len(tabular)))}
    )
    for i in spot:
        reusable.pop(i, None)
    to_canary = sum(e.dataset_id not in reusable for e in tabular)
    if to_canary > max_datasets:
        raise BadInput(
            f"flipping {name} ({report.where}) moves {len(tabular)} datasets and the preflight would canary "
            f"{to_canary} of them ({unverified} with no recent ok verdict); canary them first "
            f"(lakehouse canary --smoke --dataset ...), narrow the scope, or raise max_datasets above "
            f"{max_datasets}"
        )
    checked = []
    for e in tabular:
        if e.dataset_id in reusable:
            checked.append(Checked(e.dataset_id, e.name, canary.OK, True, reusable[e.dataset_id]))
            continue
        v = canary.evaluate(dsn, catalog, settings, e.dataset_id, smoke=smoke)
        auto_rollback.record_and_roll_back(conn, v, source=SOURCE, run_id=run_id, settings=settings)
        detail = str(v.detail.get("reason") or (f"rows {v.pg_count}, digests equal" if v.verdict == canary.OK else ""))
        if v.mismatched_row_indexes:
            detail += f"; differing row indexes {v.mismatched_row_indexes[:10]}"
        detail += "".join(f"; {line}" for line in lines_of(v))
        checked.append(Checked(e.dataset_id, e.name, v.verdict, False, detail))
        log.info("%s-flip preflight %s ds=%s verdict=%s %s", kind, name, e.dataset_id, v.verdict, detail)
    return Preflight(name, mode, scope, checked, skipped, kind, len(spot), report=report)


def _reusable_verdicts(conn: psycopg.Connection, ids: list[uuid.UUID], minutes: int) -> dict[uuid.UUID, str]:
    """ok verdicts recorded within ``minutes`` at the dataset's current Postgres version."""
    if minutes <= 0 or not ids:
        return {}
    latest = canary.latest_verdicts(conn, ids)
    with barrier.read_tracking_consistently(conn, ids):  # after-commit: the version covers every committed write
        current: dict = lookup.rows_versions(conn, ids)
    since = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=minutes)
    return {
        i: f"ok at {v['checked_at']:%Y-%m-%d %H:%M:%S} UTC ({v['source']}), Postgres version {v['pg_version']} unchanged"
        for i, v in latest.items()
        if v["verdict"] == canary.OK and v["checked_at"] >= since and v["pg_version"] == current.get(i)
    }


def flip(
    conn: psycopg.Connection, pre: Preflight, *, note: str | None, actor: str, soak_seconds: int | None = None
) -> Change:
    """The gated set; ``soak_seconds`` None: the stored soak (flags/soak_setting.py), as every caller but tests."""
    if not pre.go:
        raise BadInput(pre.stop_message())
    return set_flag(
        conn,
        pre.kind,
        pre.name,
        pre.mode,
        dataset=pre.scope.scope_id if pre.scope.scope == "dataset" else None,
        workspace=pre.scope.scope_id if pre.scope.scope == "workspace" else None,
        note=note,
        actor=actor,
        soak_seconds=soak_seconds,
    )


@dataclasses.dataclass
class Verified:
    dataset_id: uuid.UUID
    source: str
    reason: str
    snapshot_id: int | None
    fallback_error: str | None

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "dataset_id": str(self.dataset_id)}


def verify(
    conn: psycopg.Connection,
    catalog: Catalog,
    settings: Settings,
    reader: str,
    dataset_ids: list[uuid.UUID],
    *,
    sample: int = 20,
    logger: logging.Logger | logging.LoggerAdapter | None = None,
) -> list[Verified]:
    """One read per dataset (up to ``sample``) through the router, with flags resolved afresh (no cache)."""

    resolver = FlagResolver(conn, ttl_seconds=0)
    out = []
    for ds_id in dataset_ids[:sample]:
        result, _, _ = read_through_router(
            conn, catalog, settings, reader, ds_id, limit=1, resolver=resolver, logger=logger
        )
        d = result.decision
        out.append(Verified(ds_id, d.source, d.reason, d.snapshot_id, result.fallback_error))
    return out


def moved_ids(pre: Preflight) -> list[uuid.UUID]:
    return [c.dataset_id for c in pre.checked]


def fallback_message(reader: str, scope: Scope, fell_back: list[Verified]) -> str:
    where = "" if scope.scope_id is None else f" --{scope.scope} {scope.scope_id}"
    lines = [f"{reader} is flipped ({scope}) but {len(fell_back)} Iceberg read(s) failed and fell back to Postgres:"]
    lines += [f"  ds={v.dataset_id}: {v.fallback_error}" for v in fell_back[:20]]
    lines.append(f"  readers are still served (by Postgres); roll back with: lakehouse flags set {reader} off{where}")
    return "\n".join(lines)


@dataclasses.dataclass
class WriteVerified:
    dataset_id: uuid.UUID
    writer_mode: str
    mirror_skips: bool
    latest_sync: str | None  # "<status> <path> rows=<n> snapshot=<id>"
    row_count_matches: bool | None
    problems: list[str]

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "dataset_id": str(self.dataset_id)}


def verify_write(
    conn: psycopg.Connection, writer: str, dataset_ids: list[uuid.UUID], *, sample: int = 20
) -> list[WriteVerified]:
    """The runbook's step-3 checks after a write flip, per dataset (up to ``sample``)."""

    resolver = FlagResolver(conn, ttl_seconds=0)
    ids = dataset_ids[:sample]
    native = native_dataset_ids(conn, ids)
    out = []
    for ds_id in ids:
        mode = resolver.resolve(WRITE, writer, ds_id).mode
        row = sync_log.latest_sync_and_row_count(conn, ds_id)
        if row is None:
            raise NotFound(
                f"dataset {ds_id} does not exist (deleted since the flip?): verify the flip again without it"
            )
        problems = []
        if mode != "iceberg_native":
            problems.append(f"{writer} resolves to {mode} for it (a narrower override?)")
        if ds_id not in native:
            problems.append("the mirror poller would still sync it")
        status, path, rows, snapshot_id, row_count = row
        latest = None if status is None else f"{status} {path} rows={rows} snapshot={snapshot_id}"
        matches = None if rows is None or row_count is None else rows == row_count
        if status != "succeeded":
            problems.append(f"its latest sync is {status or 'missing'}")
        elif matches is False:
            problems.append(f"its latest sync wrote {rows} rows but datasets.row_count is {row_count}")
        out.append(WriteVerified(ds_id, mode, ds_id in native, latest, matches, problems))
    return out
