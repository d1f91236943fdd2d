"""A stage's analysis: what the recorded evidence says about the datasets the plan moved.

Like an Argo Rollouts AnalysisRun, it ends in one of three outcomes:
  pass          every canaried dataset ok (a writer's: ok or native; a reader's: ok only), at least one of them
                with rows (an ok over no rows is no evidence: counted apart, never as ok), no incident above the
                thresholds;
  fail          a MISMATCH (any source, recorded since the plan started, on any dataset the plan moved or its
                stages so far cover, whoever rolled it back since), a wedged sync, more read fallbacks or failed
                syncs than allowed, a native-safety finding (writers), a shadow consistency rate below the
                threshold (a shadow read whose Iceberg side failed counts as a read that did not match) → the plan
                aborts;
  inconclusive  lagging / no-snapshot / error verdicts beyond ``max_inconclusive``, no ok verdict with rows, too
                few shadow reads, a canary run that failed; for a writer plan also a reverse copy's MISMATCH
                (repaired by the canary: the copy, not the native writes, was wrong, so nothing is rolled back) and
                a reverse mirror that was behind by more than ``max_reverse_lag_seconds`` when the analysis began
                → the stage waits, and pauses after ``pause_after`` (missing data is a decision, never a silent
                pass).
Each function only reads; the controller (plans/controller.py) acts on the outcome.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Sequence

import psycopg
from psycopg import sql

from lakehouse_dagster.flags.incidents import fallbacks_of
from lakehouse_dagster.flags.proof import outcome_counts_and_first_mismatch
from lakehouse_dagster.flags.registry import READ
from lakehouse_dagster.parity import verdicts as parity_verdicts  # this module has a verdicts() of its own
from lakehouse_dagster.plans.spec import Analysis
from lakehouse_dagster.plans.store import IN_PLAN_SCOPE, MOVED_CTE, PLAN_START
from lakehouse_dagster.routing.native_guard import native_blockers
from lakehouse_dagster.tracking import sync_log
from lakehouse_dagster.tracking.datasets import lookup

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
_SHOWN = 5


@dataclasses.dataclass(frozen=True)
class Outcome:
    outcome: str  # pass | fail | inconclusive
    reason: str
    detail: dict = dataclasses.field(default_factory=dict)


def _names(conn: psycopg.Connection, ids) -> dict[uuid.UUID, str]:
    ids = list(ids)
    if not ids:
        return {}
    return lookup.names_of(conn, ids)


def _listing(conn, items: list[tuple[uuid.UUID, str]]) -> str:
    names = _names(conn, [i for i, _ in items])
    shown = [f"{names.get(i, '?')} ({i}): {what}" for i, what in items[:_SHOWN]]
    return "; ".join(shown) + (f"; and {len(items) - _SHOWN} more" if len(items) > _SHOWN else "")


# What ``incidents`` reads, each joined with the plan's moved datasets (MOVED_CTE) inside Postgres.
# The MISMATCHes are the exception: evidence against the plan, whenever it was recorded since the plan started and
# on any dataset the plan moved or a stage started so far covers (its scope: a dataset, a workspace, global) — also
# one auto-rollback or an operator has since taken off Iceberg (it is no longer "moved" now, nor in the next stage's
# sample), and one repaired since. ``upcoming``: the scopes of the stage about to start, so it never widens past one.


def incidents(
    conn: psycopg.Connection,
    plan_id: uuid.UUID,
    kind: str,
    name: str,
    since: dt.datetime,
    analysis: Analysis,
    wedged_after_seconds: int,
    *,
    native_safety: bool = False,
) -> Outcome | None:
    """A fail outcome when something went wrong on the plan's datasets since ``since`` (the stage's flip), or a
    MISMATCH since the plan started (``mismatches``); None when nothing did. Read every tick of a soaking or
    analysing stage, so each query starts from what is recent (an index on the time) and joins the plan's moved
    datasets inside Postgres: the cost follows the incidents, not the datasets moved
    (bench/bench_rollout_controller.py). ``native_safety`` (a writer plan, once per analysis: it judges every moved
    dataset, ~1 s at 10,000): the gates that hold after the flip."""
    found = mismatches(conn, plan_id)
    if found is not None:
        return found
    args = {"plan": plan_id, "since": since, "reader": name, "after": wedged_after_seconds}
    wedged = sync_log.running_since_of(conn, MOVED_CTE, args)
    if wedged:
        items = [(d, f"a sync running for {secs}s") for d, secs in wedged]
        return Outcome(FAIL, f"a wedged sync on {len(items)} dataset(s) the plan moved: {_listing(conn, items)}")
    fallbacks = fallbacks_of(conn, MOVED_CTE, args, of_reader=kind == READ)
    total = sum(n for _, n, _ in fallbacks)
    if total > analysis.max_fallbacks:
        items = [(d, f"{n} fallback(s), e.g. {err[:120]}") for d, n, err in fallbacks]
        return Outcome(
            FAIL,
            f"{total} read fallback(s) since the stage flipped (max_fallbacks {analysis.max_fallbacks}): "
            + _listing(conn, items),
        )
    failed = sync_log.failed_since_of(conn, MOVED_CTE, args)
    total = sum(n for _, n, _ in failed)
    if total > analysis.max_failed_syncs:
        items = [(d, f"{n} failed sync(s), e.g. {err[:120]}") for d, n, err in failed]
        return Outcome(
            FAIL,
            f"{total} failed sync(s) since the stage flipped (max_failed_syncs {analysis.max_failed_syncs}): "
            + _listing(conn, items),
        )
    if native_safety and kind != READ:
        ids = [r[0] for r in conn.execute(MOVED_CTE + sql.SQL("select id from moved"), args).fetchall()]
        unsafe = native_blockers(conn, ids)
        if unsafe:
            items = [(b.dataset_id, "; ".join(b.reasons)) for b in unsafe]
            return Outcome(
                FAIL, f"native-safety: {len(items)} dataset(s) fail the write-flip gates: {_listing(conn, items)}"
            )
    return None


def mismatches(
    conn: psycopg.Connection, plan_id: uuid.UUID, upcoming: Sequence[tuple[str, uuid.UUID | None]] = ()
) -> Outcome | None:
    """A fail outcome naming each dataset with a MISMATCH recorded since the plan started, on a dataset the plan
    moved or a stage started so far covers (``upcoming``: (scope, id) of the stage about to start, id None for
    global), whoever rolled it back since; None when there is none. A plan never widens past such evidence, even once
    the dataset was rolled back or repaired: abort, settle it, start a new plan. One probe of the MISMATCH index from
    the plan's start: the cost follows the MISMATCHes, not the datasets the plan covers."""
    args = {
        "plan": plan_id,
        "upcoming_global": any(scope_id is None for _, scope_id in upcoming),
        "upcoming": [scope_id for _, scope_id in upcoming if scope_id is not None],
    }
    found = parity_verdicts.mismatches_since(conn, PLAN_START, IN_PLAN_SCOPE, args)
    if not found:
        return None
    items = [(d, f"MISMATCH ({src}, {at:%H:%M:%S} UTC)") for d, src, at in found]
    return Outcome(
        FAIL, f"MISMATCH on {len(items)} dataset(s) the plan moved or covers since it started: {_listing(conn, items)}"
    )


def verdicts(conn: psycopg.Connection, run_id: str, kind: str, analysis: Analysis, expected: int) -> Outcome:
    """The outcome of the verdicts one analysis run (a canary over the stage's datasets) recorded. ``native`` (the
    dataset is written iceberg-native: no Postgres side to compare) is ok for a writer plan only: a reader plan
    moves readers onto Iceberg, and a native verdict says nothing about whether Iceberg serves what Postgres
    holds."""
    found = parity_verdicts.run_verdicts(conn, run_id)
    rows = [(d, v, why) for d, v, why, _, _ in found]
    counts = {v: sum(r[1] == v for r in rows) for v in parity_verdicts.VERDICTS}
    detail = {"run_id": run_id, "verdicts": {k: n for k, n in counts.items() if n}, "datasets": len(rows)}
    if not rows:
        return Outcome(INCONCLUSIVE, f"the analysis run {run_id[:8]} recorded no verdict (of {expected})", detail)
    bad = [(d, v, why) for d, v, why, reverse, _ in found if v == parity_verdicts.MISMATCH and not reverse]
    if bad:
        items = [(d, f"MISMATCH {why}"[:160]) for d, _, why in bad]
        return Outcome(FAIL, f"the canary found MISMATCH on {len(bad)} dataset(s): {_listing(conn, items)}", detail)
    good = (parity_verdicts.OK,) if kind == READ else (parity_verdicts.OK, parity_verdicts.NATIVE)
    # not ok: lagging and the like, a reverse copy's MISMATCH (repaired: the stage holds, nothing is rolled back),
    # and an ok whose reverse mirror had fallen further behind than the plan allows
    unsure = [
        (d, "MISMATCH of the reverse copy", "repaired, no writer rolled back; the next analysis checks it again")
        if v == parity_verdicts.MISMATCH
        else (d, v, why)
        for d, v, why in rows
        if v not in good
    ]
    slow = [
        (
            d,
            "ok",
            f"but the reverse mirror was {lag:.0f} s behind (max_reverse_lag_seconds {analysis.max_reverse_lag_seconds})",
        )
        for d, v, _, reverse, lag in found
        if reverse and v == parity_verdicts.OK and lag is not None and lag > analysis.max_reverse_lag_seconds
    ]
    unsure += slow
    if len(unsure) > analysis.max_inconclusive:
        items = [(d, f"{v}{': ' + why[:120] if why else ''}") for d, v, why in unsure]
        return Outcome(
            INCONCLUSIVE,
            f"{len(unsure)} dataset(s) not ok (max_inconclusive {analysis.max_inconclusive}): {_listing(conn, items)}",
            detail,
        )
    if len(rows) < expected:
        return Outcome(
            INCONCLUSIVE, f"the analysis run {run_id[:8]} recorded {len(rows)} of {expected} verdicts", detail
        )
    return _evidence(conn, run_id, len(rows), good, sum(counts[v] for v in good), detail)


def _evidence(
    conn: psycopg.Connection, run_id: str, canaried: int, good_verdicts: tuple[str, ...], good: int, detail: dict
) -> Outcome:
    """Pass only on evidence: an ok (or native) verdict over no rows compares nothing, so it is counted apart, and a
    stage whose every good verdict had no rows is inconclusive, never a silent pass (Kayenta's mustHaveData)."""
    empty = parity_verdicts.run_datasets_without_rows(conn, run_id, list(good_verdicts))
    detail = {**detail, "no_rows": len(empty)}
    with_rows = good - len(empty)
    if with_rows <= 0:
        items = [(d, "no rows") for d in empty]
        return Outcome(
            INCONCLUSIVE,
            f"no evidence: none of the {canaried} canaried dataset(s) is ok with rows to compare"
            + (f" ({len(empty)} had no rows: {_listing(conn, items)})" if empty else ""),
            detail,
        )
    text = f"{with_rows} of {canaried} canaried dataset(s) ok"
    return Outcome(PASS, text + (f"; {len(empty)} had no rows (no evidence)" if empty else ""), detail)


@dataclasses.dataclass(frozen=True)
class Consistency:
    """Shadow reads of one reader since a moment: the comparisons at caught-up versions, how many matched, and the
    reads whose Iceberg side failed (``errors``). An error counts against the rate like a mismatch: an Iceberg side
    that fails most sampled reads must not pass on the few it answered."""

    compared: int  # match + mismatch
    matched: int
    skipped: dict[str, int]  # lagging, no-snapshot, not-comparable, dropped: not counted either way
    first_mismatch: dict | None
    errors: int = 0  # the Iceberg side failed: counted, as not consistent

    @property
    def counted(self) -> int:
        """The reads the rate is over: the comparisons and the Iceberg-side errors."""
        return self.compared + self.errors

    @property
    def rate(self) -> float | None:
        return None if not self.counted else 100.0 * self.matched / self.counted

    def describe(self) -> str:
        if not self.counted:
            return "no shadow read compared yet"
        errors = f" and {self.errors} whose Iceberg side failed" if self.errors else ""
        return f"{self.rate:.1f}% consistent over {self.compared} compared read(s){errors}"


def consistency(
    conn: psycopg.Connection, reader: str, since: dt.datetime, dataset_ids: list[uuid.UUID] | None = None
) -> Consistency:
    counts, first = outcome_counts_and_first_mismatch(conn, reader, since, dataset_ids)
    mismatch = None
    if first:
        keys = ("dataset_id", "at", "pg_version", "snapshot_id", "iceberg_version", "pg_row", "iceberg_row", "detail")
        mismatch = dict(zip(keys, first))
    matched, mismatched, errors = counts.pop("match", 0), counts.pop("mismatch", 0), counts.pop("error", 0)
    return Consistency(matched + mismatched, matched, counts, mismatch, errors)


def shadow(
    conn: psycopg.Connection, reader: str, since: dt.datetime, analysis: Analysis
) -> tuple[Outcome | None, Consistency]:
    """A shadow stage: pass at the rate over at least ``min_reads`` counted reads (comparisons and Iceberg-side
    errors), fail when the rate can no longer reach ``min_consistency``, None while too few reads were counted."""
    c = consistency(conn, reader, since)
    detail = {"compared": c.compared, "matched": c.matched, "errors": c.errors, "skipped": c.skipped, "rate": c.rate}
    mismatched = c.compared - c.matched
    failed = mismatched + c.errors
    if failed:
        m = c.first_mismatch or {}
        first = (
            f"; first: dataset {m.get('dataset_id')} Postgres {m.get('pg_row')} vs Iceberg {m.get('iceberg_row')}"
            if m
            else ""
        )
        best = 100.0 * (max(c.counted, analysis.min_reads) - failed) / max(c.counted, analysis.min_reads)
        if best < analysis.min_consistency:
            why = f"{mismatched} mismatch(es)" + (f", {c.errors} Iceberg-side error(s)" if c.errors else "")
            return Outcome(
                FAIL,
                f"shadow reads {c.describe()}, below {analysis.min_consistency:g}% ({why}){first}",
                {**detail, "first_mismatch": m or None},
            ), c
    if c.counted < analysis.min_reads:
        return None, c
    if (c.rate or 0.0) >= analysis.min_consistency:
        return Outcome(PASS, f"shadow reads {c.describe()}", detail), c
    return Outcome(FAIL, f"shadow reads {c.describe()}, below {analysis.min_consistency:g}%", detail), c
